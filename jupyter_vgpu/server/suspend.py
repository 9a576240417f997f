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
import logging
from typing import Any

from jupyter_vgpu.holders.checkpoint import CheckpointError
from jupyter_vgpu.ledger import SUSPEND_TIMINGS_KEY, Allocation, CapacityError, LedgerError, NotSupported, UnknownSlice
from jupyter_vgpu.manager import DEVICE_ROOM, ORPHANED_KEY, RoomWanted, SliceManager
from jupyter_vgpu.model import format_size
from jupyter_vgpu.server.idle import SUSPEND_NOTICE_KEY, format_duration

# Where the handlers find VGPUApp.suspend_lock_timeout (seconds a process may take to finish its
# GPU work before a suspend leaves the kernel running).
SUSPEND_LOCK_TIMEOUT_SETTING = "jupyter_vgpu_suspend_lock_timeout"
# Where the slice watcher finds the server's SuspendedKernels.
SUSPEND_SETTING = "jupyter_vgpu_suspended_kernels"


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
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    ):
        self.slices = slices
        self.kernels = kernels  # jupyter_server's MappingKernelManager
        self.suspend_after = suspend_after
        self.lock_timeout = lock_timeout
        self.host_memory_cap = host_memory_cap
        self.log = log or logging.getLogger(__name__)

    # -- resume on demand ----------------------------------------------------------------------

    async def check(self, allocations: list[Allocation]) -> None:
        """Resume the suspended kernels that asked for it (one pass of the slice watcher)."""
        for allocation in allocations:
            ours = allocation.kernel_id in self.kernels
            # A kernel kept after it outlived the last server (manager.py's ORPHANED_KEY) is not
            # this server's, and is reached through its connection file: its CUDA calls resume it.
            if not allocation.suspended or not (ours or isinstance(allocation.metadata.get(ORPHANED_KEY), dict)):
                continue
            if (ours and self._busy(allocation.kernel_id)) or self.slices.suspender.resume_requested(allocation):
                try:
                    await self.resume(allocation, allocations)
                except (UnknownSlice, KeyError):
                    continue  # stopped meanwhile
                except (LedgerError, CheckpointError) as error:
                    self.log.warning("jupyter_vgpu: kernel %s not resumed: %s", allocation.kernel_id, error)

    async def resume(self, allocation: Allocation, allocations: list[Allocation] | None = None) -> bool:
        """Resume a suspended kernel, making room by suspending idle kernels on its device where
        needed; False (with the reason in its notice) where it must wait."""
        kernel_id = allocation.kernel_id
        try:
            await asyncio.to_thread(self.slices.resume, kernel_id)
        except CapacityError as short:
            if short.resource not in DEVICE_ROOM or not await self._make_room(allocation, short, allocations):
                self._notice(allocation, _waiting(allocation, short))
                return False
            try:
                await asyncio.to_thread(self.slices.resume, kernel_id)
            except CapacityError as still:
                self._notice(allocation, _waiting(allocation, still))
                return False
        self._notice(allocation, None)
        self.log.info("jupyter_vgpu: kernel %s resumed", kernel_id)
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
        if allocations is None:
            allocations = self.slices.ledger.allocations()
        candidates = self._idle_on_device(wanted.device_uuid, allocations, exclude=wanted.exclude)
        if wanted.short is not None and not _could_make_up(wanted.short, candidates):
            return False
        for candidate in candidates:
            if await self._suspend_to_make_room(candidate, wanted.for_whom) is not None and wanted.fits():
                return True
        return False

    async def suspend_for_others(self, allocation: Allocation) -> bool:
        """Suspend an idle kernel the node's broker asked for, to make room for another user's
        kernel (server/room.py); whether it is suspended."""
        return await self._suspend_to_make_room(allocation, "another user's kernel") is not None

    async def _suspend_to_make_room(self, candidate: Allocation, for_whom: str) -> Allocation | None:
        """Suspend ``candidate`` to make room for ``for_whom``, telling its user so; None (logged)
        where it cannot be suspended."""
        try:
            suspended = await asyncio.to_thread(
                self.slices.suspend, candidate.kernel_id, lock_timeout=self.lock_timeout
            )
        except (NotSupported, CheckpointError, UnknownSlice) as why:
            self.log.info("jupyter_vgpu: kernel %s not suspended to make room: %s", candidate.kernel_id, why)
            return None
        self._notice(suspended, suspended_notice(f"suspended to make room for {for_whom}", suspended))
        return suspended

    def _idle_on_device(
        self, device_uuid: str | None, allocations: list[Allocation], *, exclude: str
    ) -> list[Allocation]:
        """This server's running kernels (on the device, where one is named) that run no cell,
        least recently active first."""
        idle = []
        for candidate in allocations:
            kernel_id = candidate.kernel_id
            if kernel_id == exclude or candidate.suspended or device_uuid not in (None, candidate.device_uuid):
                continue
            if candidate.holder != "local":
                continue
            if kernel_id not in self.kernels or self._busy(kernel_id):
                continue
            last_activity = getattr(self.kernels.get_kernel(kernel_id), "last_activity", None)
            idle.append((last_activity.timestamp() if last_activity else 0.0, candidate))
        return [candidate for _, candidate in sorted(idle, key=lambda pair: pair[0])]

    def _busy(self, kernel_id: str) -> bool:
        return getattr(self.kernels.get_kernel(kernel_id), "execution_state", "") == "busy"

    # -- the idle step -------------------------------------------------------------------------

    async def suspend_idle(self, allocation: Allocation, idle_for: float) -> bool:
        """Suspend a kernel idle for ``idle_for`` seconds; False where it cannot be (its notice
        then says why, once: the idle policy culls it later as before)."""
        kernel_id = allocation.kernel_id
        if isinstance(allocation.metadata.get(SUSPEND_NOTICE_KEY), dict):
            return False  # refused before, said why; lowering and culling go on
        held = self.slices.status(allocation).usage.memory_used
        if not held:
            return False  # nothing to lend yet (a kernel that has not used the GPU): asked again later
        if self.host_memory_cap is not None:
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
            self.log.info("jupyter_vgpu: idle kernel %s not suspended this time: %s", kernel_id, busy)
            return False  # tried again at the next tick
        notice = suspended_notice(f"suspended after {format_duration(self.suspend_after)} idle", suspended)
        self._notice(suspended, notice)
        self.log.info("jupyter_vgpu: kernel %s %s", kernel_id, notice)
        return True

    # -- notices -------------------------------------------------------------------------------

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


def suspended_notice(why: str, suspended: Allocation) -> str:
    """A suspended kernel's notice: why, how much moved to host memory, and about how long its
    resume will take: its memory copied back over the same link, so about the seconds the
    suspend took (1 s at the least), where they are known. "suspended after 20 min idle: 3.2GiB
    moved to host memory; resumes when a cell runs, about 1 s"."""
    timings = suspended.metadata.get(SUSPEND_TIMINGS_KEY)
    took = timings.get("suspend") if isinstance(timings, dict) else None
    about = f", about {format_duration(max(1.0, float(took)))}" if isinstance(took, (int, float)) else ""
    return f"{why}: {format_size(suspended.host_memory)} moved to host memory; resumes when a cell runs{about}"


def _could_make_up(short: CapacityError, candidates: list[Allocation]) -> bool:
    """Whether suspending all ``candidates`` could give back what ``short`` says is missing
    (memory in bytes, or an SM share in percent)."""
    missing = short.requested - short.available
    if short.resource == "memory":
        return sum(candidate.memory_limit for candidate in candidates) >= missing
    if short.resource == "sm_share":
        return sum(candidate.sm_share for candidate in candidates) >= missing
    return bool(candidates)


def _waiting(allocation: Allocation, short: CapacityError) -> str:
    gpu = f"GPU {allocation.device_index}"
    if short.resource == "memory":
        wanted = format_size(short.requested - short.available)
        return (
            f"waiting for {wanted} on {gpu}, held by running kernels ({format_size(short.requested)} in all); "
            "this kernel resumes when it is free"
        )
    return f"waiting for room on {gpu}: {short}; this kernel resumes when it is free"


__all__ = ["SUSPEND_LOCK_TIMEOUT_SETTING", "SUSPEND_SETTING", "SuspendedKernels"]
