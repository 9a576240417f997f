"""The broker's lending: what a served ledger decides beyond admitting and releasing slices, by
the pool's policy (ledger/policy.py). A suspended slice's room is lent only once NVML shows its
processes hold none and within the node's host memory cap; a start or resume that does not fit
asks idle kernels' servers to suspend them (:meth:`Lending.request_room`); one within its owner's
guarantee takes borrowed room back (:meth:`Lending.take_back`) and has it held for it; a resume
behind the line may have the room the swap at the host memory cap makes (:meth:`Lending.may_pass_the_line`).

No HTTP here: ledger/service.py's handlers call these in worker threads.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_vgpu.ledger.base import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    ROOM_FOR_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    TAKE_BACK_KEY,
    Admission,
    Allocation,
    CapacityError,
    Ledger,
    OwnerBudget,
    UnknownSlice,
)
from jupyter_vgpu.ledger.policy import (
    HOST_MEMORY,
    RoomBeingMade,
    borrowed_at,
    idle_candidates,
    is_borrowing,
    past_guarantee,
    reported_idle,
    requested_at,
    room_for,
    take_back_order,
    take_back_reserve,
    taken_back,
    uses_gpu,
)
from jupyter_vgpu.model import SliceLimits, format_size, select_device

# The pids of a slice's processes that a device still lists (any device), each with the bytes
# NVML says it holds there (None: NVML does not say). Read afresh at each call.
StillHeld = Callable[[Allocation], Mapping[int, int | None]]


@dataclass(frozen=True)
class Room:
    """Room a request asks a device for where it is not a whole slice (a growth: what it grows by,
    which may be no memory or no SM share), in SliceLimits' terms."""

    memory_limit: int
    sm_share: int
    policy: str


class NotLent(Exception):
    """A suspend whose room is not lent; the slice stays as it was (running)."""


@dataclass(frozen=True)
class Claim:
    """Room held for a kernel: taken back from borrowers for one within its owner's guarantee, or
    freed by the swap for a resume behind the line (what its paired suspends have freed so far)."""

    device_uuid: str
    memory: int
    sm_share: int
    at: float


@dataclass
class Lending:
    """What a served ledger checks before it lends a suspended slice's room (the broker's rules).

    ``still_held``: where given, a suspend is refused while NVML lists any process of the slice on
    a device (the user's server checkpoints its kernel's processes; the service does not lend on
    its word). ``host_memory_cap``: where given, the bytes all suspended slices of the ledger may
    hold in host memory together; a suspend past it is refused, but for one the broker asked for to
    make room for a suspended kernel's resume (a swap), which may go past it by that kernel's host
    memory (see :meth:`suspend`). Room is lent only where it can be taken back: under the cap, host
    memory is kept for every borrowing slice's take-back (:func:`take_back_reserve`), so a slice
    borrows only where that room is there, and other suspends leave it free. Without a Lending (the
    one-token service of trusted servers), a suspend is recorded as its client says."""

    still_held: StillHeld | None = None
    host_memory_cap: int | None = None
    # Told of each slice lent (True) and taken back (False), after the ledger's decision (the
    # broker raises its limits page's suspended flag).
    on_change: Callable[[Allocation, bool], None] | None = None
    # Where True (the broker), a start or resume that does not fit asks the servers of idle
    # kernels (any user's) to suspend them (request_room).
    make_room: bool = False
    clock: Callable[[], float] = time.time
    # Seconds after a kernel got its room during which request_room does not ask for it again
    # (the pool's hold, ledger/policy.py; the broker uses ROOM_HOLD_S). A take-back ignores it.
    hold: float = 0.0
    # Told when a borrowing kernel is asked to give its room back (True) and when that request
    # lapses unanswered (False): the broker raises its limits page's suspended flag at once, so
    # that the kernel's CUDA calls wait in libvgpu.so and its GPU work drains before the lock.
    on_take_back: Callable[[Allocation, bool], None] | None = None
    # One check-then-mark at a time, so two suspends cannot both fit under the cap.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Room that borrowed slices give back, held for the kernels within their guarantee it is
    # taken back for (by kernel id), so that no borrower takes it first.
    _claims: dict[str, Claim] = field(default_factory=dict, repr=False)
    # Room that idle kernels' suspends make by the swap alone (suspends the cap allows only as
    # room for a resume) for a resume that waits behind older requests of the node's line, held
    # for it (by kernel id) from everyone else: those requests could not have been given it.
    _swaps: dict[str, Claim] = field(default_factory=dict, repr=False)

    def suspend(self, ledger: Ledger, kernel_id: str, host_memory: int, details: dict[str, Any] | None) -> Allocation:
        """Check, then mark the slice suspended (blocks: NVML and the ledger file)."""
        with self._lock:
            current = ledger.get(kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            if current.suspended:
                return current
            if self.still_held is not None:
                held = self.still_held(current)
                if held:
                    shown = ", ".join(
                        f"pid {pid} ({'an amount NVML does not say' if used is None else format_size(used)})"
                        for pid, used in sorted(held.items())
                    )
                    raise NotLent(
                        f"kernel {kernel_id!r} is not suspended: NVML lists its processes on the GPU still ({shown}); "
                        "the broker lends a slice's memory only once its processes hold none (checkpointed to "
                        "host memory by the user's server), so the slice keeps running"
                    )
            if self.host_memory_cap is not None:
                allocations = ledger.allocations()
                in_host = sum(allocation.host_memory for allocation in allocations)
                swap = self._swap_allowance(ledger, current)
                # A take-back uses the room kept for it; any other suspend leaves that room free.
                reserve = 0 if taken_back(current) else take_back_reserve(allocations, excluding=kernel_id)
                if in_host + reserve + host_memory > self.host_memory_cap + swap:
                    paired = f" (plus {format_size(swap)} that the resume it makes room for gives back)" if swap else ""
                    kept = (
                        f", {format_size(reserve)} of the rest is kept for taking borrowed room back" if reserve else ""
                    )
                    raise NotLent(
                        f"kernel {kernel_id!r} is not suspended: suspended kernels of this node hold "
                        f"{format_size(in_host)} of host memory and may hold {format_size(self.host_memory_cap)} "
                        f"together (idle.suspend_host_memory){paired}{kept}; its {format_size(host_memory)} would "
                        "not fit, so it keeps running and is stopped when idle longer instead"
                    )
            suspended = ledger.suspend(kernel_id, host_memory=host_memory, details=details)
            resumer = room_for(current) or ""
            making = self._swaps.get(resumer)
            if making is not None and making.device_uuid == current.device_uuid:  # the room it frees is that resume's
                self._swaps[resumer] = replace(
                    making, memory=making.memory + current.memory_limit, sm_share=making.sm_share + current.sm_share
                )
            if suspended.metadata.get(SUSPEND_REQUESTED_KEY) is not None:
                suspended = ledger.update_metadata(kernel_id, **{SUSPEND_REQUESTED_KEY: None})  # carried out
            if self.on_change is not None:
                self.on_change(suspended, True)
            return suspended

    def _swap_allowance(self, ledger: Ledger, current: Allocation) -> int:
        """The host memory a suspend may take past the cap: where the broker asked for it to make
        room for a suspended kernel's resume (a swap, ROOM_FOR_KEY), that kernel's host memory, which
        its resume gives back, so that once both are done host memory is within the cap. Nothing
        where the request timed out or the resumer is no longer suspended (resumed, or stopped)."""
        resumer_id, asked = room_for(current), requested_at(current)
        if resumer_id is None or asked is None or self.clock() - asked > SUSPEND_REQUEST_TIMEOUT_S:
            return 0
        resumer = ledger.get(resumer_id)
        return resumer.host_memory if resumer is not None and resumer.suspended else 0

    def resume(self, ledger: Ledger, kernel_id: str) -> Allocation:
        """Admit a suspended slice again (see Ledger.resume), then tell ``on_change``. Its activity
        report is dropped: it was made before the suspend, and the kernel resumes because it is
        active again (a cell, a CUDA call, its user back), so the stale report would make it the
        longest-idle kernel that :meth:`request_room` asks first, whose server will not suspend it
        (the request lapses only at its server's next report). Its server reports again at its
        next tick."""
        with self._lock:
            was = ledger.get(kernel_id)
            resumed = ledger.resume(kernel_id)
            if was is not None and was.suspended:
                if resumed.metadata.get(ACTIVITY_KEY) is not None:
                    resumed = ledger.update_metadata(kernel_id, **{ACTIVITY_KEY: None})
                if self.on_change is not None:
                    self.on_change(resumed, False)
            return resumed

    def request_room(
        self, ledger: Ledger, limits: SliceLimits, device: int | str | None, exclude: str, *, swap_only: bool = False
    ) -> RoomBeingMade | None:
        """Where suspending idle kernels (any owner's, longest idle first, never one running a cell
        nor one whose server reports no activity) would make room for a slice of ``limits`` on a
        device (``device`` where one is named), ask their servers to: a suspend request on each
        slice, which their servers carry out at their next check. Within the host memory cap,
        counting each kernel at its memory limit (the most it can move there), or at nothing where
        its server reports it holds nothing on the GPU (it is only lent). Where ``exclude`` is a
        suspended slice (a resume), the cap counts with the host memory its resume gives back, and
        each request names it (ROOM_FOR_KEY): the swap :meth:`suspend` allows. ``swap_only``: for
        such a resume that waits behind older requests of the node's line, only kernels whose
        suspend the cap allows for the swap alone (room no request ahead could be given), and that
        room is held for the resume (see :meth:`may_pass_the_line`). What is being made, or None."""
        if not self.make_room:
            return None
        with self._lock:
            now = self.clock()
            named = None if device is None else select_device(ledger.devices, device).uuid
            allocations = ledger.allocations()
            in_host = sum(allocation.host_memory for allocation in allocations) + take_back_reserve(allocations)
            resumer = next((item for item in allocations if item.kernel_id == exclude and item.suspended), None)
            swap = 0 if resumer is None else resumer.host_memory
            if swap_only and (resumer is None or self.host_memory_cap is None):
                return None
            # What a suspend nobody paired may still move to host memory.
            unpaired = math.inf if self.host_memory_cap is None else self.host_memory_cap - in_host
            for usage in ledger.devices_usage():
                if named not in (None, usage.device.uuid):
                    continue
                memory = limits.memory_limit - usage.memory_free
                share = limits.sm_share - usage.share_free(limits.policy)
                chosen = []
                host = math.inf if self.host_memory_cap is None else self.host_memory_cap - in_host + swap
                for candidate in idle_candidates(allocations, usage.device.uuid, exclude, now, self.hold):
                    if memory <= 0 and share <= 0:
                        break
                    # What its suspend moves to host memory, at most: nothing for one only lent,
                    # and nothing more than is kept for it where it borrows.
                    moved = candidate.memory_limit if uses_gpu(candidate) else 0
                    if borrowed_at(candidate) is not None and candidate.holder == "local":
                        moved = 0
                    if moved > host:
                        continue  # its suspend would be refused
                    if swap_only and (moved <= unpaired or room_for(candidate) not in (None, exclude)):
                        continue  # room a request ahead could be given, or another resume's
                    host -= moved
                    chosen.append(candidate)
                    memory, share = memory - candidate.memory_limit, share - candidate.sm_share
                if not chosen or memory > 0 or share > 0:
                    continue
                for candidate in chosen:
                    asked = candidate.metadata.get(SUSPEND_REQUESTED_KEY)
                    request: dict[str, Any] = dict(asked) if isinstance(asked, dict) else {}
                    if requested_at(candidate) is None:
                        request = {"at": now}
                    elif resumer is None or room_for(candidate) is not None:
                        continue  # asked already, for this resume or another's
                    if resumer is not None:
                        request = {**request, ROOM_FOR_KEY: resumer.kernel_id}
                    ledger.update_metadata(candidate.kernel_id, **{SUSPEND_REQUESTED_KEY: request})
                if swap_only:  # nothing is held until its paired suspends free it (see suspend)
                    held = self._swaps.get(exclude)
                    memory, share = (held.memory, held.sm_share) if held is not None else (0, 0)
                    self._swaps[exclude] = Claim(usage.device.uuid, memory, share, now)
                return RoomBeingMade(usage.device.index, len(chosen))
            return None

    def may_pass_the_line(self, kernel_id: str) -> bool:
        """Whether room is held for the resume of ``kernel_id`` (suspends paired with it by
        ``swap_only`` freed some), so that it may be admitted before older requests of the node's
        line, which could not have been given that room."""
        with self._lock:
            self._drop_lapsed_claims(self.clock())
            held = self._swaps.get(kernel_id)
            return held is not None and (held.memory > 0 or held.sm_share > 0)

    def ran_again(self, ledger: Ledger, allocation: Allocation) -> Allocation:
        """Withdraw the suspend request of a slice whose kernel ran (or runs a cell) since it was
        asked, as its server's latest activity report says."""
        with self._lock:
            asked = requested_at(allocation)
            activity = allocation.metadata.get(ACTIVITY_KEY)
            if asked is None or not isinstance(activity, dict) or taken_back(allocation):
                return allocation  # borrowed room is taken back whether its kernel runs or not
            # Idle as its server last reported, and not active since it was asked (read at the time
            # it was asked: a request that lapsed since is still this kernel's, not another's).
            idle = reported_idle(allocation, asked)
            if idle is not None and idle.last_active <= asked:
                return allocation
            return ledger.update_metadata(allocation.kernel_id, **{SUSPEND_REQUESTED_KEY: None})

    # -- guarantees and borrowing -------------------------------------------------------------

    def admit(self, ledger: Ledger, admission: Admission) -> Allocation:
        """Admit a slice (Ledger.admit); where it takes its owner past their guarantee, only into
        room no kernel within its guarantee is owed (see :meth:`take_back`), marked as borrowing."""
        # Only the service marks a slice as borrowing, whatever a client's metadata says.
        if admission.metadata and BORROWING_KEY in admission.metadata:
            unmarked = {name: value for name, value in admission.metadata.items() if name != BORROWING_KEY}
            admission = replace(admission, metadata=unmarked)
        with self._lock:
            now = self.clock()
            self._drop_lapsed_claims(now)
            limits = admission.limits
            if not is_borrowing(admission.budget, ledger.allocations(), admission.owner, limits):
                device = self._unheld_device(ledger, limits, admission.device, admission.kernel_id, borrowing=False)
                allocation = ledger.decide_admission(replace(admission, device=device))
                self._claims.pop(admission.kernel_id, None)
                return allocation
            if admission.holder == "local":
                self._check_room_to_take_back(ledger, limits.memory_limit)
            device = self._unheld_device(ledger, limits, admission.device, admission.kernel_id, borrowing=True)
            metadata = {**(admission.metadata or {}), BORROWING_KEY: {"at": now}}
            return ledger.decide_admission(replace(admission, device=device, metadata=metadata))

    def resize_within(
        self,
        ledger: Ledger,
        kernel_id: str,
        budget: OwnerBudget | None,
        *,
        memory_limit: int | None = None,
        sm_share: int | None = None,
        policy: str | None = None,
    ) -> Allocation:
        """Ledger.resize, where a running slice's growth may not take room held for others: room
        the swap at the host memory cap makes for a suspended kernel's resume, from every growth;
        room taken back for a kernel within its guarantee, from a growth past its owner's."""
        with self._lock:
            self._drop_lapsed_claims(self.clock())
            current = ledger.get(kernel_id)
            if current is not None and not current.suspended:
                grows = Room(
                    max(0, (memory_limit or current.memory_limit) - current.memory_limit),
                    max(0, (sm_share or current.sm_share) - current.sm_share),
                    policy or current.policy,
                )
                if grows.memory_limit or grows.sm_share:
                    borrowing = past_guarantee(
                        budget, ledger.allocations(), current.owner, grows.memory_limit, grows.sm_share
                    )
                    self._unheld_device(ledger, grows, current.device_uuid, kernel_id, borrowing=borrowing)
            return ledger.resize(kernel_id, memory_limit=memory_limit, sm_share=sm_share, policy=policy, budget=budget)

    def resume_within(self, ledger: Ledger, kernel_id: str, budget: OwnerBudget | None) -> Allocation:
        """:meth:`resume`, where a resume past its owner's guarantee is admitted only into room no
        kernel within its guarantee is owed, and marked as borrowing (or no longer)."""
        with self._lock:
            now = self.clock()
            self._drop_lapsed_claims(now)
            current = ledger.get(kernel_id)
            borrowing = False
            if current is not None and current.suspended:
                borrowing = is_borrowing(budget, ledger.allocations(), current.owner, current.limits)
                if borrowing and current.holder == "local":
                    self._check_room_to_take_back(ledger, current.memory_limit, gives_back=current.host_memory)
                self._unheld_device(ledger, current.limits, current.device_uuid, kernel_id, borrowing=borrowing)
        resumed = self.resume(ledger, kernel_id)
        with self._lock:
            self._claims.pop(kernel_id, None)
            self._swaps.pop(kernel_id, None)
            if borrowing or resumed.metadata.get(BORROWING_KEY) is not None:
                resumed = ledger.update_metadata(kernel_id, **{BORROWING_KEY: {"at": now} if borrowing else None})
            return resumed

    def _check_room_to_take_back(self, ledger: Ledger, memory: int, gives_back: int = 0) -> None:
        """Raise CapacityError where the host memory cap has no room to take a borrowing slice of
        ``memory`` back (what suspended slices hold, less ``gives_back``, a resume's own, plus what
        is kept for the borrowing slices' take-backs): it waits, as for room on a GPU, until a
        suspended slice resumes or a borrower gives its room back."""
        if self.host_memory_cap is None:
            return
        allocations = ledger.allocations()
        in_host = sum(item.host_memory for item in allocations) - gives_back
        reserve = take_back_reserve(allocations)
        free = max(0, self.host_memory_cap - in_host - reserve)
        if memory > free:
            raise CapacityError(
                f"the {format_size(memory)} slice is above its owner's guarantee and borrows only room that can be "
                f"taken back without a kill: its suspend would move up to {format_size(memory)} to host memory, "
                f"where suspended kernels hold {format_size(in_host)} and {format_size(reserve)} is kept for the "
                f"borrowers' take-backs, of the {format_size(self.host_memory_cap)} they may hold "
                f"(idle.suspend_host_memory); {format_size(free)} is free",
                resource=HOST_MEMORY,
                requested=memory,
                available=free,
            )

    def _unheld_device(
        self, ledger: Ledger, limits: SliceLimits | Room, device: int | str | None, kernel_id: str, *, borrowing: bool
    ) -> Any:
        """The device a slice of ``limits`` may go to: ``device`` (None: where the ledger places
        it) where no room is held for another kernel, else one that has room beside what is held;
        raises CapacityError where none has. Room the swap makes for a resume is held from every
        other slice; room taken back for a kernel within its guarantee, from ``borrowing`` ones."""
        held = [claim for claimant, claim in self._swaps.items() if claimant != kernel_id]
        if borrowing:
            held += [claim for claimant, claim in self._claims.items() if claimant != kernel_id]
        if not held:
            return device
        if borrowing:
            why = (
                f"the {format_size(limits.memory_limit)} slice is above its owner's guarantee and borrows only room "
                "nobody within a guarantee needs"
            )
            whom = "a kernel within its owner's guarantee"
        else:
            why = f"the {format_size(limits.memory_limit)} slice does not fit beside room held for others"
            whom = "a suspended kernel's resume (the swap at the host memory cap)"
        named = None if device is None else select_device(ledger.devices, device).uuid
        fitting = []
        for usage in ledger.devices_usage():
            if named not in (None, usage.device.uuid):
                continue
            memory = sum(claim.memory for claim in held if claim.device_uuid == usage.device.uuid)
            share = sum(claim.sm_share for claim in held if claim.device_uuid == usage.device.uuid)
            if usage.memory_free - memory >= limits.memory_limit and usage.share_free(limits.policy) - share >= (
                limits.sm_share
            ):
                fitting.append(usage)
            elif named is not None or len(ledger.devices) == 1:
                free = max(0, usage.memory_free - memory)
                raise CapacityError(
                    f"{why}: {format_size(memory)} on GPU {usage.device.index} is held for {whom}, "
                    f"{format_size(free)} is free beside it",
                    resource="memory",
                    requested=limits.memory_limit,
                    available=free,
                )
        if not fitting:
            raise CapacityError(
                f"{why}: every GPU's free room is held for others",
                resource="memory",
                requested=limits.memory_limit,
                available=0,
            )
        # The fullest device it fits on, as binpack would; the ledger checks it again.
        return min(fitting, key=lambda usage: (usage.memory_free, usage.device.index)).device.index

    def _drop_lapsed_claims(self, now: float) -> None:
        for held in (self._claims, self._swaps):
            for claimant, claim in list(held.items()):
                if now - claim.at > SUSPEND_REQUEST_TIMEOUT_S:
                    del held[claimant]

    def take_back(
        self, ledger: Ledger, limits: SliceLimits, device: int | str | None, claimant: str
    ) -> RoomBeingMade | None:
        """Where the borrowed room on a device (``device`` where one is named) would make room for
        ``claimant``'s slice of ``limits`` (within its owner's guarantee), ask the servers of the
        borrowing kernels there, most recent borrowing first, to suspend them even while they run
        a cell, and hold the room they give back for ``claimant``; where ``claimant`` is suspended
        (a resume), each request names it (ROOM_FOR_KEY), so that the borrower's suspend may go past
        the host memory cap by what that resume gives back. Room already being made there
        (kernels asked to suspend and not yet suspended) counts. A borrower is asked even where the
        host memory cap would refuse its suspend now: its server tries again at each tick while the
        request lasts, and host memory frees as others resume. Where nothing can be taken back, the room that frees next on the device closest to fitting it is held
        for ``claimant`` all the same: it waits, and no borrower takes that room first. What is
        being taken back, or None."""
        if not self.make_room:
            return None
        with self._lock:
            now = self.clock()
            self._lapse_take_backs(ledger, now)
            named = None if device is None else select_device(ledger.devices, device).uuid
            allocations = ledger.allocations()
            usages = [usage for usage in ledger.devices_usage() if named in (None, usage.device.uuid)]
            for usage in usages:
                uuid = usage.device.uuid
                memory = limits.memory_limit - usage.memory_free
                share = limits.sm_share - usage.share_free(limits.policy)
                here = [item for item in allocations if item.device_uuid == uuid and not item.suspended]
                asked = [item for item in here if requested_at(item) is not None]
                for item in asked:
                    memory, share = memory - item.memory_limit, share - item.sm_share
                borrowers = take_back_order(here, uuid)
                chosen = []
                for borrower in borrowers:
                    if memory <= 0 and share <= 0:
                        break
                    if borrower in asked or borrower.kernel_id == claimant:
                        continue
                    chosen.append(borrower)
                    memory, share = memory - borrower.memory_limit, share - borrower.sm_share
                if memory > 0 or share > 0 or not (chosen or any(taken_back(item) for item in asked)):
                    continue
                resumer = next((item for item in allocations if item.kernel_id == claimant and item.suspended), None)
                for borrower in chosen:
                    request: dict[str, Any] = {"at": now, TAKE_BACK_KEY: True, "device_index": usage.device.index}
                    if resumer is not None:
                        request[ROOM_FOR_KEY] = claimant  # the swap: see suspend
                    asked_now = ledger.update_metadata(borrower.kernel_id, **{SUSPEND_REQUESTED_KEY: request})
                    if self.on_take_back is not None:
                        self.on_take_back(asked_now, True)
                self._claims[claimant] = Claim(uuid, limits.memory_limit, limits.sm_share, now)
                taking = len(chosen) or sum(taken_back(item) for item in asked)
                return RoomBeingMade(usage.device.index, taking, taken_back=True)
            if usages:
                closest = max(usages, key=lambda usage: (usage.memory_free, -usage.device.index))
                self._claims[claimant] = Claim(closest.device.uuid, limits.memory_limit, limits.sm_share, now)
            return None

    def lapse_take_backs(self, ledger: Ledger) -> list[Allocation]:
        """Withdraw the take-back requests that their servers did not carry out within
        SUSPEND_REQUEST_TIMEOUT_S (their kernels' calls go on); returns the withdrawn."""
        with self._lock:
            return self._lapse_take_backs(ledger, self.clock())

    def _lapse_take_backs(self, ledger: Ledger, now: float) -> list[Allocation]:
        lapsed = []
        for allocation in ledger.allocations():
            asked = requested_at(allocation)
            if allocation.suspended or not taken_back(allocation) or asked is None:
                continue
            if now - asked > SUSPEND_REQUEST_TIMEOUT_S:
                withdrawn = ledger.update_metadata(allocation.kernel_id, **{SUSPEND_REQUESTED_KEY: None})
                if self.on_take_back is not None:
                    self.on_take_back(withdrawn, False)
                lapsed.append(withdrawn)
        return lapsed


__all__ = ["Claim", "Lending", "NotLent", "StillHeld"]
