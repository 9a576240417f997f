"""Suspending idle kernels to host memory (issue 18), the server's side: which kernel is
suspended when, and when a suspended one is resumed.

- Resume on demand: at every tick of the slice watcher, a suspended kernel that is busy (a cell
  runs: jupyter_server's ``execution_state``, the same reading the idle policy uses) or whose
  processes made a CUDA call since it was suspended (the interposer counts resume requests on the
  limits page; the call itself waits in the driver) is resumed. Where its room on the device is
  taken, other idle kernels there are suspended to make room (least recently active first, never
  one running a cell); where that is not enough it keeps waiting, its notice says for what, and
  the next tick tries again.
- Idle step: the idle policy (server/idle.py) asks :meth:`SuspendedKernels.suspend_idle` to
  suspend a kernel idle for ``suspend_after`` seconds, between lowering and culling; where the
  kernel cannot be suspended (the probe's reasons, a busy process, the host-memory cap) the
  notice says why and the policy goes on to culling.

The blocking parts (lock, checkpoint, restore) run in worker threads, never the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from jupyter_vgpu.client import slice_name
from jupyter_vgpu.holders.checkpoint import CheckpointError
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.ledger import (
    SUSPEND_TIMINGS_KEY,
    SUSPENDED_KEY,
    Allocation,
    CapacityError,
    NotSupported,
    UnknownSlice,
)
from jupyter_vgpu.ledger.policy import (
    ROOM_HOLD_S,
    WOKEN_KEY,
    Idle,
    could_make_up,
    got_room_at,
    room_order,
    waiting_for_room,
)
from jupyter_vgpu.line import Place, Request
from jupyter_vgpu.manager import (
    DEVICE_ROOM,
    FOR_WHOM_LABEL,
    IN_LINE_KEY,
    ORPHANED_KEY,
    RESIZE_WAITING_KEY,
    RoomWanted,
    SliceManager,
)
from jupyter_vgpu.model import format_size
from jupyter_vgpu.server.idle import SUSPEND_NOTICE_KEY, format_duration, known_idle
from jupyter_vgpu.server.sessions import session_paths

# Where the handlers find VGPUApp.suspend_lock_timeout (seconds a process may take to finish its
# GPU work before a suspend leaves the kernel running).
SUSPEND_LOCK_TIMEOUT_SETTING = "jupyter_vgpu_suspend_lock_timeout"
# Where the slice watcher finds the server's SuspendedKernels.
SUSPEND_SETTING = "jupyter_vgpu_suspended_kernels"
# The most kernels a waiting kernel's notice names as holding its room ("and 4 more" after them).
NAMED_HOLDERS = 3


class SuspendedKernels:
    """Suspends idle kernels and resumes them on demand, for one server's kernel manager."""

    def __init__(
        self,
        slices: SliceManager,
        kernels: Any,
        *,
        suspend_after: float = 0.0,
        lock_timeout: float = 5.0,
        host_memory_cap: int | None = None,
        hold: float = ROOM_HOLD_S,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        sessions: Any = None,
    ):
        self.slices = slices
        self.kernels = kernels  # jupyter_server's MappingKernelManager
        self.sessions = sessions  # jupyter_server's SessionManager: the notebooks notices name kernels by
        self.suspend_after = suspend_after
        self.lock_timeout = lock_timeout
        self.host_memory_cap = host_memory_cap
        # Seconds after a kernel got its room during which room-making leaves it alone (VGPUApp.room_hold).
        self.hold = hold
        self.log = log or logging.getLogger(__name__)
        # What was last logged of each kernel, by topic: a wait retried at every pass of the line
        # (several a second) logs at INFO only when what it says changes, at DEBUG otherwise.
        self._said: dict[tuple[str, str], str] = {}
        # Seconds the last suspend of this server took per byte it moved to host memory (None
        # until one moved something): what a wait for room made by suspending is estimated by.
        self.suspend_seconds_per_byte: float | None = None
        # When the idle policy stops a running kernel (IdleKernels.stop_deadline), where it has one.
        self.stop_deadline: Callable[[Allocation], float | None] | None = None

    # -- resume on demand ----------------------------------------------------------------------

    async def check(self, allocations: list[Allocation]) -> None:
        """Put the suspended kernels that asked to resume in the line (one pass of the slice
        watcher; the line then serves them in order, with the starts), and the growths that
        waited in line when the last server stopped (RESIZE_WAITING_KEY)."""
        for listed in allocations:
            if listed.kernel_id in self.kernels and isinstance(listed.metadata.get(RESIZE_WAITING_KEY), dict):
                await self.slices.rejoin_resize(listed)
        for listed in allocations:
            kernel_id = listed.kernel_id
            ours = kernel_id in self.kernels
            # A kernel kept after it outlived the last server (manager.py's ORPHANED_KEY) is not
            # this server's, and is reached through its connection file: its CUDA calls resume it.
            if not listed.suspended or not (ours or isinstance(listed.metadata.get(ORPHANED_KEY), dict)):
                continue
            if kernel_id in self.slices.line:
                continue
            busy = ours and self._busy(kernel_id)
            if not (busy or _left_line(listed) or self.slices.suspender.resume_requested(listed)):
                continue
            # The watcher read the ledger before this pass: its user may have interrupted the wait
            # since (SliceManager.leave_line), which only the slice as it is now says.
            allocation = self.slices.ledger.get(kernel_id)
            if allocation is None or not allocation.suspended:
                continue
            if _left_line(allocation):
                # Its user interrupted the wait: nothing lines it up again while the interrupted
                # cell still ends; once the kernel is idle, what its processes asked so far counts
                # as answered, and its next cell (or a CUDA call after) lines it up.
                if not busy:
                    with contextlib.suppress(UnknownSlice):
                        self.slices.suspender.answer_requests(allocation, **{IN_LINE_KEY: None})
                continue
            if busy or self.slices.suspender.resume_requested(allocation):
                self.join_line(allocation)

    def join_line(self, allocation: Allocation, *, why: str = "a kernel that ran again") -> Request:
        """Put a suspended kernel in the line to take its room back; its place (the time it first
        asked, kept in the ledger) survives a server restart. ``why``: for whom the kernels
        suspended to make its room are told they were (their notice)."""
        kernel_id = allocation.kernel_id
        existing = self.slices.line.get(kernel_id)
        if existing is not None:
            return existing
        in_line = allocation.metadata.get(IN_LINE_KEY)
        since = float(in_line["since"]) if isinstance(in_line, dict) and "since" in in_line else time.time()
        if not (isinstance(in_line, dict) and "since" in in_line):
            with contextlib.suppress(UnknownSlice):
                self.slices.ledger.update_metadata(kernel_id, **{IN_LINE_KEY: {"since": since}})

        async def attempt() -> bool:
            try:
                current = self.slices.get(kernel_id)
                if not current.suspended:
                    return True  # resumed by hand meanwhile
                await asyncio.to_thread(self.slices.resume, kernel_id)
            except CapacityError as short:
                if short.resource not in DEVICE_ROOM:
                    raise
                request.short = short
                request.waiting_for = await self._waiting(allocation, short)
                self._notice(allocation, request.waiting_for)
                return False
            except CheckpointError as failed:
                # Rolled back to suspended (holders/suspender.py): it keeps its place and is tried again.
                self.log.warning("jupyter_vgpu: %s", failed)
                request.waiting_for = "its last restore failed; trying again"
                self._notice(allocation, f"not resumed yet: its last restore failed ({failed.__cause__}); trying again")
                return False
            self._resumed(kernel_id)
            return True

        request = Request(
            kernel_id,
            "resume",
            allocation.memory_limit,
            allocation.sm_share,
            allocation.device_uuid,
            attempt,
            since=since,
            policy=allocation.policy,
            labels={FOR_WHOM_LABEL: why},
        )
        return self.slices.line.join(request)

    def wake(self, kernel_id: str) -> Allocation:
        """The user turned to the kernel: where it is suspended (or lent), put it in the line to
        resume now, ahead of its next cell. The time is kept (WOKEN_KEY), so that the idle policy
        and room making count the kernel as active from then: a sign not followed by a cell lets
        it be suspended again once it has been idle that long, as any kernel. Raises UnknownSlice."""
        allocation = self.slices.ledger.update_metadata(kernel_id, **{WOKEN_KEY: {"at": time.time()}})
        if allocation.suspended and allocation.holder == "local":
            self.join_line(allocation, why="a kernel its user opened")
        return allocation

    def show_place(self, request: Request, place: Place) -> None:
        """Tell a suspended kernel's processes where its request stands (the line's
        ``published``): libvgpu.so prints it in the output of the cell that waits."""
        if request.kind != "resume":
            return
        with contextlib.suppress(UnknownSlice, KeyError):
            allocation = self.slices.get(request.kernel_id)
            holder = self.slices.holder(allocation)
            if isinstance(holder, LocalHolder):
                holder.show_place(allocation, place.position, place.eta_seconds)

    def _resumed(self, kernel_id: str) -> None:
        self._forget_said(kernel_id)
        with contextlib.suppress(UnknownSlice):
            self.slices.ledger.update_metadata(kernel_id, **{IN_LINE_KEY: None, SUSPEND_NOTICE_KEY: None})
        self.log.info("jupyter_vgpu: kernel %s resumed", kernel_id)

    async def resume(self, allocation: Allocation, allocations: list[Allocation] | None = None) -> bool:
        """Resume a suspended kernel now, making room by suspending idle kernels on its device where
        needed; False (with the reason in its notice) where it must wait (it then keeps its place
        in the line, if it has one)."""
        kernel_id = allocation.kernel_id
        try:
            await asyncio.to_thread(self.slices.resume, kernel_id)
        except CapacityError as short:
            if short.resource not in DEVICE_ROOM or not await self._make_room(allocation, short, allocations):
                self._notice(allocation, await self._waiting(allocation, short))
                return False
            try:
                await asyncio.to_thread(self.slices.resume, kernel_id)
            except CapacityError as still:
                self._notice(allocation, await self._waiting(allocation, still))
                return False
        self.slices.line.leave(kernel_id, "resumed")
        self._resumed(kernel_id)
        return True

    async def _make_room(
        self, allocation: Allocation, short: CapacityError, allocations: list[Allocation] | None
    ) -> bool:
        """Suspend idle kernels on the device of ``allocation`` until it could resume there;
        whether it could."""

        def fits() -> bool:
            usages = self.slices.ledger.devices_usage()
            usage = next((usage for usage in usages if usage.device.uuid == allocation.device_uuid), None)
            return usage is not None and usage.fits(allocation.limits)

        wanted = RoomWanted(
            fits, allocation.device_uuid, "a kernel that ran again", exclude=allocation.kernel_id, short=short
        )
        return await self.make_room(wanted, allocations)

    async def make_room(self, wanted: RoomWanted, allocations: list[Allocation] | None = None) -> bool:
        """Suspend this server's idle kernels on ``wanted``'s device (longest idle first, never one
        running a cell, never the kernel that wants the room) until ``wanted.fits()``; whether it
        does. Nothing is suspended where all of them together would not make up what
        ``wanted.short`` says is missing. One loop for kernel starts, resizes and resumes."""
        if wanted.fits():
            return True  # the room is there: what holds it back is not room (nothing to suspend)
        if allocations is None:
            allocations = self.slices.ledger.allocations()
        candidates = self._idle_on_device(wanted.device_uuid, allocations, exclude=wanted.exclude)
        if wanted.short is not None and not could_make_up(wanted.short, candidates):
            return False
        for candidate in candidates:
            if self._idle(candidate) is None:
                continue  # a cell began in it while others were suspended: never one that runs a cell
            if await self._suspend_to_make_room(candidate, wanted.for_whom) is not None and wanted.fits():
                return True
        return False

    async def suspend_for_others(self, allocation: Allocation) -> bool:
        """Suspend an idle kernel the node's broker asked for, to make room for another user's
        kernel (server/room.py); whether it is suspended."""
        return await self._suspend_to_make_room(allocation, "another user's kernel") is not None

    async def give_back_borrowed(self, allocation: Allocation) -> bool:
        """Suspend a kernel whose borrowed room the node's broker takes back for a kernel within
        its owner's guarantee, even one running a cell (its calls wait in libvgpu.so, so its GPU
        work drains within the lock's timeout); whether it is suspended. Its cell carries on when
        it is resumed (it is busy, so it joins the line at once)."""
        why = taken_back_notice(allocation)
        return await self._suspend_to_make_room(allocation, "", notice=why) is not None

    async def _suspend_to_make_room(
        self, candidate: Allocation, for_whom: str, *, notice: str = ""
    ) -> Allocation | None:
        """Suspend ``candidate`` to make room for ``for_whom``, telling its user so (``notice``
        where given); None (logged) where it cannot be suspended."""
        try:
            suspended = await asyncio.to_thread(
                self.slices.suspend, candidate.kernel_id, lock_timeout=self.lock_timeout
            )
        except (NotSupported, CheckpointError, UnknownSlice) as why:
            self._say(candidate.kernel_id, "room", f"not suspended to make room: {why}")
            return None
        self._forget_said(candidate.kernel_id)
        self._measured(suspended)
        self._notice(suspended, notice or suspended_notice(f"suspended to make room for {for_whom}", suspended))
        return suspended

    def _idle_on_device(
        self, device_uuid: str | None, allocations: list[Allocation], *, exclude: str
    ) -> list[Allocation]:
        """This server's kernels that may make room on the device (any, where none is named), in
        the pool's order (ledger/policy.py's ``room_order``): known to run no cell, not one that
        got its room within ``hold`` seconds, those that have not used the GPU first (lending their
        room loses nothing), then the others, least recently active first."""
        return room_order(allocations, device_uuid, exclude, self._idle, now=time.time(), hold=self.hold)

    def _idle(self, allocation: Allocation) -> Idle | None:
        """What room-making knows of one of this server's kernels: None where a cell runs, its
        state is not known (an adopted kernel not asked yet counts as busy), or it is not ours."""
        kernel_id = allocation.kernel_id
        if kernel_id not in self.kernels or not known_idle(self.kernels.get_kernel(kernel_id), allocation):
            return None
        last_activity = getattr(self.kernels.get_kernel(kernel_id), "last_activity", None)
        holds = self.slices.status(allocation).usage.memory_used > 0
        return Idle(last_activity.timestamp() if last_activity else 0.0, holds)

    def estimate(self, request: Request) -> float | None:
        """Seconds until the room ``request`` lacks on its device is made, were it first in line
        there (the line's ``estimate``), from what this server knows: an idle kernel the room
        maker suspends takes the measured suspend time for what it holds; one the idle timer
        stops, the timer's remaining seconds. None where that room is held by kernels running
        cells (or anything else whose end nobody knows), or where no suspend was measured yet."""
        short = request.short
        if (
            not isinstance(short, CapacityError)
            or short.resource not in ("memory", "sm_share")
            or not request.device_uuid
        ):
            return None
        missing = short.requested - short.available
        now = time.time()
        freed_at: list[tuple[float, int]] = []
        for holder in self.slices.ledger.allocations():
            if holder.kernel_id == request.kernel_id or holder.suspended or holder.device_uuid != request.device_uuid:
                continue
            seconds = self._seconds_until_freed(holder, now)
            if seconds is not None:
                freed_at.append((seconds, holder.memory_limit if short.resource == "memory" else holder.sm_share))
        freed = 0
        for seconds, room in sorted(freed_at):
            freed += room
            if freed >= missing:
                return seconds
        return None

    def _seconds_until_freed(self, holder: Allocation, now: float) -> float | None:
        kernel_id = holder.kernel_id
        # An idle kernel of ours: the room maker suspends it at the next pass, unless its last
        # try was refused (its GPU work did not drain in time: then only its timer frees it).
        rate = self.suspend_seconds_per_byte
        idle = (
            holder.holder == "local"
            and kernel_id in self.kernels
            and known_idle(self.kernels.get_kernel(kernel_id), holder)
        )
        if idle and rate is not None and (kernel_id, "room") not in self._said:
            # Not before the pool's hold on it ends (it got its room a moment ago).
            held_for = max(0.0, got_room_at(holder) + self.hold - now) if self.hold > 0 else 0.0
            return held_for + rate * self.slices.status(holder).usage.memory_used
        deadline = self.stop_deadline(holder) if self.stop_deadline is not None else None
        return None if deadline is None else max(0.0, deadline - now)

    def _measured(self, suspended: Allocation) -> None:
        timings = suspended.metadata.get(SUSPEND_TIMINGS_KEY)
        seconds = timings.get("suspend") if isinstance(timings, dict) else None
        if isinstance(seconds, (int, float)) and suspended.host_memory > 0:
            self.suspend_seconds_per_byte = float(seconds) / suspended.host_memory

    def _busy(self, kernel_id: str) -> bool:
        """Whether a cell runs in the kernel (what resumes a suspended one)."""
        return getattr(self.kernels.get_kernel(kernel_id), "execution_state", "") == "busy"

    # -- the idle step -------------------------------------------------------------------------

    async def suspend_idle(self, allocation: Allocation, idle_for: float) -> bool:
        """Suspend a kernel idle for ``idle_for`` seconds; False where it cannot be (its notice
        then says why, once: the idle policy culls it later as before)."""
        kernel_id = allocation.kernel_id
        if isinstance(allocation.metadata.get(SUSPEND_NOTICE_KEY), dict):
            return False  # refused before, said why; lowering and culling go on
        held = self.slices.status(allocation).usage.memory_used
        if held and self.host_memory_cap is not None:
            in_host = sum(other.host_memory for other in self.slices.ledger.allocations())
            if in_host + held > self.host_memory_cap:
                self._refused(
                    allocation,
                    f"not suspended: suspended kernels hold {format_size(in_host)} of the "
                    f"{format_size(self.host_memory_cap)} of host memory they may use, and this one's "
                    f"{format_size(held)} would not fit; it is stopped when idle longer instead",
                )
                return False
        try:
            suspended = await asyncio.to_thread(self.slices.suspend, kernel_id, lock_timeout=self.lock_timeout)
        except NotSupported as why:
            self._refused(allocation, f"not suspended when idle: {why}")
            return False
        except CheckpointError as busy:
            self._say(kernel_id, "idle", f"not suspended when idle this time: {busy}")
            return False  # tried again at the next tick
        self._forget_said(kernel_id)
        self._measured(suspended)
        notice = suspended_notice(f"suspended after {format_duration(self.suspend_after)} idle", suspended)
        self._notice(suspended, notice)
        self.log.info("jupyter_vgpu: kernel %s %s", kernel_id, notice)
        return True

    # -- notices -------------------------------------------------------------------------------

    def _say(self, kernel_id: str, topic: str, text: str) -> None:
        """Log ``text`` of a kernel: at INFO where it is not what was last said on ``topic``, else
        at DEBUG."""
        unchanged = self._said.get((kernel_id, topic)) == text
        self._said[(kernel_id, topic)] = text
        self.log.log(logging.DEBUG if unchanged else logging.INFO, "jupyter_vgpu: kernel %s %s", kernel_id, text)

    def _forget_said(self, kernel_id: str) -> None:
        for key in [key for key in self._said if key[0] == kernel_id]:
            del self._said[key]

    async def _waiting(self, allocation: Allocation, short: CapacityError) -> str:
        """A suspended kernel's notice while it waits for room on its device, logged once while it
        says the same: how much is missing there and which kernels hold the room, named as every
        view names them (their notebook, else their short id), never what they are doing."""
        holders = [
            other.kernel_id
            for other in self.slices.ledger.allocations()
            if other.device_uuid == allocation.device_uuid
            and other.kernel_id != allocation.kernel_id
            and not other.suspended
        ]
        paths: dict[str, str] = {}
        if holders and self.sessions is not None:
            with contextlib.suppress(Exception):  # a notice without notebook names is still true
                paths = await session_paths(self.sessions)
        names = [slice_name({"kernel_id": kernel_id, "path": paths.get(kernel_id, "")}) for kernel_id in holders]
        text = waiting_notice(allocation, short, names)
        self._say(allocation.kernel_id, "wait", text)
        return text

    def _notice(self, allocation: Allocation, text: str | None) -> None:
        try:
            self.slices.ledger.update_metadata(allocation.kernel_id, **{SUSPEND_NOTICE_KEY: text})
        except UnknownSlice:
            pass

    def _refused(self, allocation: Allocation, why: str) -> None:
        self.log.info("jupyter_vgpu: kernel %s %s", allocation.kernel_id, why)
        try:
            self.slices.ledger.update_metadata(allocation.kernel_id, **{SUSPEND_NOTICE_KEY: {"refused": why}})
        except UnknownSlice:
            pass


def _left_line(allocation: Allocation) -> bool:
    """Whether the suspended kernel's user interrupted its wait (IN_LINE_KEY's "left")."""
    in_line = allocation.metadata.get(IN_LINE_KEY)
    return isinstance(in_line, dict) and "left" in in_line


def taken_back_notice(allocation: Allocation) -> str:
    """What a borrower is told when its borrowed room is taken back (the same words libvgpu.so
    writes in the cell's output)."""
    return (
        f"paused: room on GPU {allocation.device_index} was taken back for a student within their guarantee; "
        "carries on when room frees"
    )


def suspended_notice(why: str, suspended: Allocation) -> str:
    """A suspended kernel's notice: why, what its processes gave back first (cached memory they
    did not use), how much moved to host memory, and what resumes it. No time: a resume first
    waits for its room on the GPU, for as long as others hold it. "suspended after 20 min idle:
    released 2GiB cached by PyTorch; 1.5GiB moved to host memory; resumes when a cell runs"."""
    if suspended.lent:
        return (
            f"{why.replace('suspended', 'lent', 1)}: it had not used the GPU, so nothing moved; its first CUDA "
            "call takes its room back"
        )
    released = released_text(suspended)
    return (
        f"{why}: {released + '; ' if released else ''}{format_size(suspended.host_memory)} moved to host memory; "
        "resumes when a cell runs"
    )


# Who kept the cached device memory a suspend had given back first (holders/suspender.py).
RELEASED_BY = {"torch": "cached by PyTorch", "cupy": "cached by CuPy", "pools": "kept by the driver's memory pools"}


def released_text(suspended: Allocation) -> str:
    """What the kernel gave back before its memory moved, or "": "released 2GiB cached by PyTorch
    and 512MiB kept by the driver's memory pools"."""
    state = suspended.metadata.get(SUSPENDED_KEY)
    released = state.get("released") if isinstance(state, dict) else None
    if not isinstance(released, dict):
        return ""
    parts = [
        f"{format_size(int(released[source]))} {words}"
        for source, words in RELEASED_BY.items()
        if isinstance(released.get(source), int) and released[source] > 0
    ]
    return f"released {' and '.join(parts)}" if parts else ""


def waiting_notice(allocation: Allocation, short: CapacityError, holders: list[str]) -> str:
    """What a suspended kernel waits for on its device, in the words of a start waiting in line,
    and who holds that room: "waiting for 8GiB more GPU memory (4GiB free) on GPU 1, held by
    train.ipynb and kernel 1c2e3f4a; this kernel resumes when it is free"."""
    if holders:
        named = holders[:NAMED_HOLDERS]
        more = len(holders) - len(named)
        if more:
            named.append(f"{more} more")
        held = "held by " + (named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}")
    else:
        # None of the slices this server's ledger lists: a program outside any slice, the
        # device's reserve, or (with a broker) another user's kernels.
        held = "held outside this server's slices"
    return f"waiting for {waiting_for_room(short)} on GPU {allocation.device_index}, {held}; this kernel resumes when it is free"


__all__ = ["SUSPEND_LOCK_TIMEOUT_SETTING", "SUSPEND_SETTING", "SuspendedKernels"]
