"""A sliced IPython kernel outlives its server for a while, for a restarted server to adopt it
(issue 26).

ipykernel ends a kernel within a second of its parent, the Jupyter server, going away (its
``ParentPollerUnix``): a kernel a server can no longer reach would otherwise run on. A sliced
kernel holds its user's variables and, often, a model loaded on the GPU; a server killed
(SIGKILL, a crash, the OOM killer) or restarted for an upgrade would take them along. The
extension (loaded in every sliced kernel) swaps ipykernel's poller for one that waits instead,
running or suspended, for ``$JUPYTER_VGPU_KERNEL_SURVIVAL_S`` seconds (``VGPUApp.kernel_survival``
of the server that started it): a restarted server adopts it (``server/adopt.py``) and names
itself beside the kernel's region, and from then on the poller watches that server as it watched
its parent. A kernel nobody adopted in time ends as ipykernel's do; so does one whose adopting
server goes away and nobody adopts it again in time. Without the variable (0, or a kernel started
without a server) it ends with its parent at once, as ipykernel's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ipykernel.parentpoller import ParentPollerUnix

log = logging.getLogger(__name__)

# How often the poller looks (as ipykernel's).
POLL_INTERVAL_S = 1.0


def survival_seconds(environ: Any = os.environ) -> float:
    """How long this kernel outlives its server (``$JUPYTER_VGPU_KERNEL_SURVIVAL_S``; 0 where it
    is not set or not a number of seconds)."""
    from jupyter_vgpu.holders.local import SURVIVAL_VARIABLE

    try:
        value = float(environ.get(SURVIVAL_VARIABLE, "0"))
    except ValueError:
        return 0.0
    return value if 0 < value < float("inf") else 0.0


def adopting_server_alive() -> bool:
    """Whether a server adopted this kernel and still runs (the file beside its region names it)."""
    from jupyter_vgpu.holders.device_memory import process_running
    from jupyter_vgpu.holders.local import REGION_VARIABLE, read_adopted_by

    region = os.environ.get(REGION_VARIABLE)
    server = read_adopted_by(region) if region else None
    if not server:
        return False
    pid, start_time = server.get("pid"), server.get("pid_start_time")
    return isinstance(pid, int) and isinstance(start_time, int) and pid > 0 and process_running(pid, start_time)


class SurvivingPoller(ParentPollerUnix):
    """ipykernel's parent poller (ends the kernel when its parent is gone), except that the kernel
    then waits up to ``survival`` seconds for a server to adopt it (``adopted()``), and watches
    that server as it watched its parent. ``outlived`` counts the servers it outlived."""

    def __init__(
        self,
        parent_pid: int = 0,
        survival: float | None = None,
        adopted: Callable[[], bool] = adopting_server_alive,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(parent_pid=parent_pid)
        self.survival = survival_seconds() if survival is None else survival
        self.adopted = adopted
        self.clock = clock
        self.outlived = 0

    def parent_gone(self) -> bool:
        ppid = os.getppid()
        return ppid != self.parent_pid if self.parent_pid else ppid == 1

    def run(self) -> None:
        if os.getppid() != self.parent_pid:
            self.parent_pid = 0  # as ipykernel's: a parent given that is not ours is not watched
        while not self.parent_gone():
            time.sleep(POLL_INTERVAL_S)
        while self.survival > 0:
            self.outlived += 1
            log.warning(
                f"jupyter-vgpu: this kernel's server is gone; it stays {self.survival:g} s for the next server to "
                "adopt it, with its variables"
            )
            deadline = self.clock() + self.survival
            while not self.adopted():
                if self.clock() >= deadline:
                    log.warning(f"jupyter-vgpu: no server adopted this kernel within {self.survival:g} s; it ends")
                    os._exit(1)
                time.sleep(POLL_INTERVAL_S)
            log.warning("jupyter-vgpu: a restarted server adopted this kernel")
            while self.adopted():
                time.sleep(POLL_INTERVAL_S)
        log.warning("Parent appears to have exited, shutting down.")
        os._exit(1)


def outlive_server(app: Any) -> bool:
    """Put a :class:`SurvivingPoller` in place of ipykernel's in ``app`` (an IPKernelApp not
    started yet); whether it did (not where the kernel watches no parent, or is not sliced)."""
    from jupyter_vgpu.holders.local import REGION_VARIABLE

    poller = getattr(app, "poller", None)
    if type(poller) is not ParentPollerUnix or poller.is_alive() or not os.environ.get(REGION_VARIABLE):
        return False
    app.poller = SurvivingPoller(parent_pid=poller.parent_pid)
    return True


__all__ = ["SurvivingPoller", "adopting_server_alive", "outlive_server", "survival_seconds"]
