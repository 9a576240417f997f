"""Suspending a local slice's kernel to host memory and resuming it (issue 18): the order of the
steps between the ledger, the limits page and the driver's checkpoint API, which
:class:`~jupyter_vgpu.manager.SliceManager` drives.

Suspend: the slice's processes (the region's slots, the kernel, and what NVML lists descending
from them) are probed (see :meth:`CheckpointController.probe`), the page's suspended flag is
raised (from then on a CUDA call of theirs counts a resume request, then waits in libvgpu.so
until the flag is cleared), they are locked within a timeout and checkpointed, and only then,
once they hold nothing on the device, does the ledger lend the slice's room (a broker checks NVML first; where it refuses, the processes
are restored into the room that is still theirs). Resume: the ledger admits the slice on its device again
FIRST, then the processes are restored and unlocked and the flag cleared, because on current
drivers a restore that fails for lack of memory can leave a process unrecoverable.

Every call blocks (locks wait, checkpoints copy): call them from a worker thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from jupyter_vgpu.holders.checkpoint import (
    CheckpointController,
    CheckpointError,
    NoRoomToRestore,
    SuspendedProcess,
    SuspendRefused,
    Suspension,
)
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.ledger import SUSPEND_TIMINGS_KEY, SUSPENDED_KEY, Allocation, CapacityError, Ledger, NotSupported
from jupyter_vgpu.ledger.policy import RESUMED_AT
from jupyter_vgpu.model import format_size


class Suspender:
    """Suspends and resumes the local slices of one ledger. The checkpoint controller, which
    loads the CUDA driver into this process and calls ``cuInit``, is made on first use."""

    def __init__(self, ledger: Ledger, holder: LocalHolder, *, controller: CheckpointController | None = None):
        self.ledger = ledger
        self.holder = holder
        self._controller = controller
        self._making = threading.Lock()
        # Kernel id -> "suspending" or "resuming" while its memory moves: the ledger says running
        # until a suspend has lent the room, and again as soon as a resume has it back, long
        # before a large checkpoint has been copied.
        self._moving: dict[str, str] = {}

    @property
    def controller(self) -> CheckpointController:
        with self._making:
            if self._controller is None:
                self._controller = CheckpointController()
            return self._controller

    def moving(self, kernel_id: str) -> str | None:
        """While a suspend or resume of the kernel is under way, "suspending" or "resuming"; else None."""
        return self._moving.get(kernel_id)

    @contextlib.contextmanager
    def _under_way(self, kernel_id: str, transition: str) -> Iterator[None]:
        self._moving[kernel_id] = transition
        try:
            yield
        finally:
            if self._moving.get(kernel_id) == transition:
                del self._moving[kernel_id]

    def pids(self, allocation: Allocation) -> list[int]:
        return sorted(self.holder.slice_processes(allocation))

    def why_not(self, allocation: Allocation) -> tuple[str, ...]:
        """Why this slice cannot be suspended here (empty where it can)."""
        if allocation.holder != self.holder.kind:
            why = f"kernels of {allocation.holder} slices are not suspended (the cluster's scheduler still counts"
            return (f"{why} the pod's grant)",)
        managed = self.holder.uses_managed_memory(allocation)
        return self.controller.probe(self.pids(allocation), managed_memory=managed).reasons

    def suspend(self, allocation: Allocation, *, lock_timeout: float, release_wait: float = 2.0) -> Allocation:
        """Suspend the slice's processes and lend its room; returns the suspended allocation. A
        slice whose processes have not used the GPU yet is lent as it is (``Allocation.lent``).
        First its processes give back the device memory they keep cached but do not use (the
        driver's pools, PyTorch's and CuPy's caches), waiting up to ``release_wait`` seconds for
        their answers, so that only what the program holds moves to host memory.
        Raises NotSupported (with every reason) where it cannot be, SuspendRefused (its
        processes left running) where one did not stop its GPU work within ``lock_timeout``."""
        if allocation.suspended:
            return allocation
        reasons = self.why_not(allocation)
        if reasons:
            raise NotSupported(f"kernel {allocation.kernel_id} cannot be suspended: {'; '.join(reasons)}")
        with self._under_way(allocation.kernel_id, "suspending"):
            return self._suspend(allocation, lock_timeout=lock_timeout, release_wait=release_wait)

    def _suspend(self, allocation: Allocation, *, lock_timeout: float, release_wait: float) -> Allocation:
        # Resume requests counted before the flag goes up were made while it ran; every call from
        # then on waits for the flag to clear (in libvgpu.so), so each one asks for the resume.
        requests_before = self.holder.resume_requests(allocation)
        # Before the flag: releasing calls the driver (cuMemFree, cuMemPoolTrimTo), which would
        # wait in libvgpu.so once it is raised.
        started = time.monotonic()
        released = self.holder.release_cached(allocation, wait=release_wait) if release_wait > 0 else {}
        release_seconds = time.monotonic() - started
        self.holder.set_suspended(allocation, True)
        try:
            suspension = self.controller.suspend(self.pids(allocation), lock_timeout=lock_timeout)
        except BaseException:
            self.holder.set_suspended(allocation, False)
            raise
        details = {
            "processes": [asdict(process) for process in suspension.processes],
            "resume_requests": requests_before,
            # No process of it has used the GPU yet: nothing moved, its room is only lent, and its
            # first CUDA call waits (in libvgpu.so, the page's flag stays raised) until it is back.
            "lent": not suspension.processes,
            # Cached device memory its processes gave back first, by source (bytes), not moved.
            "released": released,
        }
        try:
            suspended = self.ledger.suspend(allocation.kernel_id, host_memory=suspension.memory, details=details)
        except BaseException:
            # Not lent (a broker refused it, or could not be asked): the room is still the slice's,
            # so its processes are restored into it and run on.
            self.controller.resume(suspension)
            self.holder.set_suspended(allocation, False)
            raise
        return self._timed(suspended, suspend=suspension.seconds, release=release_seconds)

    def resume(self, allocation: Allocation) -> Allocation:
        """Admit the slice on its device again, then restore its processes; returns the resumed
        allocation. Raises CapacityError (it stays suspended, nothing restored) where its room
        is taken."""
        if not allocation.suspended:
            return allocation
        # The room first: while the ledger refuses it (another holds it, a claimant within a
        # guarantee, say) the slice reads suspended; "resuming" only once the memory moves back.
        resumed = self.ledger.resume(allocation.kernel_id)
        with self._under_way(allocation.kernel_id, "resuming"):
            return self._restore(allocation, resumed)

    def _restore(self, allocation: Allocation, resumed: Allocation) -> Allocation:
        state: dict[str, Any] = allocation.metadata[SUSPENDED_KEY]
        suspension = Suspension(tuple(SuspendedProcess(**process) for process in state.get("processes", [])))
        try:
            seconds = self.controller.resume(suspension)
        except NoRoomToRestore as no_room:
            # The ledger had room but the device did not (memory held outside any slice appeared
            # meanwhile): lend the room again and wait like any slice that does not fit.
            self.ledger.suspend(allocation.kernel_id, host_memory=allocation.host_memory, details=state)
            raise CapacityError(
                f"kernel {allocation.kernel_id!r} cannot resume yet: its processes need "
                f"{format_size(no_room.needed)} on the GPU, which has {format_size(no_room.free)} free",
                resource="memory",
                requested=no_room.needed,
                available=no_room.free,
            ) from None
        except CheckpointError as failed:
            # The driver did not restore every process (a restore refused for memory that vanished
            # after the check): the slice goes back to suspended, its room lent again and its flag
            # still raised, so nothing runs half-restored; the line tries again later.
            self.ledger.suspend(allocation.kernel_id, host_memory=allocation.host_memory, details=state)
            raise CheckpointError(
                f"kernel {allocation.kernel_id!r} was not resumed and stays suspended, its memory in host "
                f"memory ({failed}); it is tried again"
            ) from failed
        self.holder.set_suspended(resumed, False)
        # When it got its room back: room-making leaves it alone for a while (ledger/policy.py's hold).
        return self._timed(resumed, resume=seconds, **{RESUMED_AT: time.time()})

    def resume_requested(self, allocation: Allocation) -> bool:
        """Whether a process of the suspended slice made a CUDA call since it was suspended."""
        state = allocation.metadata.get(SUSPENDED_KEY)
        if not isinstance(state, dict):
            return False
        return self.holder.resume_requests(allocation) > int(state.get("resume_requests", 0))

    def answer_requests(self, allocation: Allocation, **fields: Any) -> Allocation:
        """Count the resume requests the suspended slice's processes made so far as answered (only a
        later CUDA call asks again), with ``fields`` of metadata besides; the updated allocation."""
        state = allocation.metadata.get(SUSPENDED_KEY)
        answered = {
            **(state if isinstance(state, dict) else {}),
            "resume_requests": self.holder.resume_requests(allocation),
        }
        return self.ledger.update_metadata(allocation.kernel_id, **{SUSPENDED_KEY: answered}, **fields)

    def _timed(self, allocation: Allocation, **seconds: float) -> Allocation:
        timings = allocation.metadata.get(SUSPEND_TIMINGS_KEY)
        timings = {**(timings if isinstance(timings, dict) else {}), **seconds, "at": time.time()}
        with contextlib.suppress(KeyError):
            return self.ledger.update_metadata(allocation.kernel_id, **{SUSPEND_TIMINGS_KEY: timings})
        return allocation


__all__ = ["SuspendRefused", "Suspender"]
