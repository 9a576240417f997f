"""notebook/survive.py: the parent poller a sliced IPython kernel runs instead of ipykernel's. A
real process whose parent exits: it ends, as under ipykernel, unless its slice's limits page
says suspended, and then it stays (for the restarted server: tests/server/test_suspend_restart.py
shows the whole story with a real server and kernel)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import running, wait_for

from jupyter_vgpu.holders.local import LIMITS_VARIABLE, REGION_VARIABLE
from jupyter_vgpu.holders.region import LimitsPage
from jupyter_vgpu.model import SliceLimits

# Started by an intermediate process that exits at once: the poller's process loses its parent.
# It prints its pid, then the poller's verdict if it survives.
TARGET = """
import os, sys, threading, time
from jupyter_vgpu.notebook.survive import SuspendAwarePoller
poller = SuspendAwarePoller(parent_pid=int(sys.argv[1]))  # as ipykernel's $JPY_PARENT_PID
poller.start()
print(os.getpid(), flush=True)
poller.join()
print("outlived" if poller.outlived else "?", flush=True)
threading.Event().wait()
"""
INTERMEDIATE = f"""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {TARGET!r}, str(os.getpid())], stdout=sys.stdout)
"""


@pytest.mark.parametrize("suspended", [True, False])
def test_a_kernel_whose_server_is_gone_stays_only_while_its_slice_is_suspended(tmp_path, suspended):
    page = LimitsPage.create(
        tmp_path / "slice.region.limits", SliceLimits(1 << 30, 50), device_uuid="GPU-test", device_index=0
    )
    page.set_suspended(suspended)
    page.close()
    env = {**os.environ, REGION_VARIABLE: str(tmp_path / "slice.region"), LIMITS_VARIABLE: str(page.path)}
    # The intermediate exits once its child is started; the child's output comes through the pipe.
    with subprocess.Popen(
        [sys.executable, "-c", INTERMEDIATE], env=env, stdout=subprocess.PIPE, text=True
    ) as intermediate:
        assert intermediate.stdout is not None
        pid = int(intermediate.stdout.readline())
        intermediate.wait(30)
        try:
            if suspended:
                assert intermediate.stdout.readline().strip() == "outlived"
                assert running(pid)
            else:
                wait_for(lambda: not running(pid), 30, "the kernel ended, as under ipykernel")
                assert intermediate.stdout.readline() == ""  # it said nothing more
        finally:
            if running(pid):
                os.kill(pid, 9)
