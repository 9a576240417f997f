"""The pool's policy: the one set of rules by which room on a GPU is made and given, called by a
server's room-making (server/suspend.py, server/room.py) and by the node's broker
(ledger/lending.py), so that the same request gets the same answer whoever decides it.

- **What fits**: a request of some memory and SM share fits on a device whose free memory and
  free share (for its policy) are at least that (:func:`fits`); room-making starts only where
  every kernel it may suspend could make up what is missing (:func:`could_make_up`).
- **Who makes room, in what order** (:func:`room_order`): running local slices whose kernels are
  known to run no cell, room nobody uses first (kernels that hold nothing on the GPU: lending
  their room moves nothing), then the others, longest idle first. Never the kernel that wants the
  room; never one whose execution state is not known to be idle (:func:`runs_no_cell`: an
  adopted kernel whose state was not learnt yet, or any state nobody knows, counts as busy);
  never one that got its room less than ``hold`` seconds ago (:func:`got_room_at`: its start or
  its last resume), so that two kernels do not take the room from each other back and forth.
- **Guarantees and borrowing** (a classroom): a budget with a guarantee (every classroom size:
  its ``memory`` and ``cores``) is owed that much; a slice that takes its owner past it borrows
  (:func:`past_guarantee`) and may be taken back, even mid-cell, most recent borrower first
  (:func:`take_back_order`), for a request within its owner's guarantee. Only a take-back
  suspends a kernel that runs a cell.
- **What a request waits for** (:func:`waiting_for_room`): never empty, in the words every view
  uses, with the GPU's free figure (not the slice's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jupyter_vgpu.ledger.base import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    ROOM_FOR_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    SUSPEND_TIMINGS_KEY,
    TAKE_BACK_KEY,
    Allocation,
    CapacityError,
    DeviceUsage,
    OwnerBudget,
)
from jupyter_vgpu.line import NOT_TRIED
from jupyter_vgpu.model import SliceLimits, format_size

# CapacityError.resource of a borrowing request that the host memory cap leaves no room to take
# back without a kill: it waits in line like one short of GPU room, and no suspend makes its room.
HOST_MEMORY = "host_memory"
# Seconds after a kernel got its room (its start was admitted, or it resumed) during which
# room-making does not suspend it again for another request (VGPUApp.room_hold; the broker's).
ROOM_HOLD_S = 30.0
# The execution state in which a kernel is known to run no cell (jupyter_server's
# ``execution_state``); and "starting", which a kernel keeps until a client first talks to it,
# where the server watched it from its start (every cell's "busy" would have reached it). Any
# other (busy, restarting, one nobody knows; "starting" in a kernel adopted after a restart, whose
# cell may have begun before the server watched it) counts as running a cell.
IDLE_STATE = "idle"
NEVER_ASKED_STATE = "starting"
# Metadata of a slice whose user turned to its kernel (the lab's sign, POST .../wake): {"at":
# epoch seconds}; the idle policy and room making count the kernel active from then.
WOKEN_KEY = "woken"
# The key of SUSPEND_TIMINGS_KEY's record that says when the slice last resumed (epoch seconds).
RESUMED_AT = "resumed_at"


def runs_no_cell(execution_state: str | None, *, adopted: bool = False) -> bool:
    """Whether a kernel in this execution state is known to run no cell (and so may make room, or
    count as idle): "idle"; or "starting" (nobody asked it anything yet) where the server watched
    it from its start, not ``adopted`` after a restart. Any other state counts as busy."""
    return execution_state == IDLE_STATE or (execution_state == NEVER_ASKED_STATE and not adopted)


def woken_at(allocation: Allocation) -> float:
    """When the kernel's user last turned to it (WOKEN_KEY), 0.0 if never."""
    woken = allocation.metadata.get(WOKEN_KEY)
    at = woken.get("at") if isinstance(woken, dict) else None
    return float(at) if isinstance(at, (int, float)) else 0.0


def got_room_at(allocation: Allocation) -> float:
    """When the slice last got its room on its device: its admission, or its last resume."""
    timings = allocation.metadata.get(SUSPEND_TIMINGS_KEY)
    resumed = timings.get(RESUMED_AT) if isinstance(timings, dict) else None
    resumed_at = float(resumed) if isinstance(resumed, (int, float)) and not isinstance(resumed, bool) else 0.0
    return max(allocation.created_at, resumed_at)


# -- what fits ----------------------------------------------------------------------------------


def fits(usage: DeviceUsage, memory: int, sm_share: int, policy: str) -> bool:
    """Whether ``memory`` bytes and ``sm_share`` percent (of ``policy``) fit in what ``usage`` has free."""
    return usage.memory_free >= memory and usage.share_free(policy) >= sm_share


def could_make_up(short: CapacityError, candidates: Iterable[Allocation]) -> bool:
    """Whether suspending all ``candidates`` could give back what ``short`` says is missing
    (memory in bytes, or an SM share in percent)."""
    candidates = list(candidates)
    missing = short.requested - short.available
    if short.resource == "memory":
        return sum(candidate.memory_limit for candidate in candidates) >= missing
    if short.resource == "sm_share":
        return sum(candidate.sm_share for candidate in candidates) >= missing
    if short.resource == HOST_MEMORY:
        return False  # a suspend puts more in host memory: it makes none of that room
    return bool(candidates)


# -- who makes room, in what order --------------------------------------------------------------


@dataclass(frozen=True)
class Idle:
    """What room-making knows of a kernel that runs no cell: when it was last active (epoch
    seconds) and whether its processes hold GPU memory (one that holds none is only lent)."""

    last_active: float
    uses_gpu: bool


def room_order(
    allocations: Iterable[Allocation],
    device_uuid: str | None,
    exclude: str,
    idle: Callable[[Allocation], Idle | None],
    *,
    now: float,
    hold: float,
) -> list[Allocation]:
    """The slices whose kernels may be suspended to make room on ``device_uuid`` (None: any), in
    the order they are asked: running local slices but ``exclude``'s, whose kernels ``idle``
    knows to run no cell (None: a cell runs, or nobody knows), which got their room at least
    ``hold`` seconds before ``now``; those that hold nothing on the GPU first, then the longest
    idle (counting the user's last sign, WOKEN_KEY)."""
    ordered = []
    for allocation in allocations:
        if allocation.suspended or allocation.holder != "local" or allocation.kernel_id == exclude:
            continue
        if device_uuid not in (None, allocation.device_uuid):
            continue
        state = idle(allocation)
        if state is None or (hold > 0 and now - got_room_at(allocation) < hold):
            continue
        ordered.append(((state.uses_gpu, max(state.last_active, woken_at(allocation))), allocation))
    return [allocation for _, allocation in sorted(ordered, key=lambda pair: pair[0])]


def requested_at(allocation: Allocation) -> float | None:
    """When the broker asked the slice's server to suspend it (SUSPEND_REQUESTED_KEY), if it did."""
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    at = request.get("at") if isinstance(request, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def room_for(allocation: Allocation) -> str | None:
    """The suspended kernel whose resume the slice's suspend request makes room for (a swap), if any."""
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    kernel = request.get(ROOM_FOR_KEY) if isinstance(request, dict) else None
    return kernel if isinstance(kernel, str) else None


def uses_gpu(allocation: Allocation) -> bool:
    """Whether the slice's server reports its processes hold GPU memory (True where it does not say)."""
    activity = allocation.metadata.get(ACTIVITY_KEY)
    return not isinstance(activity, dict) or activity.get("uses_gpu") is not False


def reported_idle(allocation: Allocation, now: float) -> Idle | None:
    """A slice's kernel as its server last reported it (ACTIVITY_KEY, the broker's view): idle
    where it said the kernel runs no cell, and not asked to suspend without doing so within
    SUSPEND_REQUEST_TIMEOUT_S (its server did not, or cannot: others are asked instead)."""
    activity = allocation.metadata.get(ACTIVITY_KEY)
    if not isinstance(activity, dict) or activity.get("busy") is not False:
        return None
    last = activity.get("last_activity")
    if not isinstance(last, (int, float)) or isinstance(last, bool):
        return None
    asked = requested_at(allocation)
    if asked is not None and now - asked > SUSPEND_REQUEST_TIMEOUT_S:
        return None
    return Idle(float(last), uses_gpu(allocation))


def idle_candidates(
    allocations: list[Allocation], device_uuid: str, exclude: str, now: float, hold: float = 0.0
) -> list[Allocation]:
    """:func:`room_order` as the broker reads it: from the activity the servers report."""
    return room_order(allocations, device_uuid, exclude, lambda item: reported_idle(item, now), now=now, hold=hold)


@dataclass(frozen=True)
class RoomBeingMade:
    """Kernels on a device asked to suspend so that a slice that did not fit fits: idle ones, or
    (``taken_back``) borrowing ones giving their room back to a kernel within its guarantee."""

    device_index: int
    kernels: int
    taken_back: bool = False

    def __str__(self) -> str:
        many = self.kernels > 1
        if self.taken_back:
            return (
                f"room borrowed above a guarantee on GPU {self.device_index} is being taken back for it "
                f"({self.kernels} borrowing kernel{'s are' if many else ' is'} being paused; their owners' servers "
                "do it within seconds)"
            )
        return (
            f"{self.kernels} idle kernel{'s' if many else ''} on GPU {self.device_index} "
            f"{'are' if many else 'is'} being suspended to make room (their owners' servers do it within seconds, "
            "and each resumes when a cell runs in it): try again in a few seconds"
        )


# -- guarantees and borrowing -------------------------------------------------------------------


def guarantees(budget: OwnerBudget | None) -> bool:
    """Whether ``budget`` guarantees its owner room (a classroom size: its memory and cores), which
    borrowers give back when the owner asks for it."""
    return budget is not None and (budget.guaranteed_memory is not None or budget.guaranteed_sm_share is not None)


def is_borrowing(budget: OwnerBudget | None, allocations: list[Allocation], owner: str, limits: SliceLimits) -> bool:
    """Whether a slice of ``limits`` would take ``owner`` past their guarantee, counting what
    their running (not suspended) slices hold on the devices."""
    return past_guarantee(budget, allocations, owner, limits.memory_limit, limits.sm_share)


def past_guarantee(
    budget: OwnerBudget | None, allocations: list[Allocation], owner: str, memory: int, sm_share: int
) -> bool:
    """Whether ``memory`` and ``sm_share`` more (a start's, a resume's, a growth's) would take
    ``owner`` past their guarantee, counting what their running slices hold."""
    if budget is None or not guarantees(budget):
        return False
    running = [item for item in allocations if item.owner == owner and not item.suspended]
    memory += sum(item.memory_limit for item in running)
    share = sum(item.sm_share for item in running) + sm_share
    over_memory = budget.guaranteed_memory is not None and memory > budget.guaranteed_memory
    return over_memory or (budget.guaranteed_sm_share is not None and share > budget.guaranteed_sm_share)


def taken_back(allocation: Allocation) -> bool:
    """Whether the slice's suspend request takes borrowed room back (mid-cell if need be)."""
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    return isinstance(request, dict) and request.get(TAKE_BACK_KEY) is True


def borrowed_at(allocation: Allocation) -> float | None:
    """When the slice began to borrow above its owner's guarantee (BORROWING_KEY), if it borrows."""
    mark = allocation.metadata.get(BORROWING_KEY)
    at = mark.get("at") if isinstance(mark, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def take_back_order(allocations: Iterable[Allocation], device_uuid: str) -> list[Allocation]:
    """The running local borrowing slices on a device, in the order their room is taken back:
    the most recent borrower first."""
    return sorted(
        (
            item
            for item in allocations
            if item.device_uuid == device_uuid
            and not item.suspended
            and item.holder == "local"
            and borrowed_at(item) is not None
        ),
        key=lambda item: (-(borrowed_at(item) or 0.0), -item.created_at),
    )


def take_back_reserve(allocations: list[Allocation], excluding: str = "") -> int:
    """The host memory kept for taking borrowed room back: each running borrowing slice's memory
    limit (the most its suspend can move there, whatever it holds now), but ``excluding``'s."""
    return sum(
        item.memory_limit
        for item in allocations
        if not item.suspended
        and item.holder == "local"
        and item.kernel_id != excluding
        and borrowed_at(item) is not None
    )


def never_fits(memory: int, capacity: int, where: str) -> str:
    """The one sentence for a start or a growth that can never fit, whatever waits: "Its 20GiB GPU
    slice can never fit: GPU 1 has 16GiB in all. Ask for 16GiB or less." (``where``: "GPU 1 has",
    or "the largest GPU here, GPU 1, has")."""
    most = format_size(capacity)
    return f"Its {format_size(memory)} GPU slice can never fit: {where} {most} in all. Ask for {most} or less."


# -- what a request waits for -------------------------------------------------------------------


def waiting_for_room(short: CapacityError, own_memory: int = 0, own_share: int = 0) -> str:
    """What a request in line waits for, from the refusal of its last attempt (and, where a
    broker is having other users' idle kernels suspended for it, that). ``own_memory`` and
    ``own_share``: what of the refusal's ``available`` is the request's own slice (a running
    slice's growth is refused with the room it could grow into, its own included), so that the
    free figure is the GPU's."""
    if short.resource == "line":
        return str(short)  # the broker's sentence: whose turn it is ("its turn: 2 requests ... wait ahead of it")
    if short.resource == "memory":
        missing, free = short.requested - short.available, max(0, short.available - own_memory)
        what = f"{format_size(missing)} more GPU memory ({format_size(free)} free)"
    elif short.resource == "sm_share":
        missing, free = short.requested - short.available, max(0, short.available - own_share)
        what = f"{missing} percent more of the SMs ({free} percent free)"
    elif short.resource == HOST_MEMORY:
        missing, free = short.requested - short.available, short.available
        what = (
            f"{format_size(missing)} more host memory to take its borrowed room back without a kill "
            f"({format_size(free)} free under idle.suspend_host_memory)"
        )
    else:
        what = str(short) or NOT_TRIED
    return f"{what}; {short.making_room}" if short.making_room else what


__all__ = [
    "HOST_MEMORY",
    "IDLE_STATE",
    "NEVER_ASKED_STATE",
    "RESUMED_AT",
    "ROOM_HOLD_S",
    "WOKEN_KEY",
    "Idle",
    "RoomBeingMade",
    "borrowed_at",
    "could_make_up",
    "fits",
    "got_room_at",
    "guarantees",
    "idle_candidates",
    "is_borrowing",
    "never_fits",
    "past_guarantee",
    "reported_idle",
    "requested_at",
    "room_for",
    "room_order",
    "runs_no_cell",
    "take_back_order",
    "take_back_reserve",
    "taken_back",
    "uses_gpu",
    "waiting_for_room",
    "woken_at",
]
