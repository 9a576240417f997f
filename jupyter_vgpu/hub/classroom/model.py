"""A loaded classroom and what it decides.

:class:`Classroom` (what :func:`~jupyter_vgpu.hub.classroom.load_classroom` returns) and its
parts: the node's :class:`Gpus`, the :class:`Size` users pick from, the per-user :class:`Limits`
and the :class:`IdlePolicy`; and the decisions made from them: the size a user may have, their
limits (:class:`UserLimits`) and their :class:`Budget`. :class:`ClassroomError` is what a refused
file, or a size a user may not have, raises.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_vgpu.hub.classroom.keys import (
    DEFAULT_BROKER_PORT,
    DEFAULT_FLOOR_CORES,
    DEFAULT_SERVICE_NAME,
    DEFAULT_SMS,
    DEFAULT_STATE_DIR,
)

MIB = 1 << 20
SIMULATED_GPU_NAME = "jupyter-vgpu simulated GPU"


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
