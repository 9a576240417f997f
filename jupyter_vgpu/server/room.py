"""Making room across a node's users (issue 18), a user's server's side: where the ledger is the
node's broker, the server reports each of its kernels' activity in the kernel's slice metadata
(``activity``: when it was last active, whether a cell runs), and suspends the kernels the broker
asked it to (``suspend_requested``, recorded by the broker when another start or resume did not
fit), at each tick of the slice watcher.

The broker decides whose idle kernel makes room; only the kernel's own server acts on it, through
the same suspend as an idle one (the broker lends the room only once NVML shows the kernel's
processes hold none). A kernel that runs a cell, or ran since it was asked, is not suspended, and
its next report makes the broker withdraw the request; except borrowed room taken back for a
kernel within its owner's guarantee (``take_back`` in the request), which is given back even
mid-cell: the cell's CUDA calls wait, and it carries on when room frees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jupyter_vgpu.ledger import (
    ACTIVITY_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    TAKE_BACK_KEY,
    Allocation,
    LedgerError,
    UnknownSlice,
)
from jupyter_vgpu.server.idle import known_idle
from jupyter_vgpu.server.suspend import SuspendedKernels


def activity_of(kernel: Any, allocation: Allocation) -> dict[str, Any] | None:
    """What the broker is told of a kernel's activity; None while it starts again or is dead. A
    kernel not known to run no cell (the pool's rule, server/idle.py's known_idle) is busy."""
    state = getattr(kernel, "execution_state", "")
    last_activity = getattr(kernel, "last_activity", None)
    if state in ("restarting", "dead") or last_activity is None:
        return None
    return {"last_activity": last_activity.timestamp(), "busy": not known_idle(kernel, allocation)}


class RoomForOthers:
    """Reports this server's kernels' activity to the broker and carries out its suspend requests."""

    def __init__(self, suspended: SuspendedKernels, *, clock: Callable[[], float] = time.time):
        self.suspended = suspended
        self.clock = clock

    async def check(self, allocations: list[Allocation]) -> None:
        """One tick: a report where a kernel's activity changed (one request each), and a suspend
        for each kernel the broker asked for that has stayed idle since."""
        slices, kernels = self.suspended.slices, self.suspended.kernels
        for allocation in allocations:
            kernel_id = allocation.kernel_id
            if allocation.suspended or allocation.holder != "local" or kernel_id not in kernels:
                continue
            activity = activity_of(kernels.get_kernel(kernel_id), allocation)
            if activity is None:
                continue
            # Whether its processes hold anything on the GPU: one that holds nothing is only lent
            # (no host memory), and the broker takes such room first.
            activity["uses_gpu"] = slices.status(allocation).usage.memory_used > 0
            try:
                if allocation.metadata.get(ACTIVITY_KEY) != activity:
                    # The broker's answer drops a request this activity overtook.
                    allocation = slices.ledger.update_metadata(kernel_id, **{ACTIVITY_KEY: activity})
            except (UnknownSlice, LedgerError):
                continue  # released meanwhile; or the broker is down, which the watcher reports
            request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
            at = request.get("at") if isinstance(request, dict) else None
            if not isinstance(at, (int, float)) or self.clock() - at > SUSPEND_REQUEST_TIMEOUT_S:
                continue  # none, or the broker has asked others instead
            if isinstance(request, dict) and request.get(TAKE_BACK_KEY) is True:
                # Borrowed room, taken back for someone within their guarantee: even mid-cell. Its
                # CUDA calls already wait in libvgpu.so (the broker raised its page's flag), so its
                # GPU work drains before the lock; the cell carries on when the room is back.
                await self.suspended.give_back_borrowed(allocation)
                continue
            if activity["busy"] or activity["last_activity"] > at:
                continue
            await self.suspended.suspend_for_others(allocation)


__all__ = ["RoomForOthers", "activity_of"]
