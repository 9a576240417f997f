"""The slice manager: the ledger's decisions carried out by the holders.

What the server extension, its REST handlers and the kernel provisioners share. Admitting a
slice takes a ledger decision and then has the slice's holder make its place; resizing
re-decides and then has the holder put the new limits in force; releasing does the reverse.
Imports go one way: handlers and provisioners -> manager -> ledger, holders.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from traitlets.config import LoggingConfigurable

from jupyter_vgpu.holders import Holder, SliceUsage
from jupyter_vgpu.holders.device_memory import process_running
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.holders.pod import PodHolder
from jupyter_vgpu.holders.region import process_start_time
from jupyter_vgpu.holders.suspender import Suspender
from jupyter_vgpu.ledger import (
    Allocation,
    CapacityError,
    DeviceUsage,
    Ledger,
    LedgerError,
    NotSupported,
    UnknownSlice,
)
from jupyter_vgpu.ledger.policy import HOST_MEMORY, fits, never_fits, waiting_for_room
from jupyter_vgpu.line import LeftLine, Line, Request
from jupyter_vgpu.model import SliceLimits, decide_limits, format_size, select_device
from jupyter_vgpu.model.sizes import exact_size

WARNINGS_KEY = "warnings"
# Metadata of a slice whose kernel changed its own limits (the holder put them back): the last
# change found, how many were found, and when (time.time()).
TAMPERED_KEY = "tampered"
# Metadata of a slice kept after its kernel ended because some of its processes could not be
# stopped (another user's): why, in a sentence.
KEPT_KEY = "kept_because"
# Metadata of a slice that a batch run admitted to this ledger (a kernel of nbconvert, papermill
# or nbclient, started by the provisioner outside any server): the pid and start time of the
# process that started the kernel, which releases the slice when the kernel ends.
BATCH_KEY = "batch"
# Metadata of a sliced kernel: the path of its connection file (how a client reaches it).
CONNECTION_FILE_KEY = "connection_file"
# Metadata of a sliced kernel: the name of its kernelspec (what a restarted server adopts it as).
KERNEL_NAME_KEY = "kernel_name"
# Metadata of a slice whose kernel outlived its server (SIGKILL, a crash): kept by the restarted
# server, which adopts the kernel (ADOPTED_KEY; issue 26), or, where it cannot (no kernelspec name
# recorded, the kernelspec gone), keeps it only while suspended, reached through its connection
# file (issue 18): when that server found it (time.time()).
ORPHANED_KEY = "orphaned"
# Metadata of a sliced kernel: the server that started it ({"pid", "pid_start_time"}): while that
# server (or the one that adopted the kernel) runs, another server on the same ledger leaves the
# kernel alone.
SERVER_KEY = "server"
# Metadata of a slice whose kernel a restarted server adopted (server/adopt.py): {"at": when
# (time.time()), "server": the adopting server's pid, start time and URL}.
ADOPTED_KEY = "adopted"
# Metadata of a suspended slice waiting in the line to take its room back: {"since": epoch
# seconds it first asked}, its place in line across server restarts; {"left": epoch seconds}
# once its user interrupted the wait.
IN_LINE_KEY = "in_line"
# A request's label (Request.labels) saying for whom kernels suspended to make its room were
# (their notice): a resume its user's sign asked for says so ("a kernel its user opened").
FOR_WHOM_LABEL = "for_whom"
# Metadata of a slice whose growth waits in the line: {"memory": exact size, "cores": percent,
# "policy", "since": epoch seconds it first asked}; a restarted server puts it back in its line
# with the same place (SuspendedKernels.check -> SliceManager.rejoin_resize).
RESIZE_WAITING_KEY = "resize_waiting"
# The capacity a device lacks that suspending idle kernels there can give back, and "line": a
# node's broker has older requests of other users' servers go first (ledger/broker_line.py's
# BrokerLine). A request refused for any of them waits in the line; for anything else it is refused.
# "host_memory": a borrowing request the node's host memory cap leaves no room to take back
# (ledger/policy.py's HOST_MEMORY) waits too, until a suspended kernel resumes or stops.
DEVICE_ROOM = ("memory", "sm_share", "line", HOST_MEMORY)


def orphan_notice(allocation: Allocation) -> str | None:
    """What to tell about a kernel that outlived a server restart while suspended, or None."""
    if not isinstance(allocation.metadata.get(ORPHANED_KEY), dict):
        return None
    reach = f"`jupyter console --existing {allocation.metadata.get(CONNECTION_FILE_KEY, '')}`"
    if allocation.suspended:
        return (
            f"suspended when its server stopped; Jupyter does not list it again: its "
            f"{format_size(allocation.host_memory)} stay in host memory until it is resumed (`jupyter vgpu resume "
            f"{allocation.kernel_id}`, or a CUDA call of its own) and reached with {reach}, where `exit` stops it"
        )
    return f"resumed after its server stopped; Jupyter does not list it again: reach it with {reach}, where `exit` stops it"


def this_process() -> dict[str, int]:
    """What identifies this process in the ledger: its pid and start time."""
    pid = os.getpid()
    return {"pid": pid, "pid_start_time": process_start_time(pid)}


def served_elsewhere(allocation: Allocation) -> int:
    """The pid of another server that has the slice's kernel and still runs (the one that adopted
    it, else the one that started it), or 0."""
    adopted = allocation.metadata.get(ADOPTED_KEY)
    server = adopted.get("server") if isinstance(adopted, dict) else allocation.metadata.get(SERVER_KEY)
    if not isinstance(server, dict):
        return 0
    pid, start_time = server.get("pid"), server.get("pid_start_time")
    if not isinstance(pid, int) or not isinstance(start_time, int) or pid == os.getpid():
        return 0
    return pid if process_running(pid, start_time) else 0


def held_by_batch_run(allocation: Allocation) -> bool:
    """Whether a batch run admitted this slice and the process that started it still runs: no
    server started that kernel, so a restarted server neither stops it nor releases its slice."""
    started_by = allocation.metadata.get(BATCH_KEY)
    if not isinstance(started_by, dict):
        return False
    pid, start_time = started_by.get("pid"), started_by.get("pid_start_time")
    return isinstance(pid, int) and pid > 0 and bool(start_time) and process_start_time(pid) == start_time


class BelowHeld(Exception):
    """A resize whose memory cap is below what the kernel holds; ``held``: those bytes."""

    def __init__(self, message: str, *, held: int):
        super().__init__(message)
        self.held = held


class SliceRefused(Exception):
    """A slice that cannot be had; ``kind`` is ``capacity`` (no room: try less or stop a
    kernel), ``invalid`` (the request itself is wrong) or ``cluster`` (a pod kernel the cluster
    did not run). The message is short, whole sentences,
    free of ``%`` (jupyter_server doubles it in the error it makes of a failed session start)."""

    def __init__(self, message: str, *, kind: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RoomWanted:
    """Room a kernel start or a resize needs on a device, which suspending idle kernels there may
    make (issue 18; ``SliceManager.room_maker`` carries it out)."""

    # Tries the start or resize again: True once it fits (and was done).
    fits: Callable[[], bool]
    # The device (a UUID); None: any.
    device_uuid: str | None
    # Who wants it, for the notices of the kernels suspended for it.
    for_whom: str
    # The kernel that wants it, never suspended for it ("" for a start).
    exclude: str = ""
    # What the refusal said is missing on the device, if it did: room is made only where
    # suspending every idle kernel there could be enough.
    short: CapacityError | None = None


@dataclass(frozen=True)
class SliceStatus:
    """A slice as the REST API and the CLI show it: the ledger's record and the holder's reading."""

    allocation: Allocation
    usage: SliceUsage

    @property
    def warnings(self) -> list[str]:
        metadata = self.allocation.metadata
        tampered, kept = self.tamper_warning, metadata.get(KEPT_KEY)
        # WARNINGS_KEY: the list a ledger of an earlier version may still hold for the slice.
        return [*metadata.get(WARNINGS_KEY, []), *self.usage.warnings, *filter(None, [tampered, kept])]

    @property
    def memory_over_cap(self) -> int:
        return max(0, self.usage.memory_used - self.allocation.memory_limit)

    @property
    def tamper_warning(self) -> str | None:
        """One sentence, however often the kernel changed its limits: what it did (the last
        time), and what it means now, read from what its processes hold at this reading."""
        tampered = self.allocation.metadata.get(TAMPERED_KEY)
        if not isinstance(tampered, dict):
            return None
        times = tampered.get("times", 1)
        again = f" ({times} times)" if times > 1 else ""
        cap = format_size(self.allocation.memory_limit)
        over = self.memory_over_cap
        if over:
            meaning = (
                f"its processes hold {format_size(self.usage.memory_used)}, {format_size(over)} over the {cap} cap; "
                "that stays held, and counts against the GPU's free memory, until the kernel frees it"
            )
        else:
            meaning = f"its processes hold no more than the {cap} cap"
        return f"{tampered.get('found', '')}{again}; {meaning}"


def start_refusal(error: CapacityError) -> str:
    """The short form of a refused start, read whole in JupyterLab's error dialog."""
    if error.making_room:  # the broker is suspending idle kernels for it
        return f"Its GPU slice does not fit yet: {error.making_room}."
    return _short_refusal(error)


def _short_refusal(error: CapacityError) -> str:
    if error.resource == "memory":
        free = format_size(error.available) if error.available else "no memory"
        advice = "stop a kernel to free some" if not error.available else "ask for less or stop a kernel"
        return f"Its {format_size(error.requested)} GPU slice does not fit: {free} is free. To start it, {advice}."
    if error.resource == "sm_share":
        return (
            f"Its GPU slice of {error.requested} percent of the SMs does not fit: {error.available} percent "
            "is free. To start it, ask for less or stop a kernel."
        )
    return str(error).replace("%", " percent")


def _unavailable(error: LedgerError) -> SliceRefused:
    return SliceRefused(f"No GPU slice could be decided: {error}", kind="unavailable")


class SliceManager(LoggingConfigurable):
    """Drives one ledger and the holders of its slices. One per server; provisioners find it
    through their parent chain (kernel manager -> server), handlers through the settings."""

    def __init__(
        self,
        ledger: Ledger,
        holders: list[Holder],
        defaults: SliceLimits,
        *,
        start_error: Callable[[SliceRefused], Exception] = lambda refusal: refusal,
        **kwargs,
    ):
        """``start_error`` makes the exception a refused kernel start raises; the server turns
        refusals into HTTP errors there, so no layer below it knows HTTP."""
        super().__init__(**kwargs)
        self.start_error = start_error
        self.ledger = ledger
        self.holders = {holder.kind: holder for holder in holders}
        self.defaults = defaults
        # Starts and resumes that do not fit yet wait here (see line.py); the server serves it.
        self.line = Line(make_room=self._make_room_for, log=self.log)
        if hasattr(ledger, "wait_in_line"):
            # A node's broker keeps one line across users' servers: each request this server
            # tries holds its place there, from the time it first asked.
            self.line.entered, self.line.left = self._entered_line, self._left_line

    def holder(self, allocation_or_kind: Allocation | str) -> Holder:
        kind = allocation_or_kind if isinstance(allocation_or_kind, str) else allocation_or_kind.holder
        return self.holders[kind]

    # -- decisions ---------------------------------------------------------------------------

    def decide_limits(
        self, requested: dict[str, Any] | None = None, configured: dict[str, Any] | None = None
    ) -> SliceLimits:
        """The one place a slice's size is decided: what the start asked for, else what the
        kernelspec (or the provisioner's config) sets, else this server's defaults. Values are
        in the parse() vocabulary (``memory``, ``cores``, ``policy``); empty ones are unset."""
        try:
            return decide_limits(self.defaults, configured or {}, requested or {})
        except ValueError as error:
            raise SliceRefused(str(error), kind="invalid") from None

    def held(self, kernel_id: str) -> Allocation | None:
        """The slice the ledger holds for a kernel about to start (a restart keeps its slice), if
        any; a ledger that does not answer refuses the start."""
        try:
            return self.ledger.get(kernel_id)
        except LedgerError as error:
            raise _unavailable(error) from None

    def admit(
        self,
        kernel_id: str,
        limits: SliceLimits,
        *,
        owner: str = "",
        device=None,
        metadata: dict[str, Any] | None = None,
        holder: str = "local",
    ) -> Allocation:
        """A slice for a kernel about to start: a ledger decision, then its holder's place."""
        try:
            allocation = self.ledger.admit(
                kernel_id, limits, owner=owner, device=device, metadata=metadata, holder=holder
            )
        except CapacityError as error:
            raise SliceRefused(start_refusal(error), kind="capacity") from error
        except ValueError as error:
            raise SliceRefused(str(error).replace("%", " percent"), kind="invalid") from None
        except LedgerError as error:
            raise _unavailable(error) from None
        try:
            self.holder(allocation).create(allocation)
        except BaseException as error:
            self.release(kernel_id)
            if isinstance(error, LedgerError):  # the ledger's side of the slice's place failed
                raise _unavailable(error) from None
            raise
        return allocation

    def resize(self, kernel_id: str, *, memory=None, cores=None, policy=None) -> Allocation:
        """Re-decide a slice (values in the parse() vocabulary) and put the new limits in force
        for every process in it. Raises UnknownSlice, SliceValueError, CapacityError, and
        BelowHeld for a memory cap below what the kernel holds."""
        current = self.get(kernel_id)
        wanted = current.limits.changed(memory=memory, cores=cores, policy=policy)
        self.holder(current).check_limits(current, wanted)
        if wanted.memory_limit < current.memory_limit:
            self._refuse_below_held(current, wanted.memory_limit)
        allocation = self.ledger.resize(
            kernel_id, memory_limit=wanted.memory_limit, sm_share=wanted.sm_share, policy=wanted.policy
        )
        self.holder(allocation).apply_limits(allocation)
        return allocation

    def _refuse_below_held(self, current: Allocation, memory_limit: int) -> None:
        """Refuse a cap below what the kernel holds (issue 27): it would free nothing (memory in
        use is never taken back), and a suspended kernel could not restore its memory under it."""
        if current.suspended:
            held, where = current.host_memory, "suspended, it holds"
            what = "in host memory, all of which its resume puts back on the GPU"
        else:
            held, where = self.holder(current).usage(current).memory_used, "its processes hold"
            what = "on the GPU, which a smaller cap would not free"
        if memory_limit >= held:
            return
        raise BelowHeld(
            f"kernel {current.kernel_id!r} cannot shrink to {format_size(memory_limit)}: {where} "
            f"{format_size(held)} {what}; ask for {format_size(held)} or more, or free memory in the kernel "
            "first (del what you no longer need; torch.cuda.empty_cache())",
            held=held,
        )

    def stop_processes(self, allocation: Allocation) -> list[str]:
        """Stop every process of the slice of a kernel that is gone (children that outlived it
        included), so that what they hold on the GPU is free before the slice is released.
        Returns why some could not be stopped, having recorded it with the slice, which must
        then be kept: its memory is still held."""
        problems = self.holder(allocation).stop(allocation)
        if problems:
            why = (
                f"the kernel is gone but its slice is kept: {'; '.join(problems)}; its GPU memory stays "
                "held until they exit"
            )
            if why == allocation.metadata.get(KEPT_KEY):
                return problems  # said already; the watcher tries again at every tick
            self.log.warning("kernel %s: %s", allocation.kernel_id, why)
            with contextlib.suppress(UnknownSlice):
                self.ledger.update_metadata(allocation.kernel_id, **{KEPT_KEY: why})
        return problems

    def release_gone(self, allocation: Allocation) -> Allocation | None:
        """Release the slice of a kernel that is gone, once none of its processes holds the
        device; returns the released allocation, or None where the slice is kept."""
        if self.stop_processes(allocation):
            return None
        return self.release(allocation.kernel_id)

    def release(self, kernel_id: str) -> Allocation | None:
        waiting = self.line.get(kernel_id)
        if waiting is not None and waiting.kind == "resize":
            self.line.leave(kernel_id, "its kernel is gone")
        allocation = self.ledger.release(kernel_id)
        for holder in self.holders.values():
            holder.release(kernel_id)
        return allocation

    # -- suspending idle kernels (issue 18) ---------------------------------------------------

    # Makes room for a start or a resize that does not fit by suspending idle kernels on the
    # device (server/suspend.py), where the server's suspend policy is on; whether it fits now.
    room_maker: Callable[[RoomWanted], Awaitable[bool]] | None = None
    # Seconds a sliced kernel outlives its server, for a restarted one to adopt it (VGPUApp.kernel_survival).
    kernel_survival: float = 0.0
    # Seconds a suspend waits for the kernel's processes to give back cached device memory first
    # (VGPUApp.suspend_release_wait); 0: nothing is asked.
    release_wait: float = 2.0

    async def admit_in_line(
        self,
        kernel_id: str,
        limits: SliceLimits,
        *,
        owner: str = "",
        device=None,
        metadata=None,
        since: float | None = None,
        queued: Callable[[float], None] | None = None,
    ) -> Allocation:
        """:meth:`admit`, except that a start that does not fit on a device now waits in the line
        until it does (room is made for it there: see :meth:`_make_room_for`), instead of being
        refused. Only a start that can never fit (more memory than its devices have, past the
        server's or its owner's limits) is refused at once. Cancelling the wait leaves the line.

        ``since``: the time the start first asked (a start a restarted server starts again keeps
        its place); ``queued``: called with that time when the start takes its place in line."""
        try:
            return self.admit(kernel_id, limits, owner=owner, device=device, metadata=metadata)
        except SliceRefused as refusal:
            short = refusal.__cause__
            if not isinstance(short, CapacityError) or short.resource not in DEVICE_ROOM:
                raise
        self._refuse_if_never_fits(limits, device)

        def attempt() -> bool:
            try:
                self.admit(kernel_id, limits, owner=owner, device=device, metadata=metadata)
                return True
            except SliceRefused as refused:
                reason = refused.__cause__
                if not isinstance(reason, CapacityError) or reason.resource not in DEVICE_ROOM:
                    raise
                request.short, request.waiting_for = reason, waiting_for_room(reason)
                return False

        async def attempt_async() -> bool:
            return attempt()

        request = Request(
            kernel_id,
            "start",
            limits.memory_limit,
            limits.sm_share,
            self._device_uuid(device),
            attempt_async,
            policy=limits.policy,
            waiting_for=waiting_for_room(short),
            short=short,
            labels={**(metadata or {}), "owner": owner},
        )
        if since is not None:
            request.since = since
        # Nobody waits for this device: room is made for it now, so that a start beside idle
        # kernels is answered started, not queued; otherwise it takes its place behind the others.
        if not self.line.waiting_for(request) and await self._make_room_for(request) and attempt():
            return self.get(kernel_id)
        if queued is not None:
            queued(request.since)
        try:
            await self.line.wait(request)
        except LeftLine as left:
            raise SliceRefused(f"It left the line for GPU room: {left}.", kind="capacity") from None
        return self.get(kernel_id)

    def _entered_line(self, request: Request) -> None:
        self.ledger.wait_in_line(  # type: ignore[attr-defined]
            request.kernel_id,
            kind=request.kind,
            memory=request.memory,
            sm_share=request.sm_share,
            device_uuid=request.device_uuid,
            since=request.since,
        )

    def _left_line(self, request: Request) -> None:
        self.ledger.leave_line(request.kernel_id)  # type: ignore[attr-defined]

    def _refuse_if_never_fits(self, limits: SliceLimits, device) -> None:
        """Refuse at once a slice that would not fit even on an empty device."""
        usages = self.ledger.devices_usage()
        if device not in (None, ""):
            try:
                chosen = select_device(self.ledger.devices, device).uuid
            except ValueError as error:
                raise SliceRefused(str(error), kind="invalid") from None
            usages = [usage for usage in usages if usage.device.uuid == chosen]
        if not usages:
            return
        largest: DeviceUsage = max(usages, key=lambda usage: (usage.memory_capacity, -usage.device.index))
        if limits.memory_limit > largest.memory_capacity:
            where = (
                f"GPU {largest.device.index} has"
                if len(usages) == 1
                else (f"the largest GPU here, GPU {largest.device.index}, has")
            )
            raise SliceRefused(never_fits(limits.memory_limit, largest.memory_capacity, where), kind="capacity")

    async def _make_room_for(self, request: Request) -> bool:
        """Make room for the first request on its device (the line's ``make_room``): the room
        maker lends what nobody uses and suspends idle kernels there until it could fit."""
        if self.room_maker is None:
            return False

        def room_there() -> bool:
            # A resize's request is what it grows by, which may be no SM share at all.
            return any(
                fits(usage, request.memory, request.sm_share, request.policy)
                for usage in self.ledger.devices_usage()
                if request.device_uuid in (None, usage.device.uuid)
            )

        kinds = {"start": "a new kernel", "resize": "a kernel that grows"}
        for_whom = request.labels.get(FOR_WHOM_LABEL) or kinds.get(request.kind, "a kernel that ran again")
        short = request.short if isinstance(request.short, CapacityError) else None
        wanted = RoomWanted(room_there, request.device_uuid, for_whom, exclude=request.kernel_id, short=short)
        return await self.room_maker(wanted)

    async def resize_in_line(
        self, kernel_id: str, *, memory=None, cores=None, policy=None, since: float | None = None
    ) -> Allocation:
        """:meth:`resize`, except that a growth of a running kernel that does not fit on its
        device now waits in the line (room is made for it as for a start) and happens by itself
        when room comes: the slice is returned as it is, its place in ``line.place(kernel_id)``.
        A resize replaces the kernel's waiting one (a shrink too, which never waits). A suspended
        (or lent) kernel's growth waits the same way, for room for all of its new size (its
        resume needs that much). A growth that can never fit on the device is refused
        (CapacityError, in the start's one sentence)."""
        waiting = self.line.get(kernel_id)
        if waiting is not None and waiting.kind == "resize":
            self.line.leave(kernel_id, "replaced by a later resize")

        def attempt() -> bool:
            try:
                self._resize_and_forget(kernel_id, memory=memory, cores=cores, policy=policy)
                return True
            except CapacityError as short:
                if short.resource not in DEVICE_ROOM:
                    raise
                request.short, request.waiting_for = short, self._resize_waits_for(kernel_id, short)
                return False

        async def attempt_async() -> bool:
            return attempt()

        try:
            return self._resize_and_forget(kernel_id, memory=memory, cores=cores, policy=policy)
        except CapacityError as refusal:
            current = self.get(kernel_id)
            if refusal.resource not in DEVICE_ROOM or kernel_id in self.line:
                raise
            short = refusal
        wanted = current.limits.changed(memory=memory, cores=cores, policy=policy)
        device = next(
            (usage for usage in self.ledger.devices_usage() if usage.device.uuid == current.device_uuid), None
        )
        if device is not None and wanted.memory_limit > device.memory_capacity:
            raise CapacityError(
                never_fits(wanted.memory_limit, device.memory_capacity, f"GPU {device.device.index} has"),
                resource="memory",
                requested=wanted.memory_limit,
                available=device.memory_capacity,
            )
        # What it asks the device for: what it grows by, or all of it for a suspended slice.
        memory_held, share_held = (0, 0) if current.suspended else (current.memory_limit, current.sm_share)
        request = Request(
            kernel_id,
            "resize",
            max(0, wanted.memory_limit - memory_held),
            max(0, wanted.sm_share - share_held),
            current.device_uuid,
            attempt_async,
            policy=wanted.policy,
            waiting_for=self._resize_waits_for(kernel_id, short),
            short=short,
        )
        if since is not None:
            request.since = since
        # The line is state: a restarted server finds the growth waiting, with its place.
        waiting_for = {"memory": exact_size(wanted.memory_limit), "cores": wanted.sm_share, "policy": wanted.policy}
        with contextlib.suppress(UnknownSlice):
            self.ledger.update_metadata(kernel_id, **{RESIZE_WAITING_KEY: {**waiting_for, "since": request.since}})
        # As for a start: room is made at once where nobody waits for the device.
        if not self.line.waiting_for(request) and await self._make_room_for(request) and attempt():
            return self.get(kernel_id)
        self.line.join(request)
        return self.get(kernel_id)

    def _resize_and_forget(self, kernel_id: str, **changes: Any) -> Allocation:
        """:meth:`resize`, and no growth of the kernel waits any more (RESIZE_WAITING_KEY)."""
        resized = self.resize(kernel_id, **changes)
        if resized.metadata.get(RESIZE_WAITING_KEY) is not None:
            resized = self.ledger.update_metadata(kernel_id, **{RESIZE_WAITING_KEY: None})
        return resized

    async def rejoin_resize(self, allocation: Allocation) -> None:
        """Put back in the line a growth that waited when the last server stopped (RESIZE_WAITING_KEY),
        with the place it had; it happens now where it fits."""
        waiting = allocation.metadata.get(RESIZE_WAITING_KEY)
        if not isinstance(waiting, dict) or allocation.kernel_id in self.line:
            return
        try:
            await self.resize_in_line(
                allocation.kernel_id,
                memory=waiting.get("memory"),
                cores=waiting.get("cores"),
                policy=waiting.get("policy"),
                since=float(waiting["since"]) if isinstance(waiting.get("since"), (int, float)) else None,
            )
        except (CapacityError, BelowHeld, ValueError) as error:
            # It can no longer be had (the kernel holds more now, say): it waits no more.
            self.log.warning("kernel %s's waiting resize is dropped: %s", allocation.kernel_id, error)
            with contextlib.suppress(UnknownSlice):
                self.ledger.update_metadata(allocation.kernel_id, **{RESIZE_WAITING_KEY: None})

    def _resize_waits_for(self, kernel_id: str, short: CapacityError) -> str:
        """What a waiting growth lacks, with the GPU's free figure: a running slice's refusal
        counts its own room as available, a suspended one's does not (it holds none)."""
        current = self.ledger.get(kernel_id)
        if current is None or current.suspended:
            return waiting_for_room(short)
        return waiting_for_room(short, current.memory_limit, current.sm_share)

    def _device_uuid(self, device) -> str | None:
        """The UUID of the device a start asks for (an index or a UUID), None for any."""
        if device is None or device == "":
            return None
        with contextlib.suppress(ValueError):
            return select_device(self.ledger.devices, device).uuid
        return None

    @functools.cached_property
    def suspender(self) -> Suspender:
        """Carries out suspends and resumes of local slices (holders/suspender.py)."""
        holder = self.holders.get("local")
        if not isinstance(holder, LocalHolder):
            raise NotSupported("this server holds no local slices, which are the only ones suspended")
        return Suspender(self.ledger, holder)

    def suspend(self, kernel_id: str, *, lock_timeout: float = 5.0) -> Allocation:
        """Move the kernel's GPU memory to host memory and lend its slice's room (blocks: call
        from a worker thread). Raises UnknownSlice; NotSupported with the reasons it cannot be
        suspended here; SuspendRefused where a process did not stop its GPU work within
        ``lock_timeout`` seconds (it stays running)."""
        return self.suspender.suspend(self.get(kernel_id), lock_timeout=lock_timeout, release_wait=self.release_wait)

    def resume(self, kernel_id: str) -> Allocation:
        """Take a suspended kernel's room back on its device, then restore its memory (blocks).
        Raises UnknownSlice; CapacityError (still suspended) where its room is taken."""
        return self.suspender.resume(self.get(kernel_id))

    def leave_line(self, kernel_id: str) -> bool:
        """Take a suspended kernel's resume out of the line (its user interrupted the cell that
        waits): its processes stop waiting, it stays suspended, and its resume requests so far
        count as answered, so that only a later CUDA call asks again. Whether anything waited."""
        left = self.line.leave(kernel_id, "interrupted")
        allocation = self.ledger.get(kernel_id)
        if allocation is None or not allocation.suspended:
            return left
        holder = self.holder(allocation)
        if not isinstance(holder, LocalHolder):
            return left
        with contextlib.suppress(UnknownSlice):
            # "left": the cell that was interrupted is not a reason to line up again (see
            # SuspendedKernels.check); its next one is.
            self.suspender.answer_requests(allocation, **{IN_LINE_KEY: {"left": time.time()}})
        holder.leave_line(allocation)
        return True

    def report_usage(self, kernel_id: str, report: dict[str, Any]) -> Allocation:
        """Take a usage report from a kernel that runs elsewhere (a pod's agent) and return its
        slice, whose limits the agent then puts in force. Raises UnknownSlice, and ValueError
        for a slice whose holder reads usage itself."""
        allocation = self.get(kernel_id)
        record = getattr(self.holder(allocation), "record_report", None)
        if record is None:
            raise ValueError(
                f"kernel {kernel_id!r} holds a {allocation.holder} slice, whose usage the server reads itself"
            )
        record(allocation, report)
        return allocation

    def record_kernel(
        self, kernel_id: str, provisioner_info: dict[str, Any], connection_file: str = "", kernel_name: str = ""
    ) -> None:
        """Remember what identifies the kernel's process (its provisioner's
        ``get_provisioner_info()``), so a restarted server can tell whether it still runs, its
        connection file, through which a client (or a restarted server) reaches it without this
        server, and its kernelspec's name, as which a restarted server adopts it."""
        fields: dict[str, Any] = {"provisioner_info": provisioner_info, SERVER_KEY: this_process()}
        if connection_file:
            fields[CONNECTION_FILE_KEY] = connection_file
        if kernel_name:
            fields[KERNEL_NAME_KEY] = kernel_name
        self.ledger.update_metadata(kernel_id, **fields)

    def issue_kernel_credential(self, kernel_id: str) -> str:
        """A fresh secret for the kernel's process to call the REST API with (see handlers.py for
        what it allows). Only its hash is kept in the ledger; a restart issues a new one."""
        credential = secrets.token_urlsafe(32)
        self.ledger.update_metadata(kernel_id, credential_sha256=_digest(credential))
        return credential

    def kernel_with_credential(self, credential: str) -> str | None:
        """The kernel whose current credential this is, if any."""
        digest = _digest(credential)
        for allocation in self.ledger.allocations():
            if hmac.compare_digest(allocation.metadata.get("credential_sha256", ""), digest):
                return allocation.kernel_id
        return None

    # -- reading -----------------------------------------------------------------------------

    def get(self, kernel_id: str) -> Allocation:
        allocation = self.ledger.get(kernel_id)
        if allocation is None:
            raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}")
        return allocation

    def status(self, allocation: Allocation) -> SliceStatus:
        usage = self.holder(allocation).usage(allocation)
        if usage.warnings:
            # Limits the kernel changed and the holder put back: kept with the slice, so it stays
            # flagged after the holder put things right; one entry, the last change and a count.
            found = "; ".join(usage.warnings)
            previous = allocation.metadata.get(TAMPERED_KEY)
            times = previous.get("times", 1) + 1 if isinstance(previous, dict) else 1
            with contextlib.suppress(UnknownSlice):
                allocation = self.ledger.update_metadata(
                    allocation.kernel_id, **{TAMPERED_KEY: {"found": found, "times": times, "at": time.time()}}
                )
            status = SliceStatus(allocation, replace(usage, warnings=[]))
            self.log.warning("kernel %s: %s", allocation.kernel_id, status.tamper_warning)
            return status
        return SliceStatus(allocation, usage)

    def statuses(self) -> list[SliceStatus]:
        return [self.status(allocation) for allocation in self.ledger.allocations()]

    # -- after a restart ---------------------------------------------------------------------

    def reconcile(self) -> list[Allocation]:
        """Release slices whose kernels are gone, and keep the kernels a killed server left.

        A sliced kernel outlives its server for ``VGPUApp.kernel_survival`` seconds
        (notebook/survive.py): one that still runs and can be reached through its connection
        file is kept, marked orphaned, for the server to adopt (:meth:`survivors`; the server
        puts it in jupyter_server's kernel manager, server/adopt.py). Other kernels the ledger
        lists whose processes still run are stopped (their processes first, then their slices),
        and whatever a holder has left of slices the ledger no longer knows is removed. Returns
        what was released. A slice a batch run admitted (see :func:`held_by_batch_run`) stays
        while the process that started its kernel runs.
        """
        kept = set()
        for allocation in self.ledger.allocations():
            if held_by_batch_run(allocation):
                continue  # a batch run's kernel: its own process releases the slice
            serving = served_elsewhere(allocation)
            if serving:
                # Another server on this ledger runs and has it: neither adopted nor stopped.
                self.log.info("kernel %s is the running server %d's: left to it", allocation.kernel_id, serving)
                kept.add(allocation.kernel_id)
                continue
            if self._keep_survivor(allocation):
                kept.add(allocation.kernel_id)
                continue
            if self.holder(allocation).is_alive(allocation):
                self.log.warning("stopping orphaned kernel %s left by a previous server", allocation.kernel_id)
            else:
                why = self.holder(allocation).usage(allocation).message
                self.log.warning(
                    "kernel %s ended while no server ran%s; its slice is released",
                    allocation.kernel_id,
                    f" ({why})" if why else "",
                )
            if self.stop_processes(allocation):
                kept.add(allocation.kernel_id)
        released = self.ledger.reconcile(
            lambda allocation: held_by_batch_run(allocation) or allocation.kernel_id in kept
        )
        for allocation in released:
            self.release(allocation.kernel_id)
        kept = {allocation.kernel_id for allocation in self.ledger.allocations()}
        for holder in self.holders.values():
            for kernel_id in holder.sweep(kept):
                self.log.info("removed what slice %s left behind", kernel_id)
        return released

    def _keep_survivor(self, allocation: Allocation) -> bool:
        """Whether a kernel the last server left is kept: one that still runs, can be reached
        through its connection file, and either can be adopted (a local slice whose kernelspec
        name is recorded) or is suspended (it holds nothing on the GPU; its user's variables are
        in its host memory: kept, as before adoption existed, for its user to reach through its
        connection file). Its slice stays as it was (running or suspended), marked orphaned until
        a server adopts the kernel."""
        if not self.holder(allocation).is_alive(allocation):
            return False
        kernel_id = allocation.kernel_id
        connection_file = allocation.metadata.get(CONNECTION_FILE_KEY)
        # A pod kernel's connection is in its Secret, read when it is adopted.
        in_secret = isinstance(self.holder(allocation), PodHolder)
        if not in_secret and (not isinstance(connection_file, str) or not os.path.isfile(connection_file)):
            self.log.warning("stopping kernel %s left by a previous server: no connection file reaches it", kernel_id)
            return False
        if not (self._adoptable(allocation) or allocation.suspended):
            return False
        with contextlib.suppress(UnknownSlice):
            previous = allocation.metadata.get(ORPHANED_KEY)
            found = previous if isinstance(previous, dict) else {"at": time.time()}
            allocation = self.ledger.update_metadata(kernel_id, **{ORPHANED_KEY: found})
        self.log.warning("kernel %s left by a previous server is kept, for this server to adopt", kernel_id)
        return True

    def _adoptable(self, allocation: Allocation) -> bool:
        return bool(allocation.metadata.get(KERNEL_NAME_KEY)) and isinstance(
            self.holder(allocation), (LocalHolder, PodHolder)
        )

    def survivors(self) -> list[Allocation]:
        """The kernels kept by :meth:`reconcile` that a server can adopt (orphaned, adoptable and
        still running)."""
        return [
            allocation
            for allocation in self.ledger.allocations()
            if isinstance(allocation.metadata.get(ORPHANED_KEY), dict)
            and self._adoptable(allocation)
            and self.holder(allocation).is_alive(allocation)
        ]

    @staticmethod
    def adoption(allocation: Allocation) -> dict[str, Any]:
        """What the vGPU provisioner adopts a survivor with (provisioning/local.py's ``_adopt``):
        its connection file and its process, as ``get_provisioner_info`` recorded them."""
        return {
            "connection_file": allocation.metadata.get(CONNECTION_FILE_KEY, ""),  # none for a pod: its Secret
            "provisioner_info": dict(allocation.metadata.get("provisioner_info", {})),
        }

    def adopted(self, kernel_id: str, server: dict[str, Any]) -> Allocation:
        """Record that ``server`` (its pid, start time and URL) adopted the kernel: no longer an
        orphan, and named beside its region, where the kernel (notebook/survive.py) and its %vgpu
        find it."""
        allocation = self.ledger.update_metadata(
            kernel_id, **{ORPHANED_KEY: None, ADOPTED_KEY: {"at": time.time(), "server": server}}
        )
        holder = self.holder(allocation)
        if isinstance(holder, LocalHolder):
            holder.adopted_by(allocation, server)
        return allocation

    def not_adopted(self, allocation: Allocation, why: str) -> None:
        """A survivor the server could not adopt: kept, orphaned, where it is suspended (reached
        through its connection file, as before adoption existed); else stopped, its processes
        first, then its slice."""
        if allocation.suspended:
            self.log.warning(
                "kernel %s left by a previous server is not adopted (%s): %s",
                allocation.kernel_id,
                why,
                orphan_notice(allocation),
            )
            return
        self.log.warning("stopping kernel %s left by a previous server, not adopted: %s", allocation.kernel_id, why)
        self.release_gone(allocation)


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


__all__ = [
    "ADOPTED_KEY",
    "BATCH_KEY",
    "CONNECTION_FILE_KEY",
    "FOR_WHOM_LABEL",
    "IN_LINE_KEY",
    "KERNEL_NAME_KEY",
    "ORPHANED_KEY",
    "RESIZE_WAITING_KEY",
    "SERVER_KEY",
    "BelowHeld",
    "RoomWanted",
    "SliceManager",
    "SliceRefused",
    "SliceStatus",
    "held_by_batch_run",
    "orphan_notice",
    "served_elsewhere",
    "start_refusal",
]
