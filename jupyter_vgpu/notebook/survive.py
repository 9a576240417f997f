"""A sliced IPython kernel outlives its server while it is suspended (issue 18).

ipykernel ends a kernel within a second of its parent, the Jupyter server, going away (its
``ParentPollerUnix``): a kernel a server can no longer reach would otherwise run on. A suspended
kernel is the exception worth keeping: it holds nothing on the GPU, and its user's variables
are in its host memory, so a server killed meanwhile (SIGKILL, a crash, the OOM killer) would
otherwise take them along. The extension (loaded in every sliced kernel) swaps ipykernel's poller
for one that does the same, except while the kernel's slice is suspended (its limits page says
so): then the kernel stays, for the restarted server to find it suspended and keep it (see
``SliceManager.reconcile``), and from then on its life is that server's and its user's: resumed
when asked, reached through its connection file, stopped there, or by the idle policy.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ipykernel.parentpoller import ParentPollerUnix

log = logging.getLogger(__name__)


def slice_suspended() -> bool:
    """Whether this kernel's slice is suspended, read from its limits page (False where there is
    none or it cannot be read: the kernel then ends as ipykernel's would)."""
    from jupyter_vgpu.holders.local import LIMITS_VARIABLE, REGION_VARIABLE
    from jupyter_vgpu.holders.region import LimitsPage, RegionError, default_limits_path

    region = os.environ.get(REGION_VARIABLE)
    if not region:
        return False
    try:
        with LimitsPage.open(os.environ.get(LIMITS_VARIABLE) or default_limits_path(region), writable=False) as page:
            return page.suspended
    except (RegionError, OSError):
        return False


class SuspendAwarePoller(ParentPollerUnix):
    """ipykernel's parent poller (ends the kernel when its parent is gone), except that a kernel
    that is ``suspended()`` at that moment stays: the poller then stops polling."""

    def __init__(self, parent_pid: int = 0, suspended: Callable[[], bool] = slice_suspended):
        super().__init__(parent_pid=parent_pid)
        self.suspended = suspended
        self.outlived = False  # set when the parent went away while the kernel was suspended

    def parent_gone(self) -> bool:
        ppid = os.getppid()
        return ppid != self.parent_pid if self.parent_pid else ppid == 1

    def run(self) -> None:
        if os.getppid() != self.parent_pid:
            self.parent_pid = 0  # as ipykernel's: a parent given that is not ours is not watched
        while not self.parent_gone():
            time.sleep(1.0)
        if not self.suspended():
            log.warning("Parent appears to have exited, shutting down.")
            os._exit(1)
        self.outlived = True
        log.warning("Parent appears to have exited while this kernel is suspended: it stays for the next server.")


def outlive_server_while_suspended(app: Any) -> bool:
    """Put a :class:`SuspendAwarePoller` in place of ipykernel's in ``app`` (an IPKernelApp not
    started yet); whether it did (not where the kernel watches no parent, or is not sliced)."""
    from jupyter_vgpu.holders.local import REGION_VARIABLE

    poller = getattr(app, "poller", None)
    if type(poller) is not ParentPollerUnix or poller.is_alive() or not os.environ.get(REGION_VARIABLE):
        return False
    app.poller = SuspendAwarePoller(parent_pid=poller.parent_pid)
    return True


__all__ = ["SuspendAwarePoller", "outlive_server_while_suspended", "slice_suspended"]
