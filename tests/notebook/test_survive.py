"""notebook/survive.py: the parent poller a sliced IPython kernel runs instead of ipykernel's. A
real process whose parent exits: it ends at once, as under ipykernel, unless its environment gives
it a survival time; then it waits that long for a server to adopt it (one named beside its
region, alive), watches that server as it watched its parent, and ends when nobody adopts it in
time. tests/server/test_kernels_outlive_server.py shows the whole story with a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import running, wait_for

from jupyter_vgpu.holders.local import REGION_VARIABLE, SURVIVAL_VARIABLE, adopted_by_path
from jupyter_vgpu.holders.region import process_start_time

# Started by an intermediate process that exits at once: the poller's process loses its parent.
# It prints its pid; the poller's lines go to its stderr.
TARGET = """
import os, sys, threading
from jupyter_vgpu.notebook.survive import SurvivingPoller
SurvivingPoller(parent_pid=int(sys.argv[1])).start()  # as ipykernel's $JPY_PARENT_PID
print(os.getpid(), flush=True)
threading.Event().wait()
"""
# It exits once the child has started its poller (the child's pid passed on).
INTERMEDIATE = f"""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {TARGET!r}, str(os.getpid())], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
print(child.stdout.readline(), end="", flush=True)
"""
GONE = "this kernel's server is gone; it stays 1 s for the next server to adopt it, with its variables"
ENDS = "no server adopted this kernel within 1 s; it ends"
ADOPTED = "a restarted server adopted this kernel"


def orphan(tmp_path, survival: str | None) -> tuple[int, subprocess.Popen]:
    """A process whose parent has exited, running the poller: its pid, and the intermediate
    (whose stderr pipe the orphan's lines come through)."""
    env = {**os.environ, REGION_VARIABLE: str(tmp_path / "slice.region")}
    env.pop(SURVIVAL_VARIABLE, None)
    if survival is not None:
        env[SURVIVAL_VARIABLE] = survival
    intermediate = subprocess.Popen(
        [sys.executable, "-c", INTERMEDIATE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert intermediate.stdout is not None
    pid = int(intermediate.stdout.readline())
    intermediate.wait(30)
    return pid, intermediate


def said(intermediate: subprocess.Popen) -> str:
    """The orphan's next line that is its poller's (without the logger's prefix)."""
    assert intermediate.stderr is not None
    while line := intermediate.stderr.readline():
        if "jupyter-vgpu: " in line:
            return line.split("jupyter-vgpu: ", 1)[1].strip()
    return ""


@pytest.mark.parametrize("survival", [None, "0"])
def test_without_a_survival_time_a_kernel_ends_with_its_server(tmp_path, survival):
    pid, intermediate = orphan(tmp_path, survival)
    try:
        wait_for(lambda: not running(pid), 30, "the kernel ended, as under ipykernel")
        assert said(intermediate) == ""  # it said nothing of staying
    finally:
        if running(pid):
            os.kill(pid, 9)


def test_a_kernel_nobody_adopts_stays_its_survival_time_then_ends(tmp_path):
    pid, intermediate = orphan(tmp_path, "1")
    try:
        assert said(intermediate) == GONE
        assert running(pid)
        assert said(intermediate) == ENDS
        wait_for(lambda: not running(pid), 30, "the kernel ended")
    finally:
        if running(pid):
            os.kill(pid, 9)


def test_an_adopted_kernel_watches_its_new_server_and_outlives_it_in_turn(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    pid, intermediate = orphan(tmp_path, "1")
    try:
        assert said(intermediate) == GONE
        # A server adopts it (server/adopt.py names itself beside the region).
        adopted_by_path(tmp_path / "slice.region").write_text(
            json.dumps({"pid": server.pid, "pid_start_time": process_start_time(server.pid), "url": ""})
        )
        assert said(intermediate) == ADOPTED
        assert running(pid)
        server.kill()  # that server dies in turn: the kernel outlives it too, for its survival time
        server.wait(30)
        assert said(intermediate) == GONE
        assert said(intermediate) == ENDS
        wait_for(lambda: not running(pid), 30, "the kernel ended")
    finally:
        server.kill()
        if running(pid):
            os.kill(pid, 9)
