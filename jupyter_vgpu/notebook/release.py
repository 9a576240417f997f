"""Before a suspend, a sliced kernel gives back what PyTorch and CuPy keep cached on the GPU
(issue 26 item 2).

The driver's checkpoint copies everything a process holds on the device to host memory, what the
frameworks' allocators keep cached after the program freed it included. So before a suspend the
server bumps the limits page's ``release_request`` (region.h); in the kernel, a background thread
started by the extension (loaded in every sliced IPython kernel) sees it and, where the program
already imported them, calls ``torch.cuda.empty_cache()`` and CuPy's ``free_all_blocks()`` (its
device and pinned pools): only blocks no tensor or array uses go, never memory the program still
holds. It never imports either: a kernel that has not loaded one has nothing of it cached. It then
answers in the kernel's own slot of the region (``frameworks_answered`` and the bytes each gave
back), which only this process writes; libvgpu.so trims the driver's pools after that answer.

A slice's processes other than the kernel (a DataLoader worker, a subprocess) answer through
their libvgpu.so only: their frameworks' caches are not emptied.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1


def release_framework_caches(modules: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Empty the caches of PyTorch and CuPy where they are loaded (in ``modules``, default
    ``sys.modules``); returns the bytes each gave back (0 where it is not loaded or gave nothing)."""
    modules = sys.modules if modules is None else modules
    released = {"torch": 0, "cupy": 0}
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        # Not initialised: it holds nothing on the GPU, and asking would create a context.
        if cuda is not None and cuda.is_initialized():
            before = int(cuda.memory_reserved())
            cuda.empty_cache()
            released["torch"] = max(0, before - int(cuda.memory_reserved()))
    except Exception:  # a framework's failure never stops a suspend
        log.warning("jupyter_vgpu: torch.cuda.empty_cache() failed before a suspend", exc_info=True)
    cupy = modules.get("cupy")
    try:
        if cupy is not None:
            pool = cupy.get_default_memory_pool()
            before = int(pool.total_bytes())
            pool.free_all_blocks()
            released["cupy"] = max(0, before - int(pool.total_bytes()))
            cupy.get_default_pinned_memory_pool().free_all_blocks()  # host memory, not counted
    except Exception:
        log.warning("jupyter_vgpu: CuPy's free_all_blocks() failed before a suspend", exc_info=True)
    return released


class ReleaseWatcher(threading.Thread):
    """Watches the slice's limits page for release requests and answers them for this process
    (the kernel): empties the frameworks' caches, then writes the answer in its region slot. Says
    in the slot that it watches (``frameworks_watching``) once libvgpu.so claimed the slot."""

    def __init__(self, region_path: str, limits_path: str | None = None, *, poll: float = POLL_SECONDS):
        super().__init__(name="jupyter-vgpu-release", daemon=True)
        self.region_path = region_path
        self.limits_path = limits_path
        self.poll = poll
        self.stopped = threading.Event()

    def run(self) -> None:
        from jupyter_vgpu.holders.region import Region, RegionError

        try:
            region = Region.open(self.region_path, limits_path=self.limits_path, publisher=False)
        except (RegionError, OSError) as error:
            log.info("jupyter_vgpu: no release before a suspend for this kernel: %s", error)
            return
        with region:
            while not self.stopped.wait(self.poll):
                slot = region.own_slot()
                if slot is None:
                    continue  # no GPU call yet: nothing cached
                if not slot.frameworks_watching:
                    slot.frameworks_watching = 1
                request = region.page.release_request
                if request == 0 or slot.frameworks_answered == request:
                    continue
                released = release_framework_caches()
                slot.torch_released = released["torch"]
                slot.cupy_released = released["cupy"]
                slot.frameworks_answered = request  # last: the answer is whole when it is seen


_started: ReleaseWatcher | None = None


def watch_release_requests() -> ReleaseWatcher | None:
    """Start the watcher for this kernel's slice, once (None where the kernel runs in none)."""
    global _started
    from jupyter_vgpu.holders.local import LIMITS_VARIABLE, REGION_VARIABLE

    region = os.environ.get(REGION_VARIABLE)
    if not region or _started is not None:
        return _started
    _started = ReleaseWatcher(region, os.environ.get(LIMITS_VARIABLE) or None)
    _started.start()
    return _started


__all__ = ["ReleaseWatcher", "release_framework_caches", "watch_release_requests"]
