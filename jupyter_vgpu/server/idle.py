"""Idle kernels (a classroom policy): an idle kernel's SM share is lowered to a floor and given
back when it runs again; a kernel idle for longer is stopped, which frees its GPU memory.

Applied by the user's own single-user server, where kernel activity is known (jupyter_server's
``execution_state`` and ``last_activity`` of each kernel it manages): a cooperative policy, in
the same trust boundary as the interposer. Decisions go through the slice manager, so a share
given back is admitted like any resize (against the GPU, and the user's budget when the ledger
is the node's broker).

What the policy remembers of a lowered slice (the share it had, when it was lowered, the notice
for the notebook) is kept in the slice's metadata in the ledger, so a restarted server keeps it.
Notices of stopped kernels, whose slices are gone, are kept here for a bounded time and count.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_vgpu.ledger import SUSPENDED_KEY, Allocation, CapacityError, LedgerError, UnknownSlice
from jupyter_vgpu.ledger.policy import runs_no_cell, woken_at
from jupyter_vgpu.manager import ADOPTED_KEY, ORPHANED_KEY, SliceManager
from jupyter_vgpu.model import format_size

# The slice metadata the policy keeps: {"share": percent before lowering, "lowered_at": epoch
# seconds of the lowering (or of the last refused restore), "notice": text for the notebook}.
IDLE_KEY = "idle"
# The slice metadata of suspending (server/suspend.py): the notice for the notebook (suspended,
# waiting for room), or {"refused": why} where the kernel cannot be suspended (said once).
SUSPEND_NOTICE_KEY = "suspend_notice"
# Where the handlers find the server's policy (for GET /api/vgpu/notices).
IDLE_SETTING = "jupyter_vgpu_idle_kernels"
KEEP_NOTICES_FOR = 24 * 3600.0
MAX_NOTICES = 1000


def known_idle(kernel: Any, allocation: Allocation) -> bool:
    """Whether one of this server's kernels is known to run no cell, by the pool's rule
    (ledger/policy.py's ``runs_no_cell``): a kernel adopted after a restart that still reads
    "starting" may run a cell that began before this server watched it, and counts as busy."""
    adopted = isinstance(allocation.metadata.get(ADOPTED_KEY), dict)
    return runs_no_cell(getattr(kernel, "execution_state", None), adopted=adopted)


def idle_notice(allocation: Allocation) -> str | None:
    """What the idle policy has to tell about a slice's kernel (suspended, waiting to resume, why
    it could not be suspended, lowered, not restored), or None."""
    suspend_notice = allocation.metadata.get(SUSPEND_NOTICE_KEY)
    if isinstance(suspend_notice, dict):
        suspend_notice = suspend_notice.get("refused")
    if isinstance(suspend_notice, str) and suspend_notice:
        return suspend_notice
    state = allocation.metadata.get(IDLE_KEY)
    notice = state.get("notice") if isinstance(state, dict) else None
    return notice if isinstance(notice, str) and notice else None


def format_duration(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``20 min``, ``2 h``, ``1.5 d``."""
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{round(seconds / length, 1):g} {unit}"
    return f"{round(seconds, 1):g} s"


class IdleKernels:
    """The idle policy of one server: :meth:`check` looks at every sliced kernel the server's
    kernel manager runs and lowers, restores or stops it. ``lower_after`` and ``cull_after``
    are seconds (0: never)."""

    def __init__(
        self,
        slices: SliceManager,
        kernels: Any,
        *,
        lower_after: float = 0.0,
        floor_cores: int = 5,
        cull_after: float = 0.0,
        suspend_after: float = 0.0,
        suspend: Callable[[Allocation, float], Awaitable[bool]] | None = None,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        clock: Callable[[], float] = time.time,
        keep_notices_for: float = KEEP_NOTICES_FOR,
        max_notices: int = MAX_NOTICES,
    ):
        self.slices = slices
        self.kernels = kernels  # jupyter_server's MappingKernelManager
        self.lower_after = lower_after
        self.floor_cores = floor_cores
        self.cull_after = cull_after
        # Suspends an idle kernel to host memory (server/suspend.py); False where it could not.
        self.suspend_after = suspend_after if suspend is not None else 0.0
        self.suspend = suspend
        self.log = log or logging.getLogger(__name__)
        self.clock = clock
        self.keep_notices_for = keep_notices_for
        self.max_notices = max_notices
        self._culled: OrderedDict[str, tuple[float, str]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.lower_after or self.cull_after or self.suspend_after)

    def describe(self) -> str:
        """The policy in a line for the server's log: ``idle kernels: lowered to 5% of the SMs
        after 10 min, never suspended, stopped after 1 h``."""
        lowered = (
            f"lowered to {self.floor_cores}% of the SMs after {format_duration(self.lower_after)}"
            if self.lower_after
            else "never lowered"
        )
        suspended = (
            f"suspended to host memory after {format_duration(self.suspend_after)}"
            if self.suspend_after
            else "never suspended"
        )
        stopped = f"stopped after {format_duration(self.cull_after)}" if self.cull_after else "never stopped"
        return f"idle kernels: {lowered}, {suspended}, {stopped}"

    # -- notices of stopped kernels ----------------------------------------------------------

    def notices(self) -> dict[str, str]:
        """Why kernels were stopped (kernel id -> notice), the last ``keep_notices_for`` seconds."""
        self._forget_old()
        return {kernel_id: text for kernel_id, (_, text) in self._culled.items()}

    def _remember(self, kernel_id: str, text: str) -> None:
        self._culled.pop(kernel_id, None)
        self._culled[kernel_id] = (self.clock(), text)
        self._forget_old()

    def _forget_old(self) -> None:
        oldest = self.clock() - self.keep_notices_for
        while self._culled and (len(self._culled) > self.max_notices or next(iter(self._culled.values()))[0] < oldest):
            self._culled.popitem(last=False)

    def stop_deadline(self, allocation: Allocation) -> float | None:
        """When (epoch seconds) the idle timer stops the kernel of a running slice, as
        :meth:`check` decides it; None where no timer will (no ``cull_after``, a cell runs, or
        the server does not know the kernel's activity)."""
        if not self.cull_after or allocation.kernel_id not in self.kernels:
            return None
        kernel = self.kernels.get_kernel(allocation.kernel_id)
        last_activity = getattr(kernel, "last_activity", None)
        if getattr(kernel, "execution_state", "") in ("busy", "restarting", "dead") or last_activity is None:
            return None
        return float(max(last_activity.timestamp(), woken_at(allocation))) + self.cull_after

    # -- the policy --------------------------------------------------------------------------

    async def check(self, allocations: list[Allocation] | None = None) -> None:
        """One pass over this server's sliced kernels, given the ledger's ``allocations`` as the
        slice watcher just read them (None: read them here)."""
        if not self.enabled:
            return
        if allocations is None:
            try:
                allocations = self.slices.ledger.allocations()
            except LedgerError:
                return  # the slice watcher says that the ledger does not answer
        by_kernel = {allocation.kernel_id: allocation for allocation in allocations}
        for kernel_id in list(self.kernels.list_kernel_ids()):
            allocation = by_kernel.get(kernel_id)
            if allocation is None or kernel_id not in self.kernels:
                continue
            try:
                await self._check_kernel(self.kernels.get_kernel(kernel_id), allocation)
            except (UnknownSlice, KeyError):
                continue  # stopped or released meanwhile
            except (LedgerError, CapacityError, ValueError) as error:
                self.log.warning("jupyter_vgpu: idle kernel %s not handled: %s", kernel_id, error)
        for allocation in allocations:
            if allocation.kernel_id in self.kernels:
                continue
            try:
                self._check_orphan(allocation)
            except LedgerError as error:
                self.log.warning("jupyter_vgpu: kernel %s not handled: %s", allocation.kernel_id, error)

    def _check_orphan(self, allocation: Allocation) -> None:
        """Stop a kernel that outlived a server restart while suspended (manager.py's
        ``ORPHANED_KEY``) once it has been suspended for ``cull_after`` seconds: nobody resumed
        it, and only its processes hold its host memory. Its processes first, then its slice."""
        state = allocation.metadata.get(SUSPENDED_KEY)
        if not self.cull_after or not isinstance(allocation.metadata.get(ORPHANED_KEY), dict):
            return
        if not isinstance(state, dict) or self.clock() - float(state.get("at", 0)) <= self.cull_after:
            return
        kernel_id = allocation.kernel_id
        notice = (
            f"stopped after {format_duration(self.cull_after)} suspended, not resumed since its server "
            f"restarted, to free {format_size(allocation.host_memory)} of host memory"
        )
        if self.slices.release_gone(allocation) is not None:
            self._remember(kernel_id, notice)
            self.log.info("jupyter_vgpu: kernel %s %s", kernel_id, notice)

    async def _check_kernel(self, kernel: Any, allocation: Allocation) -> None:
        state = getattr(kernel, "execution_state", "")
        last_activity = getattr(kernel, "last_activity", None)
        # "starting" stays until a client first talks to the kernel (jupyter_server learns its
        # state from the messages it relays), so a kernel started and never opened counts as idle
        # from its start, as jupyter_server's own culler counts it. A kernel a restarted server
        # adopted reads "busy" until it said what it does (server/adopt.py), and no state nobody
        # knows counts as idle (the pool's rule: known_idle).
        if state in ("restarting", "dead") or last_activity is None:
            return
        now = self.clock()
        # A kernel its user turned to (the lab's sign, POST .../wake) counts as active from then.
        active_at = max(last_activity.timestamp(), woken_at(allocation))
        busy = not known_idle(kernel, allocation)
        idle_for = 0.0 if busy else now - active_at
        if allocation.suspended:
            # Its memory is in host memory; server/suspend.py resumes it when it runs again.
            if self.cull_after and idle_for > self.cull_after:
                await self._cull(allocation)
            return
        lowered = allocation.metadata.get(IDLE_KEY)
        if isinstance(lowered, dict) and lowered.get("share"):
            if allocation.sm_share != self.floor_cores:
                # Resized by hand since it was lowered: that size is the one to keep.
                self.slices.ledger.update_metadata(allocation.kernel_id, **{IDLE_KEY: None})
                return
            if busy or active_at > float(lowered.get("lowered_at", 0)):
                self._restore(allocation, int(lowered["share"]), now)
                return
        if self.cull_after and idle_for > self.cull_after:
            await self._cull(allocation)
        elif (
            self.suspend is not None
            and self.suspend_after
            and idle_for > self.suspend_after
            and await self.suspend(allocation, idle_for)
        ):
            return
        elif self.lower_after and idle_for > self.lower_after and allocation.sm_share > self.floor_cores:
            self._lower(allocation, now)

    def _lower(self, allocation: Allocation, now: float) -> None:
        kernel_id = allocation.kernel_id
        self.slices.resize(kernel_id, cores=self.floor_cores)
        notice = (
            f"lowered to {self.floor_cores}% of the SMs after {format_duration(self.lower_after)} idle; "
            "restored when it runs again"
        )
        self.slices.ledger.update_metadata(
            kernel_id, **{IDLE_KEY: {"share": allocation.sm_share, "lowered_at": now, "notice": notice}}
        )
        self.log.info("jupyter_vgpu: kernel %s %s (it had %d%%)", kernel_id, notice, allocation.sm_share)

    def _restore(self, allocation: Allocation, share: int, now: float) -> None:
        kernel_id = allocation.kernel_id
        try:
            self.slices.resize(kernel_id, cores=share)
        except CapacityError as error:
            notice = f"kept at {self.floor_cores}% of the SMs: its {share}% did not fit when it ran again ({error})"
            # The next activity after this attempt tries again.
            self.slices.ledger.update_metadata(
                kernel_id, **{IDLE_KEY: {"share": share, "lowered_at": now, "notice": notice}}
            )
            self.log.info("jupyter_vgpu: kernel %s %s", kernel_id, notice)
            return
        self.slices.ledger.update_metadata(kernel_id, **{IDLE_KEY: None})
        self.log.info("jupyter_vgpu: kernel %s runs again: its %d%% of the SMs restored", kernel_id, share)

    async def _cull(self, allocation: Allocation) -> None:
        kernel_id = allocation.kernel_id
        memory = f"its {format_size(allocation.memory_limit)} of GPU memory" if allocation.memory_limit else "its GPU"
        notice = (
            f"stopped after {format_duration(self.cull_after)} idle to free {memory}; "
            "start it again from the Kernel menu"
        )
        self._remember(kernel_id, notice)
        self.log.info("jupyter_vgpu: kernel %s %s", kernel_id, notice)
        await self.kernels.shutdown_kernel(kernel_id)


__all__ = ["IDLE_KEY", "IDLE_SETTING", "SUSPEND_NOTICE_KEY", "IdleKernels", "format_duration", "idle_notice"]
