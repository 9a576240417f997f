"""Reading and checking a classroom file: :func:`load_classroom`.

Each part of the file is read with a :class:`~jupyter_vgpu.hub.classroom.reader._Reader`, so
every entry is read and every problem kept; the checks across entries (user limits against the
sizes offered, the default budgets against the node) follow once the entries are right; then the
file is refused with every problem at once, or its
:class:`~jupyter_vgpu.hub.classroom.Classroom` returned.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from jupyter_vgpu.hub.classroom.keys import (
    _BORROW_KEYS,
    _BROKER_KEYS,
    _GPU_KEYS,
    _GROUP_LIMIT_KEYS,
    _IDLE_KEYS,
    _KERNEL_KEYS,
    _LIMIT_KEYS,
    _SIZE_KEYS,
    _TOP_KEYS,
    DEFAULT_BROKER_PORT,
    DEFAULT_FLOOR_CORES,
    DEFAULT_SERVICE_NAME,
    DEFAULT_SMS,
    DEFAULT_STATE_DIR,
)
from jupyter_vgpu.hub.classroom.model import (
    MIB,
    Classroom,
    ClassroomError,
    Gpus,
    GroupLimits,
    IdlePolicy,
    Limits,
    Size,
    _divide,
    _least,
    _pickers,
    _user_limits,
)
from jupyter_vgpu.hub.classroom.reader import _already_said, _Reader, _shown, parse_duration
from jupyter_vgpu.ledger.embedded import PLACEMENTS
from jupyter_vgpu.model import format_size, parse_policy, parse_size, parse_sm_share

_SLUG = re.compile(r"^[a-z0-9-]+$")
_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

_GroupCheck = Callable[[str, str], None]


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
