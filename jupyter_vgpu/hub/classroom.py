"""The classroom file: one YAML file that says what a JupyterHub's users may have of the node's GPUs.

It names the node's GPUs, the hub's groups and their members, the GPU sizes users pick from when
their server starts (each a budget that all of a user's kernels share), per-user limits and the
idle policy. :func:`load_classroom` reads and checks it; everything else (the hub configuration,
KubeSpawner profiles, the broker) reads the :class:`Classroom` it returns. Sizes and SM shares are
parsed by :mod:`jupyter_vgpu.model`, so they accept and refuse what every other entry point does.

A bad file is refused as a whole with a :class:`ClassroomError` that names the file, and for each
problem the key and what is accepted; nothing quietly guesses. Every entry is read, so one
refusal lists every problem of the file's entries at once; the checks across entries (user
limits against the sizes offered, the default budgets against the node) follow once the entries
are right.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from jupyter_vgpu.ledger.embedded import PLACEMENTS
from jupyter_vgpu.model import SliceValueError, format_size, parse_policy, parse_size, parse_sm_share
from jupyter_vgpu.model.sizes import SIZE_HELP, exact_size

MIB = 1 << 20
DEFAULT_SERVICE_NAME = "vgpu"
DEFAULT_BROKER_PORT = 10101
DEFAULT_STATE_DIR = "vgpu-broker"
DEFAULT_SMS = 100
DEFAULT_FLOOR_CORES = 5
SIMULATED_GPU_NAME = "jupyter-vgpu simulated GPU"

_SLUG = re.compile(r"^[a-z0-9-]+$")
_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION_HELP = "a duration like 90s, 20m, 2h or a bare number of seconds"

_TOP_KEYS = (
    "gpus",
    "simulate",
    "broker",
    "groups",
    "admins",
    "admin_groups",
    "sizes",
    "limits",
    "oversubscribe",
    "idle",
)
_GPU_KEYS = ("count", "memory", "sms", "reserve", "burst_oversubscription", "placement")
_BROKER_KEYS = ("port", "name", "state_dir")
_SIZE_KEYS = (
    "name",
    "display_name",
    "description",
    "memory",
    "cores",
    "policy",
    "groups",
    "default",
    "kernel",
    "borrow",
)
_KERNEL_KEYS = ("memory", "cores")
_BORROW_KEYS = ("memory", "cores")
_LIMIT_KEYS = ("kernels", "memory", "groups")
_GROUP_LIMIT_KEYS = ("kernels", "memory")
_IDLE_KEYS = ("lower_after", "floor_cores", "suspend_after", "suspend_host_memory", "cull_after", "room_hold")

# Where each table of keys above stands in the file, and what each key means. The docs' reference
# of the classroom file (docs/reference/classroom-file.md) is made from these two at build time,
# and the build fails where a key has no help here or help names a key the reader does not accept.
KEY_SECTIONS: dict[str, tuple[str, ...]] = {
    "": _TOP_KEYS,
    "gpus": _GPU_KEYS,
    "broker": _BROKER_KEYS,
    "sizes[]": _SIZE_KEYS,
    "sizes[].kernel": _KERNEL_KEYS,
    "sizes[].borrow": _BORROW_KEYS,
    "limits": _LIMIT_KEYS,
    "limits.groups.GROUP": _GROUP_LIMIT_KEYS,
    "idle": _IDLE_KEYS,
}
KEY_HELP: dict[str, str] = {
    "gpus": "Required. What the node has and how the broker shares each GPU out (the keys below).",
    "simulate": "true: the broker and the users' servers use the simulated GPU (demos, CI, a machine without a "
    "GPU). Default false.",
    "broker": "The broker, the hub-managed service that owns the node's ledger (the keys below; all optional).",
    "groups": "JupyterHub groups and their members, like `students: [alice, bob]`; the hub creates them (merged "
    "with its own `load_groups`). Sizes, limits and `admin_groups` may name these and the hub's own groups.",
    "admins": "Users given the vgpu-admin role: they see and resize every user's slices.",
    "admin_groups": "Groups whose members get the vgpu-admin role.",
    "sizes": "Required. The list of sizes a user picks from when their server starts (the keys of each under "
    "`sizes[]`). A size is a budget all of the user's kernels share.",
    "limits": "Per-user limits checked at each admission (the keys below). Absent: no limit.",
    "oversubscribe": "false (the default): every listed member's default size must fit on the node at once (memory "
    "against each GPU's memory less reserve, hard shares against 100% a GPU, all shares against "
    "`burst_oversubscription` x 100%), else the file is refused. true: skip that check.",
    "idle": "What each user's server does with its idle kernels (the keys below). Absent: nothing.",
    "gpus.count": "Required. How many GPUs the node has (1 to 64); the broker checks them when it starts.",
    "gpus.memory": f"Required. Each GPU's memory: {SIZE_HELP}.",
    "gpus.sms": f"Each GPU's SM count, for the simulated GPU. Default {DEFAULT_SMS}.",
    "gpus.reserve": "Memory kept free on each GPU (the driver, other tools), never given to slices. Default 0.",
    "gpus.burst_oversubscription": "Burst shares may add up to this many times 100% of each GPU (hard ones to "
    "100% at most): a number of 1.0 or more. Default 1.0.",
    "gpus.placement": "Where a new slice goes: binpack (the fullest GPU it fits on, the default) or spread (the "
    "emptiest).",
    "broker.port": f"The port the broker listens on (on the hub's host). Default {DEFAULT_BROKER_PORT}.",
    "broker.name": "The broker's service name in the hub: lowercase letters, digits, - and _. Default "
    f"{DEFAULT_SERVICE_NAME!r}.",
    "broker.state_dir": "The broker's folder (its ledger and the kernels' limits pages), relative to this file's "
    f"folder unless absolute. Default {DEFAULT_STATE_DIR!r}.",
    "sizes[].name": "Required. The size's name: lowercase letters, digits and -, unique in the file.",
    "sizes[].display_name": "What the spawn form shows. Default: made from the name, memory and share, like "
    "'Small: 2GiB, 20% of a GPU'.",
    "sizes[].description": "A sentence under the name on the spawn form. Default: what the size gives.",
    "sizes[].memory": f"Required. The memory all of the user's kernels share, guaranteed: {SIZE_HELP}; at most "
    "one GPU's memory less its reserve.",
    "sizes[].cores": "Required. The SM share all of the user's kernels share, guaranteed, in percent of one GPU (1 to "
    "100).",
    "sizes[].policy": "hard (never above the share, the default) or burst (may use SMs others leave idle).",
    "sizes[].groups": "The groups whose members may pick the size. Absent: every user.",
    "sizes[].default": "true: the size the spawn form preselects (at most one size). Default false.",
    "sizes[].kernel": "Each kernel's slice unless the notebook asks for another (the keys below). Absent: the "
    "budget divided by the user's kernel limit (none: the whole budget).",
    "sizes[].kernel.memory": "A kernel's default memory cap, at most the size's memory.",
    "sizes[].kernel.cores": "A kernel's default SM share in percent, at most the size's cores.",
    "sizes[].borrow": "How far above its guarantee (`memory`, `cores`) the size may borrow room nobody uses (the "
    "keys below; either may be left out: 0). Borrowed room is taken back when a user within their guarantee "
    "needs it: the borrower's most recent borrowing kernel is paused (suspended, even mid-cell) until room frees. "
    "Absent: no borrowing.",
    "sizes[].borrow.memory": f"Memory the user may hold above the size's `memory`: {SIZE_HELP}; the two together at "
    "most one GPU's memory less its reserve.",
    "sizes[].borrow.cores": "SM share in percent the user may hold above the size's `cores`; the two together at most "
    "100.",
    "limits.kernels": "Sliced kernels one user may run at once (1 or more).",
    "limits.memory": "The memory one user may hold in all, whatever the size; never below a size they may pick.",
    "limits.groups": "Limits per group, like `staff: {kernels: 6}` (the keys under `limits.groups.GROUP`); a user "
    "in several groups gets the most generous of each.",
    "limits.groups.GROUP.kernels": "Sliced kernels a member of the group may run at once.",
    "limits.groups.GROUP.memory": "The memory a member of the group may hold in all.",
    "idle.lower_after": "An idle kernel's SM share is lowered to `floor_cores` after this long: like every "
    f"duration here, {DURATION_HELP}. It gets its share back when it runs again.",
    "idle.floor_cores": f"The SM share (percent) an idle kernel is lowered to. Default {DEFAULT_FLOOR_CORES}.",
    "idle.suspend_after": "An idle kernel is suspended after this long: its GPU memory moves to host memory and "
    "is lent to others until its next cell. Less than `cull_after`.",
    "idle.suspend_host_memory": "The host memory the node's suspended kernels may hold together. Default: half "
    "the node's RAM. Needs `suspend_after`.",
    "idle.cull_after": "An idle kernel is stopped after this long, freeing its GPU memory.",
    "idle.room_hold": "How long after a kernel got its GPU room (started, or resumed) making room for another "
    "request leaves it alone (0: no hold). Default 30s. Borrowed room is taken back regardless.",
}


_T = TypeVar("_T")
_GroupCheck = Callable[[str, str], None]


class ClassroomError(ValueError):
    """A classroom file that is not accepted, or a size a user may not have; the message says why
    and what is accepted. ``problems``: each problem of a refused file, ``key: what is wrong``
    (the message names the file, then lists them; one problem reads ``FILE: key: ...``)."""

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Gpus:
    """What the node has: ``count`` GPUs of ``memory`` bytes and ``sms`` streaming multiprocessors;
    and how the broker's ledger shares them out: ``reserve`` bytes kept free on each GPU, burst
    shares adding up to ``burst_oversubscription`` times 100 % per GPU (hard ones to 100 % at
    most), a new slice placed by ``placement`` (``binpack``: the fullest GPU it fits on,
    ``spread``: the emptiest). See :class:`jupyter_vgpu.ledger.EmbeddedLedger`."""

    count: int
    memory: int
    sms: int = DEFAULT_SMS
    reserve: int = 0
    burst_oversubscription: float = 1.0
    placement: str = "binpack"

    @property
    def usable_memory(self) -> int:
        """One GPU's memory that slices may have: ``memory`` less ``reserve``."""
        return self.memory - self.reserve

    @property
    def share_capacity(self) -> int:
        """One GPU's SM shares, hard and burst together, in percent (as the ledger counts them)."""
        return int(100 * self.burst_oversubscription)


@dataclass(frozen=True)
class Size:
    """A GPU size a user picks when their server starts: a budget all their kernels share.

    ``memory`` (bytes) and ``cores`` (percent of one GPU's SMs) are the user's budget;
    ``kernel_memory`` and ``kernel_cores`` are a kernel's default slice within it: the file's
    ``kernel:``, else resolved for the size's strictest picker (see :func:`_kernel_default`); a
    user's own default slice is :attr:`Budget.kernel_memory` / :attr:`Budget.kernel_cores`.
    ``groups`` are the groups whose members may pick it (empty: everyone).
    """

    name: str
    display_name: str
    description: str
    memory: int
    cores: int
    policy: str
    groups: tuple[str, ...]
    default: bool
    kernel_memory: int
    kernel_cores: int
    kernel_memory_given: bool = False
    kernel_cores_given: bool = False
    # How far above the guarantee (memory, cores) the user may borrow room nobody uses.
    borrow_memory: int = 0
    borrow_cores: int = 0

    def kernel_slice(self, budget_memory: int, kernels: int | None) -> tuple[int, int]:
        """A kernel's default slice (memory, cores) for a user with this budget memory and kernel
        limit: the file's ``kernel:`` values, else the budget divided by the kernel limit (memory
        floored to whole MiB, at least 1MiB; cores at least 1; no limit: the whole budget)."""
        memory, cores = _divide(budget_memory, self.cores, kernels)
        memory = self.kernel_memory if self.kernel_memory_given else memory
        cores = self.kernel_cores if self.kernel_cores_given else cores
        return min(memory, budget_memory), cores


@dataclass(frozen=True)
class GroupLimits:
    """A group's own per-user limits; ``None`` in a field the group does not set (see
    :attr:`kernels_set` / :attr:`memory_set` for an explicit ``null``: no limit)."""

    kernels: int | None = None
    memory: int | None = None
    kernels_set: bool = False
    memory_set: bool = False


@dataclass(frozen=True)
class Limits:
    """Per-user limits at admission: the file's ``limits:`` (``None``: no limit)."""

    kernels: int | None = None
    memory: int | None = None
    groups: Mapping[str, GroupLimits] = field(default_factory=dict)


@dataclass(frozen=True)
class UserLimits:
    """The limits of one user, from their groups: sliced kernels at once and memory (``None``: no limit)."""

    kernels: int | None
    memory: int | None


@dataclass(frozen=True)
class Budget:
    """What one user's server may hold: the chosen size, its memory (capped by the user's memory
    limit) and SM share, its policy, how many sliced kernels at once (``None``: no limit), and a
    kernel's default slice for this user (:meth:`Size.kernel_slice`). ``memory`` and ``cores`` are
    guaranteed; ``borrow_memory`` and ``borrow_cores`` are how far above them the user may hold
    room others leave unused (the size's ``borrow:``, the memory still capped by the user's limit)."""

    size_name: str
    memory: int
    cores: int
    policy: str
    kernels: int | None
    kernel_memory: int = 0
    kernel_cores: int = 0
    borrow_memory: int = 0
    borrow_cores: int = 0

    @property
    def max_memory(self) -> int:
        """The most memory the user may hold, borrowed room included."""
        return self.memory + self.borrow_memory

    @property
    def max_cores(self) -> int:
        """The largest SM share the user may hold, borrowed room included."""
        return self.cores + self.borrow_cores


@dataclass(frozen=True)
class IdlePolicy:
    """What each user's server does with its idle kernels (jupyter_vgpu/server/idle.py): lower
    their SM share to ``floor_cores`` after ``lower_after`` seconds, suspend them to host memory
    after ``suspend_after`` seconds (their GPU memory lent to others through the broker, issue
    18), stop them after ``cull_after`` seconds (``None``: never). ``suspend_host_memory`` (bytes;
    ``None``: half the node's RAM) is what all suspended kernels of the node may hold in host
    memory together: the broker refuses a suspend past it, and the kernel is culled instead. The
    spawner passes the policy in the server's environment."""

    lower_after: float | None = None
    floor_cores: int = DEFAULT_FLOOR_CORES
    cull_after: float | None = None
    suspend_after: float | None = None
    suspend_host_memory: int | None = None
    # Seconds after a kernel got its room during which room-making leaves it alone (the broker's
    # and each server's; None: the pool's default, ledger/policy.py's ROOM_HOLD_S).
    room_hold: float | None = None


@dataclass(frozen=True)
class Classroom:
    """A loaded, checked classroom file (see :func:`load_classroom`)."""

    path: Path
    gpus: Gpus
    sizes: tuple[Size, ...]
    groups: Mapping[str, tuple[str, ...]]
    admins: tuple[str, ...] = ()
    admin_groups: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    oversubscribe: bool = False
    simulate: bool = False
    service_name: str = DEFAULT_SERVICE_NAME
    broker_port: int = DEFAULT_BROKER_PORT
    state_dir: Path = Path(DEFAULT_STATE_DIR)

    @property
    def broker_url(self) -> str:
        """The broker's URL as single-user servers on this node reach it (through no proxy)."""
        return f"http://127.0.0.1:{self.broker_port}/services/{self.service_name}/"

    @property
    def limits_dir(self) -> Path:
        """Where the broker publishes each slice's limits page (readable by the users' kernels,
        writable by the broker's account alone)."""
        return self.state_dir / "limits"

    @property
    def simulated_devices(self) -> str:
        """A ``VGPU_SIM_DEVICES`` spec for a simulated node like this one (native/sim/common/spec.c)."""
        # The simulator takes whole numbers with a unit; bytes when MiB is not exact.
        memory = f"{self.gpus.memory // MIB}MiB" if self.gpus.memory % MIB == 0 else f"{self.gpus.memory}B"
        device = f"name={SIMULATED_GPU_NAME},memory={memory},sms={self.gpus.sms}"
        return ";".join([device] * self.gpus.count)

    @property
    def default_size(self) -> Size | None:
        """The size marked ``default: true``, if any."""
        return next((size for size in self.sizes if size.default), None)

    def sizes_for(self, groups: Iterable[str]) -> list[Size]:
        """The sizes a user in ``groups`` may pick, in the file's order."""
        mine = set(_names(groups))
        return [size for size in self.sizes if not size.groups or mine.intersection(size.groups)]

    def size_for(self, user_options: Mapping[str, Any] | None, groups: Iterable[str]) -> Size:
        """The size a user in ``groups`` chose in ``user_options["profile"]`` (KubeSpawner's key),
        or their default size when they chose none: the file's default if they may pick it, else
        the first size they may pick. Refuses a size that is unknown or not theirs."""
        groups = _names(groups)
        allowed = self.sizes_for(groups)
        chosen = _chosen_profile(user_options)
        if chosen is None:
            if not allowed:
                raise ClassroomError(
                    f"no GPU size is open to {_describe_groups(groups)}; sizes are open to groups: "
                    + ", ".join(f"{size.name} ({', '.join(size.groups)})" for size in self.sizes)
                )
            default = self.default_size
            return default if default in allowed else allowed[0]
        names = ", ".join(size.name for size in allowed) or "none"
        size = next((size for size in self.sizes if size.name == chosen), None)
        if size is None:
            raise ClassroomError(f"GPU size {chosen[:60]!r} does not exist; the sizes you may pick: {names}")
        if size not in allowed:
            raise ClassroomError(
                f"GPU size {chosen!r} is for groups {', '.join(size.groups)}, not for {_describe_groups(groups)}; "
                f"the sizes you may pick: {names}"
            )
        return size

    def limits_for(self, groups: Iterable[str]) -> UserLimits:
        """The limits of a user in ``groups``: each group with its own ``limits.groups`` entry gives
        its values (what it leaves out is the file's ``limits``); a user in several such groups gets
        the most generous value of each; a user in none gets the file's ``limits``."""
        return _user_limits(self.limits, _names(groups))

    def budget_for(self, user_options: Mapping[str, Any] | None, groups: Iterable[str]) -> Budget:
        """The budget of a user in ``groups`` who chose ``user_options`` (see :meth:`size_for`)."""
        groups = _names(groups)
        size = self.size_for(user_options, groups)
        limits = self.limits_for(groups)
        memory = size.memory if limits.memory is None else min(size.memory, limits.memory)
        return _budget(size, memory, limits.kernels, limits.memory)

    def strictest_budget(self, size: Size) -> Budget:
        """The budget that every user who may pick ``size`` gets at least (for a list that
        cannot tell users apart: the least generous of their limits)."""
        limits = [_user_limits(self.limits, picker) for picker in _pickers(size.groups, self.limits)]
        memory = _least([size.memory, *(limit.memory for limit in limits)])
        limit = _least([limit.memory for limit in limits])
        return _budget(size, memory or size.memory, _least([limit.kernels for limit in limits]), limit)


def _divide(memory: int, cores: int, kernels: int | None) -> tuple[int, int]:
    """A budget divided by a kernel limit: memory floored to whole MiB (at least 1MiB), cores at
    least 1; no limit: the whole budget."""
    share = kernels or 1
    return max(MIB, memory // share // MIB * MIB), max(1, cores // share)


def _budget(size: Size, memory: int, kernels: int | None, memory_limit: int | None = None) -> Budget:
    kernel_memory, kernel_cores = size.kernel_slice(memory, kernels)
    # Borrowing never lifts the user's own memory limit (limits.memory: whatever the size).
    most = size.memory + size.borrow_memory
    borrow_memory = max(0, (most if memory_limit is None else min(most, memory_limit)) - memory)
    return Budget(
        size_name=size.name,
        memory=memory,
        cores=size.cores,
        policy=size.policy,
        kernels=kernels,
        kernel_memory=kernel_memory,
        kernel_cores=kernel_cores,
        borrow_memory=borrow_memory,
        borrow_cores=size.borrow_cores,
    )


def _least(values: list[int | None]) -> int | None:
    finite = [value for value in values if value is not None]
    return min(finite) if finite else None


def _user_limits(limits: Limits, groups: tuple[str, ...]) -> UserLimits:
    entries = [limits.groups[name] for name in groups if name in limits.groups]
    if not entries:
        return UserLimits(kernels=limits.kernels, memory=limits.memory)
    kernels = [entry.kernels if entry.kernels_set else limits.kernels for entry in entries]
    memory = [entry.memory if entry.memory_set else limits.memory for entry in entries]
    return UserLimits(kernels=_most_generous(kernels), memory=_most_generous(memory))


def _pickers(size_groups: tuple[str, ...], limits: Limits) -> list[tuple[str, ...]]:
    """The least generous group sets among the users who may pick a size: each of its groups
    alone, or for a size open to everyone, no group and each group with limits of its own (a user
    in more groups gets limits at least as generous)."""
    return [(group,) for group in size_groups] if size_groups else [(), *((group,) for group in limits.groups)]


def _names(groups: Iterable[str]) -> tuple[str, ...]:
    # A lone group name is one group, not its letters.
    return (groups,) if isinstance(groups, str) else tuple(groups)


def _describe_groups(groups: tuple[str, ...]) -> str:
    return f"groups {', '.join(groups)}" if groups else "a user in no group"


def _chosen_profile(user_options: Mapping[str, Any] | None) -> str | None:
    """The size named in user_options, ``None`` when none is; a form's one-item list is its item."""
    if not user_options:
        return None
    chosen = user_options.get("profile")
    if isinstance(chosen, list) and len(chosen) == 1:
        chosen = chosen[0]
    if chosen is None or chosen == "":
        return None
    if not isinstance(chosen, str):
        raise ClassroomError(f"the GPU size (user option 'profile') must be a size's name, not {chosen!r:.60}")
    return chosen


def _most_generous(values: list[int | None]) -> int | None:
    return None if any(value is None for value in values) else max(v for v in values if v is not None)


def parse_duration(value: object) -> float:
    """Seconds from a duration: ``90s``, ``20m``, ``2h``, ``1d`` or a bare number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SliceValueError(f"{value!r:.40} is not {DURATION_HELP}")
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match or match.group(2).lower() not in _DURATION_UNITS:
            raise SliceValueError(f"{value[:40]!r} is not {DURATION_HELP}")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    else:
        seconds = float(value)
    if not 0 < seconds < float("inf"):
        raise SliceValueError(f"{str(value)[:40]!r} must be more than zero; use {DURATION_HELP}")
    return seconds


class _Reader:
    """Reads one classroom file's values, raising errors that name the file and the key; where a
    part is read with :meth:`part` (or :meth:`attempt`), its problem is kept and reading goes on,
    so :meth:`refuse` can list every problem at once."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems: list[str] = []

    def error(self, key: str, message: str) -> ClassroomError:
        problem = f"{key}: {message}" if key else message
        return ClassroomError(f"{self.label}: {problem}", [problem])

    def note(self, error: ClassroomError) -> None:
        """Keep the problems of ``error`` and read on."""
        if not isinstance(error, _AlreadySaid):
            self.problems.extend(error.problems or [str(error)])

    @contextlib.contextmanager
    def part(self) -> Iterator[None]:
        """Read one part of the file; a problem in it is kept, and the next part is read."""
        try:
            yield
        except ClassroomError as error:
            self.note(error)

    def attempt(self, read: Callable[..., _T], *args: Any) -> _T | None:
        """``read(*args)``, or None where it found a problem (kept)."""
        try:
            return read(*args)
        except ClassroomError as error:
            self.note(error)
            return None

    def refuse(self) -> None:
        """Raise one ClassroomError with every problem kept so far, if any."""
        if len(self.problems) == 1:
            raise ClassroomError(f"{self.label}: {self.problems[0]}", self.problems)
        if self.problems:
            listed = "".join(f"\n  - {problem}" for problem in self.problems)
            raise ClassroomError(f"{self.label}: {len(self.problems)} problems:{listed}", self.problems)

    def mapping(self, value: object, key: str, accepted: tuple[str, ...]) -> dict[str, Any]:
        """``value``, a mapping whose keys are all ``accepted``: each unknown key is a problem
        (kept) and left out."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"must be a mapping with keys {', '.join(accepted)}, not {_shown(value)}")
        for name in value:
            if name not in accepted:
                close = (
                    difflib.get_close_matches(str(name), accepted, n=1)
                    or [key for key in accepted if key.startswith(str(name)) or str(name).startswith(key)][:1]
                )
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                where = f"{key}.{name}" if key else str(name)
                self.note(self.error(where, f"unknown key{hint}; accepted: {', '.join(accepted)}"))
        return {name: item for name, item in value.items() if name in accepted}

    def text(self, value: object, key: str, what: str = "text") -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, f"must be {what}, not {_shown(value)} (quote it in YAML if it reads as a number)")
        return value.strip()

    def names(self, value: object, key: str, what: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(key, f"must be a list of {what} like [alice, bob], not {_shown(value)}")
        read = [self.attempt(self.text, item, f"{key}[{index}]", f"a {what[:-1]}") for index, item in enumerate(value)]
        for index, name in enumerate(read):
            if name is not None and name in read[:index]:
                self.note(self.error(f"{key}[{index}]", f"{name!r} is listed twice"))
        return tuple(name for name in read if name is not None)

    def flag(self, value: object, key: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, not {_shown(value)}")
        return value

    def count(self, value: object, key: str, low: int, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise self.error(key, f"must be a whole number {span}, not {_shown(value)}")
        return value

    def parsed(self, parse: Callable[[Any], _T], value: object, key: str) -> _T:
        try:
            return parse(value)
        except SliceValueError as error:
            raise self.error(key, str(error)) from None


def _shown(value: object) -> str:
    return "nothing" if value is None else repr(value)[:60]


def load_classroom(path: str | Path, *, hub_groups: Iterable[str] | None = ()) -> Classroom:
    """Read and check a classroom file.

    ``hub_groups`` are groups the hub defines elsewhere (its ``c.JupyterHub.load_groups``) that
    sizes, limits and ``admin_groups`` may name besides the file's own ``groups:``. ``None`` means
    the hub's groups are not known here (the broker, started by a hub that checked the file with
    them): references to groups outside ``groups:`` are then taken as they are.
    """
    label = str(path)
    reader = _Reader(label)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ClassroomError(f"{label}: cannot read the classroom file: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ClassroomError(f"{label}: not valid YAML{line}: {problem}") from None
    if data is None:
        raise ClassroomError(f"{label}: the file is empty; it needs at least gpus: and sizes:")
    top = reader.mapping(data, "", _TOP_KEYS)
    folder = Path(path).resolve().parent

    gpus = reader.attempt(lambda: _read_gpus(reader, top))
    simulate = reader.attempt(lambda: reader.flag(top.get("simulate"), "simulate", False))
    broker = reader.attempt(lambda: reader.mapping(top.get("broker"), "broker", _BROKER_KEYS)) or {}
    port = reader.attempt(lambda: reader.count(broker.get("port", DEFAULT_BROKER_PORT), "broker.port", 1, 65535))
    name = reader.attempt(lambda: _service_name(reader, broker))
    state_dir = reader.attempt(
        lambda: Path(reader.text(broker.get("state_dir", DEFAULT_STATE_DIR), "broker.state_dir", "a folder"))
    )

    groups = reader.attempt(lambda: _read_groups(reader, top.get("groups")))
    known = None if hub_groups is None else set(groups or {}) | set(hub_groups)

    def check_group(group: str, key: str) -> None:
        if known is not None and group not in known:
            listed = ", ".join(sorted(known)) or "none"
            reader.note(
                reader.error(key, f"unknown group {group!r}; groups are those under groups: or the hub's ({listed})")
            )

    admins = reader.attempt(lambda: reader.names(top.get("admins"), "admins", "user names"))
    admin_groups = reader.attempt(lambda: reader.names(top.get("admin_groups"), "admin_groups", "group names"))
    for index, group in enumerate(admin_groups or ()):
        check_group(group, f"admin_groups[{index}]")

    limits = reader.attempt(lambda: _read_limits(reader, top.get("limits"), check_group))
    sizes = reader.attempt(lambda: _read_sizes(reader, top.get("sizes"), gpus, limits or Limits(), check_group))
    idle = reader.attempt(lambda: _read_idle(reader, top.get("idle")))
    oversubscribe = reader.attempt(lambda: reader.flag(top.get("oversubscribe"), "oversubscribe", False))
    reader.refuse()
    # Read without a problem, none of them is None.
    assert gpus is not None and sizes is not None and groups is not None and limits is not None
    assert admins is not None and admin_groups is not None and idle is not None and state_dir is not None
    assert simulate is not None and oversubscribe is not None and name is not None and port is not None

    classroom = Classroom(
        path=Path(path).resolve(),
        gpus=gpus,
        sizes=sizes,
        groups=groups,
        admins=admins,
        admin_groups=admin_groups,
        limits=limits,
        idle=idle,
        oversubscribe=oversubscribe,
        simulate=simulate,
        service_name=name,
        broker_port=port,
        state_dir=state_dir if state_dir.is_absolute() else folder / state_dir,
    )
    _check_limits_cover_sizes(reader, classroom)
    if not oversubscribe:
        with reader.part():
            _check_fits(reader, classroom)
    reader.refuse()
    return classroom


def _service_name(reader: _Reader, broker: dict[str, Any]) -> str:
    name = reader.text(broker.get("name", DEFAULT_SERVICE_NAME), "broker.name", "a service name")
    if not _SERVICE_NAME.match(name):
        raise reader.error("broker.name", f"{name[:60]!r} is not a service name: lowercase letters, digits, - and _")
    return name


def _read_gpus(reader: _Reader, top: dict[str, Any]) -> Gpus:
    """The node's GPUs, every problem of ``gpus:`` kept; raises only where the GPU's memory, which
    the sizes are checked against, could not be read."""
    if "gpus" not in top:
        raise reader.error("gpus", "missing: say what the node has, like gpus: {count: 2, memory: 16GiB}")
    gpus = reader.mapping(top["gpus"], "gpus", _GPU_KEYS)
    for key in ("count", "memory"):
        if key not in gpus:
            reader.note(reader.error(f"gpus.{key}", "missing; like gpus: {count: 2, memory: 16GiB}"))
    count = reader.attempt(lambda: reader.count(gpus["count"], "gpus.count", 1, 64)) if "count" in gpus else None
    memory = (
        reader.attempt(lambda: reader.parsed(parse_size, gpus["memory"], "gpus.memory")) if "memory" in gpus else None
    )
    reserve = reader.attempt(lambda: _reserve(reader, gpus.get("reserve"), memory))
    sms = reader.attempt(lambda: reader.count(gpus.get("sms", DEFAULT_SMS), "gpus.sms", 1, 1024))
    burst = gpus.get("burst_oversubscription")
    if burst is None:
        burst = 1.0
    elif isinstance(burst, bool) or not isinstance(burst, (int, float)) or not math.isfinite(burst) or burst < 1.0:
        reader.note(
            reader.error(
                "gpus.burst_oversubscription",
                f"must be a number of 1.0 or more (burst shares may add up to this many times 100% of each GPU), "
                f"not {_shown(burst)}",
            )
        )
    placement = gpus.get("placement")
    if placement is None:
        placement = "binpack"
    elif placement not in PLACEMENTS:
        reader.note(
            reader.error(
                "gpus.placement",
                f"must be binpack (a new slice on the fullest GPU it fits on) or spread (on the emptiest), "
                f"not {_shown(placement)}",
            )
        )
    if memory is None:
        raise _already_said()
    # Where another key of gpus: has a problem (kept, so the file is refused), the sizes are still
    # checked against the GPU's memory: what stands in for that key is never used beyond that.
    return Gpus(
        count=count or 1,
        memory=memory,
        sms=sms or DEFAULT_SMS,
        reserve=reserve or 0,
        burst_oversubscription=float(burst) if isinstance(burst, (int, float)) and not isinstance(burst, bool) else 1.0,
        placement=placement if placement in PLACEMENTS else "binpack",
    )


def _reserve(reader: _Reader, reserve: object, memory: int | None) -> int:
    value = 0 if reserve is None or reserve == 0 else reader.parsed(parse_size, reserve, "gpus.reserve")
    if memory is not None and value >= memory:
        raise reader.error(
            "gpus.reserve",
            f"{format_size(value)} kept free leaves nothing of a GPU's {format_size(memory)} (gpus.memory); "
            "reserve less than the memory, or 0",
        )
    return value


class _AlreadySaid(ClassroomError):
    """A part that cannot be made because of problems already kept: nothing more to say."""


def _already_said() -> ClassroomError:
    return _AlreadySaid("problems already kept")


def _read_groups(reader: _Reader, value: object) -> dict[str, tuple[str, ...]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise reader.error(
            "groups", f"must map group names to member lists, like students: [alice, bob]; not {_shown(value)}"
        )
    groups = {}
    for name, members in value.items():
        with reader.part():
            group = reader.text(name, "groups", "a group name")
            groups[group] = reader.names(members, f"groups.{group}", "user names")
    return groups


def _read_limits(reader: _Reader, value: object, check_group: _GroupCheck) -> Limits:
    limits = reader.mapping(value, "limits", _LIMIT_KEYS)

    def kernels(entry: dict[str, Any], key: str) -> int | None:
        return None if entry.get("kernels") is None else reader.count(entry["kernels"], key, 1)

    def memory(entry: dict[str, Any], key: str) -> int | None:
        return None if entry.get("memory") is None else reader.parsed(parse_size, entry["memory"], key)

    per_group = {}
    raw_groups = limits.get("groups")
    if raw_groups is not None and not isinstance(raw_groups, dict):
        raise reader.error(
            "limits.groups", f"must map group names to limits, like staff: {{kernels: 6}}; not {_shown(raw_groups)}"
        )
    found = len(reader.problems)
    for name, raw in (raw_groups or {}).items():
        with reader.part():
            group = reader.text(name, "limits.groups", "a group name")
            check_group(group, f"limits.groups.{group}")
            entry = reader.mapping(raw, f"limits.groups.{group}", _GROUP_LIMIT_KEYS)
            group_kernels = reader.attempt(kernels, entry, f"limits.groups.{group}.kernels")
            group_memory = reader.attempt(memory, entry, f"limits.groups.{group}.memory")
            per_group[group] = GroupLimits(
                kernels=group_kernels,
                memory=group_memory,
                kernels_set="kernels" in entry,
                memory_set="memory" in entry,
            )
    everyone_kernels = reader.attempt(lambda: kernels(limits, "limits.kernels"))
    everyone_memory = reader.attempt(lambda: memory(limits, "limits.memory"))
    if len(reader.problems) > found:
        raise _already_said()
    return Limits(kernels=everyone_kernels, memory=everyone_memory, groups=per_group)


def _read_sizes(
    reader: _Reader, value: object, gpus: Gpus | None, limits: Limits, check_group: _GroupCheck
) -> tuple[Size, ...]:
    """The sizes; every problem of each kept. ``gpus`` None (its own problems kept): what a size
    is checked against on a GPU is not checked."""
    if value is None:
        raise reader.error(
            "sizes", "missing: list the GPU sizes users pick from, like - {name: small, memory: 2GiB, cores: 20}"
        )
    if not isinstance(value, list) or not value:
        raise reader.error(
            "sizes", f"must be a list of sizes, like - {{name: small, memory: 2GiB, cores: 20}}; not {_shown(value)}"
        )
    found = len(reader.problems)
    sizes: list[Size] = []
    names: list[str | None] = []
    for index, raw in enumerate(value):
        with reader.part():
            size = _read_size(reader, raw, f"sizes[{index}]", names, sizes, gpus, limits, check_group)
            sizes.append(size)
    if len(reader.problems) > found:
        raise _already_said()
    return tuple(sizes)


def _read_size(
    reader: _Reader,
    raw: object,
    key: str,
    names: list[str | None],
    sizes: list[Size],
    gpus: Gpus | None,
    limits: Limits,
    check_group: _GroupCheck,
) -> Size:
    """One size of ``sizes:`` (``names``: those of the sizes before it, this one's added)."""
    entry = reader.mapping(raw, key, _SIZE_KEYS)
    found = len(reader.problems)
    for required in ("name", "memory", "cores"):
        if required not in entry:
            reader.note(reader.error(f"{key}.{required}", "missing; a size needs name, memory and cores"))
    name = reader.attempt(lambda: _size_name(reader, entry, key, names)) if "name" in entry else None
    names.append(name)
    memory = reader.attempt(lambda: _size_memory(reader, entry, key, gpus)) if "memory" in entry else None
    cores = (
        reader.attempt(lambda: reader.parsed(parse_sm_share, entry["cores"], f"{key}.cores"))
        if "cores" in entry
        else None
    )
    policy = reader.attempt(lambda: reader.parsed(parse_policy, entry.get("policy", "hard"), f"{key}.policy"))
    groups = reader.attempt(lambda: reader.names(entry.get("groups"), f"{key}.groups", "group names"))
    for position, group in enumerate(groups or ()):
        check_group(group, f"{key}.groups[{position}]")
    default = reader.attempt(lambda: reader.flag(entry.get("default"), f"{key}.default", False))
    if default:
        other = next((i for i, size in enumerate(sizes) if size.default), None)
        if other is not None:
            reader.note(reader.error(f"{key}.default", f"sizes[{other}] is the default already; at most one size is"))
    kernel = reader.attempt(lambda: reader.mapping(entry.get("kernel"), f"{key}.kernel", _KERNEL_KEYS))
    display_name = entry.get("display_name")
    if display_name is not None:
        display_name = reader.attempt(lambda: reader.text(display_name, f"{key}.display_name"))
    description = entry.get("description")
    if description is not None:
        description = reader.attempt(lambda: reader.text(description, f"{key}.description"))
    if memory is None or cores is None:
        reader.attempt(lambda: _borrow(reader, entry.get("borrow"), key, None, None, gpus))
        raise _already_said()
    kernel_default = None
    if kernel is not None and groups is not None:
        kernel_default = reader.attempt(lambda: _kernel_default(reader, kernel, key, memory, cores, groups, limits))
    borrowed = reader.attempt(lambda: _borrow(reader, entry.get("borrow"), key, memory, cores, gpus))
    if len(reader.problems) > found:
        raise _already_said()
    assert name is not None and policy is not None and groups is not None and default is not None
    assert kernel is not None and kernel_default is not None and borrowed is not None
    kernel_memory, kernel_cores = kernel_default
    borrow_memory, borrow_cores = borrowed
    return Size(
        name=name,
        display_name=display_name
        if display_name is not None
        else f"{name.replace('-', ' ').capitalize()}: {format_size(memory)}, {cores}% of a GPU"
        + (" (burst)" if policy == "burst" else ""),
        description=description
        if description is not None
        else f"Your notebooks share {format_size(memory)} of GPU memory and {cores}% of a GPU's compute."
        + (
            f" Each starts with {format_size(kernel_memory)} and {kernel_cores}%."
            if "memory" in kernel and "cores" in kernel
            else ""
        ),
        memory=memory,
        cores=cores,
        policy=policy,
        groups=groups,
        default=default,
        kernel_memory=kernel_memory,
        kernel_cores=kernel_cores,
        kernel_memory_given="memory" in kernel,
        kernel_cores_given="cores" in kernel,
        borrow_memory=borrow_memory,
        borrow_cores=borrow_cores,
    )


def _size_name(reader: _Reader, entry: dict[str, Any], key: str, names: list[str | None]) -> str:
    name = reader.text(entry["name"], f"{key}.name", "a name")
    if not _SLUG.match(name):
        raise reader.error(f"{key}.name", f"{name[:60]!r} is not a size name: lowercase letters, digits and -")
    earlier = next((i for i, other in enumerate(names) if other == name), None)
    if earlier is not None:
        raise reader.error(f"{key}.name", f"{name!r} is also the name of sizes[{earlier}]; names must be unique")
    return name


def _size_memory(reader: _Reader, entry: dict[str, Any], key: str, gpus: Gpus | None) -> int:
    memory = reader.parsed(parse_size, entry["memory"], f"{key}.memory")
    if gpus is not None and memory > gpus.usable_memory:
        have = (
            f"{format_size(gpus.usable_memory)} (gpus.memory less gpus.reserve)"
            if gpus.reserve
            else (f"{format_size(gpus.memory)} (gpus.memory)")
        )
        raise reader.error(f"{key}.memory", f"{format_size(memory)} is more than one GPU's {have}")
    if memory < MIB:
        raise reader.error(f"{key}.memory", f"{format_size(memory)} is less than the smallest slice, 1MiB")
    return memory


def _kernel_default(
    reader: _Reader, kernel: dict[str, Any], key: str, memory: int, cores: int, groups: tuple[str, ...], limits: Limits
) -> tuple[int, int]:
    """A kernel's default slice of a size, checked against the size: the file's ``kernel:``,
    else the budget divided by the kernel limit of the size's strictest picker (the smallest
    limit of the users who may pick it; none: the whole budget). Each user's own default divides
    by their own limit (:meth:`Size.kernel_slice`)."""
    limited = (_user_limits(limits, picker).kernels for picker in _pickers(groups, limits))
    kernel_memory, kernel_cores = _divide(memory, cores, _least(list(limited)))
    if "memory" in kernel:
        kernel_memory = reader.parsed(parse_size, kernel["memory"], f"{key}.kernel.memory")
        if kernel_memory > memory:
            raise reader.error(
                f"{key}.kernel.memory",
                f"a kernel's default {format_size(kernel_memory)} is more than the size's budget "
                f"{format_size(memory)} ({key}.memory)",
            )
    if "cores" in kernel:
        kernel_cores = reader.parsed(parse_sm_share, kernel["cores"], f"{key}.kernel.cores")
        if kernel_cores > cores:
            raise reader.error(
                f"{key}.kernel.cores",
                f"a kernel's default {kernel_cores}% is more than the size's budget {cores}% ({key}.cores)",
            )
    return kernel_memory, kernel_cores


def _borrow(
    reader: _Reader, value: object, key: str, memory: int | None, cores: int | None, gpus: Gpus | None
) -> tuple[int, int]:
    """How far a size may borrow above its guarantee (memory bytes, cores percent): the file's
    ``borrow:``, checked so that guarantee and borrowing together fit on one GPU (where the
    size's ``memory``, ``cores`` and ``gpus`` were read; None: not checked against them)."""
    if value is None:
        return 0, 0
    if not isinstance(value, dict) or not value:
        raise reader.error(
            f"{key}.borrow",
            f"must be a mapping like {{memory: 4GiB, cores: 30}} (how far above the size's memory and cores it may "
            f"borrow; keys {', '.join(_BORROW_KEYS)}), not {_shown(value)}",
        )
    entry = reader.mapping(value, f"{key}.borrow", _BORROW_KEYS)
    borrow_memory = borrow_cores = 0
    problems = len(reader.problems)
    if entry.get("memory") is not None:
        borrow_memory = reader.attempt(lambda: _borrow_memory(reader, entry["memory"], key, memory, gpus)) or 0
    if entry.get("cores") is not None:
        borrow_cores = reader.attempt(lambda: _borrow_cores(reader, entry["cores"], key, cores)) or 0
    if len(reader.problems) > problems:
        raise _already_said()
    return borrow_memory, borrow_cores


def _borrow_memory(reader: _Reader, value: object, key: str, memory: int | None, gpus: Gpus | None) -> int:
    borrow_memory = reader.parsed(parse_size, value, f"{key}.borrow.memory")
    if memory is not None and gpus is not None and memory + borrow_memory > gpus.usable_memory:
        raise reader.error(
            f"{key}.borrow.memory",
            f"{format_size(memory)} guaranteed and {format_size(borrow_memory)} borrowed make "
            f"{format_size(memory + borrow_memory)}, more than one GPU's {format_size(gpus.usable_memory)}"
            + (" (gpus.memory less gpus.reserve)" if gpus.reserve else " (gpus.memory)")
            + f"; borrow at most {format_size(max(0, gpus.usable_memory - memory))}",
        )
    return borrow_memory


def _borrow_cores(reader: _Reader, value: object, key: str, cores: int | None) -> int:
    borrow_cores = reader.count(value, f"{key}.borrow.cores", 0, 100)
    if cores is not None and cores + borrow_cores > 100:
        raise reader.error(
            f"{key}.borrow.cores",
            f"{cores}% guaranteed and {borrow_cores}% borrowed make {cores + borrow_cores}%, more than one GPU's "
            f"100%; borrow at most {100 - cores}",
        )
    return borrow_cores


def _read_idle(reader: _Reader, value: object) -> IdlePolicy:
    idle = reader.mapping(value, "idle", _IDLE_KEYS)

    def duration(key: str) -> float | None:
        return None if idle.get(key) is None else reader.parsed(parse_duration, idle[key], f"idle.{key}")

    found = len(reader.problems)
    floor = idle.get("floor_cores")
    lower_after = reader.attempt(lambda: duration("lower_after"))
    floor_cores = reader.attempt(
        lambda: DEFAULT_FLOOR_CORES if floor is None else reader.parsed(parse_sm_share, floor, "idle.floor_cores")
    )
    cull_after = reader.attempt(lambda: duration("cull_after"))
    suspend_after = reader.attempt(lambda: duration("suspend_after"))
    suspend_host_memory = reader.attempt(
        lambda: (
            None
            if idle.get("suspend_host_memory") is None
            else reader.parsed(parse_size, idle["suspend_host_memory"], "idle.suspend_host_memory")
        )
    )
    hold = idle.get("room_hold")
    room_hold = reader.attempt(lambda: 0.0 if hold in (0, "0", "0s") else duration("room_hold"))
    if len(reader.problems) > found or floor_cores is None:
        raise _already_said()
    policy = IdlePolicy(
        lower_after=lower_after,
        floor_cores=floor_cores,
        cull_after=cull_after,
        suspend_after=suspend_after,
        suspend_host_memory=suspend_host_memory,
        room_hold=room_hold,
    )
    suspend_after, cull_after = policy.suspend_after, policy.cull_after
    if suspend_after is not None and cull_after is not None and suspend_after >= cull_after:
        raise reader.error(
            "idle.suspend_after",
            f"{_seconds(suspend_after)} is not less than idle.cull_after ({_seconds(cull_after)}): a kernel is "
            "suspended before it is stopped; make suspend_after shorter, or leave it out to keep lower-then-cull",
        )
    if policy.suspend_host_memory is not None and suspend_after is None:
        raise reader.error(
            "idle.suspend_host_memory",
            "caps the host memory of suspended kernels, but no kernel is suspended without idle.suspend_after; "
            "set idle.suspend_after too, or leave suspend_host_memory out",
        )
    return policy


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _check_limits_cover_sizes(reader: _Reader, classroom: Classroom) -> None:
    """No user limit below a size offered to that user: the size would be a promise not kept."""
    limits = classroom.limits
    for index, size in enumerate(classroom.sizes):
        for picker in _pickers(size.groups, limits):
            memory = classroom.limits_for(picker).memory
            if memory is None or memory >= size.memory:
                continue
            group = picker[0] if picker else None
            own = group is not None and group in limits.groups and limits.groups[group].memory_set
            key = f"limits.groups.{group}.memory" if own else "limits.memory"
            who = f"group {group}" if group is not None else "every user"
            reader.note(
                reader.error(
                    key,
                    f"{format_size(memory)} is less than size {size.name!r} ({format_size(size.memory)}, "
                    f"sizes[{index}]) offered to {who}; raise the limit, or take the group off the size",
                )
            )


def _check_fits(reader: _Reader, classroom: Classroom) -> None:
    """Every listed group member's default budget fits on the node at once, as the ledger counts:
    memory against each GPU's memory less ``gpus.reserve``; hard SM shares against 100 % a GPU,
    hard and burst ones together against 100 % x ``gpus.burst_oversubscription`` a GPU."""
    members: dict[str, list[str]] = {}
    for group, users in classroom.groups.items():
        for user in users:
            members.setdefault(user, []).append(group)
    memory = hard = burst = 0
    for groups in members.values():
        try:
            budget = classroom.budget_for(None, groups)
        except ClassroomError:
            continue  # no size open to this user: they hold nothing
        memory += budget.memory
        if budget.policy == "burst":
            burst += budget.cores
        else:
            hard += budget.cores
    gpus = classroom.gpus
    have_memory = gpus.count * gpus.usable_memory
    have_hard = gpus.count * 100
    have_all = gpus.count * gpus.share_capacity
    if memory > have_memory or hard > have_hard or hard + burst > have_all:
        split = f" ({hard}% hard, {burst}% burst)" if burst and hard else " (burst)" if burst else ""
        shares = (
            f"{have_hard}%"
            if have_all == have_hard
            else (
                f"{have_hard}% hard, {have_all}% hard and burst with gpus.burst_oversubscription "
                f"{gpus.burst_oversubscription:g}"
            )
        )
        less = " after gpus.reserve" if gpus.reserve else ""
        raise reader.error(
            "oversubscribe",
            f"the default budgets of the {len(members)} users under groups: need {format_size(memory)} and "
            f"{hard + burst}% of a GPU's SMs together{split}, more than the node's {gpus.count} GPUs have "
            f"({format_size(have_memory)}{less}, {shares}); make the default sizes smaller, "
            + ("raise gpus.burst_oversubscription, " if burst and hard + burst > have_all and hard <= have_hard else "")
            + "or set oversubscribe: true to allow it",
        )


# What a single-user server of this classroom reads (VGPUApp takes its settings from these).
ENV_BROKER_URL = "JUPYTER_VGPU_BROKER_URL"
ENV_BROKER_LIMITS_DIR = "JUPYTER_VGPU_BROKER_LIMITS_DIR"
ENV_DEFAULT_MEMORY = "JUPYTER_VGPU_DEFAULT_MEMORY"
ENV_DEFAULT_CORES = "JUPYTER_VGPU_DEFAULT_CORES"
ENV_DEFAULT_POLICY = "JUPYTER_VGPU_DEFAULT_POLICY"
ENV_SERVER_MEMORY_LIMIT = "JUPYTER_VGPU_SERVER_MEMORY_LIMIT"
ENV_SERVER_SLICE_LIMIT = "JUPYTER_VGPU_SERVER_SLICE_LIMIT"
ENV_MAX_CORES = "JUPYTER_VGPU_MAX_CORES"
ENV_SIMULATE = "JUPYTER_VGPU_SIMULATE"
ENV_IDLE_LOWER_AFTER = "JUPYTER_VGPU_IDLE_LOWER_AFTER"
ENV_IDLE_FLOOR_CORES = "JUPYTER_VGPU_IDLE_FLOOR_CORES"
ENV_IDLE_CULL_AFTER = "JUPYTER_VGPU_IDLE_CULL_AFTER"
ENV_IDLE_SUSPEND_AFTER = "JUPYTER_VGPU_IDLE_SUSPEND_AFTER"
ENV_SUSPEND_HOST_MEMORY = "JUPYTER_VGPU_SUSPEND_HOST_MEMORY"
ENV_ROOM_HOLD = "JUPYTER_VGPU_ROOM_HOLD"
ENV_SIM_DEVICES = "VGPU_SIM_DEVICES"
SERVER_ENVIRONMENT = (
    ENV_BROKER_URL,
    ENV_BROKER_LIMITS_DIR,
    ENV_DEFAULT_MEMORY,
    ENV_DEFAULT_CORES,
    ENV_DEFAULT_POLICY,
    ENV_SERVER_MEMORY_LIMIT,
    ENV_SERVER_SLICE_LIMIT,
    ENV_MAX_CORES,
    ENV_SIMULATE,
    ENV_SIM_DEVICES,
    ENV_IDLE_LOWER_AFTER,
    ENV_IDLE_FLOOR_CORES,
    ENV_IDLE_CULL_AFTER,
    ENV_IDLE_SUSPEND_AFTER,
    ENV_SUSPEND_HOST_MEMORY,
    ENV_ROOM_HOLD,
)


def server_environment(
    classroom: Classroom, user_options: Mapping[str, Any] | None, groups: Iterable[str], *, broker: bool = True
) -> dict[str, str]:
    """The variables that size a user's single-user server: their kernels' default slice, their
    budget, the broker's URL (``broker=False`` leaves it out: a KubeSpawner pod's slice is shared
    out by its own embedded ledger). Only what applies is set: no slice limit when the user has
    none, no ``JUPYTER_VGPU_SIMULATE`` (nor the simulated node's ``VGPU_SIM_DEVICES``) when the
    node is real. Refuses a size the user may not pick.

    The budget shown here is for the server's own checks and display; the broker enforces it
    from the hub's ``user_options``, never from what a server says.
    """
    groups = _names(groups)
    size = classroom.size_for(user_options, groups)
    return size_environment(classroom, size, classroom.budget_for(user_options, groups), broker=broker)


def size_environment(classroom: Classroom, size: Size, budget: Budget, *, broker: bool = True) -> dict[str, str]:
    """The variables of :func:`server_environment` for a size and a budget already decided."""
    environment = {
        ENV_DEFAULT_MEMORY: exact_size(budget.kernel_memory),
        ENV_DEFAULT_CORES: str(budget.kernel_cores),
        ENV_DEFAULT_POLICY: size.policy,
        # The most the server may hold: its guarantee plus what it may borrow (the broker decides
        # what is borrowed and takes it back).
        ENV_SERVER_MEMORY_LIMIT: exact_size(budget.max_memory),
        ENV_MAX_CORES: str(budget.max_cores),
    }
    if broker:
        environment[ENV_BROKER_URL] = classroom.broker_url
        environment[ENV_BROKER_LIMITS_DIR] = str(classroom.limits_dir)
    if budget.kernels is not None:
        environment[ENV_SERVER_SLICE_LIMIT] = str(budget.kernels)
    if classroom.simulate:
        environment[ENV_SIMULATE] = "1"
        # The same simulated devices as the broker's (a slice on GPU 1 must find a GPU 1).
        environment[ENV_SIM_DEVICES] = classroom.simulated_devices
    # The idle policy is applied by the user's own server, which knows when its kernels run.
    if classroom.idle.lower_after is not None:
        environment[ENV_IDLE_LOWER_AFTER] = repr(classroom.idle.lower_after)
        environment[ENV_IDLE_FLOOR_CORES] = str(classroom.idle.floor_cores)
    if classroom.idle.cull_after is not None:
        environment[ENV_IDLE_CULL_AFTER] = repr(classroom.idle.cull_after)
    if classroom.idle.suspend_after is not None:
        environment[ENV_IDLE_SUSPEND_AFTER] = repr(classroom.idle.suspend_after)
        # The node's cap, which the broker enforces over every user's suspended kernels; the
        # server checks its own against it too (without it, it would take half the node's RAM).
        if classroom.idle.suspend_host_memory is not None:
            environment[ENV_SUSPEND_HOST_MEMORY] = exact_size(classroom.idle.suspend_host_memory)
    if classroom.idle.room_hold is not None:
        environment[ENV_ROOM_HOLD] = repr(classroom.idle.room_hold)
    return environment
