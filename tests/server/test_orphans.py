"""A slice is released only when none of its processes holds the device: a server killed with
SIGKILL and started again stops the processes its gone kernel left (a child in a session of its
own, and that child's child) before it releases the kernel's slice, so the memory they held is
free for the next promise. The kernel does not outlive its server here (``kernel_survival`` 0:
a kernel that does is adopted with its children, tests/server/test_kernels_outlive_server.py).
A real server process, a real kernel, real processes on one simulated 16 GiB GPU."""

from __future__ import annotations

import ctypes
import os

import pytest
import test_server_process
from support import CUDA_PRELUDE, running, wait_for
from test_server_process import KERNEL_NAME, Server, run_code

GIB = 1 << 30
PR_SET_CHILD_SUBREAPER = 36
# The user's environment and kernelspec of the server-process tests.
user_env = test_server_process.user_env
vgpu_kernelspec_dir = test_server_process.vgpu_kernelspec_dir


# run_code's client, patient with a kernel's heartbeat on a busy machine.


# Holds 1 GiB of the slice, starts what its argument says (or nothing), prints its pid and that
# one's, and waits for ever.
HOLDER = (
    CUDA_PRELUDE
    + """
import os, subprocess, sys
assert allocate(1 << 30) == 0
pids = [os.getpid()]
if len(sys.argv) > 1:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
    pids += [int(pid) for pid in child.stdout.readline().split()]
print(*pids, flush=True)
import threading; threading.Event().wait()
"""
)
# The kernel starts a child in a session (and process group) of its own, which starts a grandchild.
KERNEL_CODE = f"""
import os, subprocess, sys
HOLDER = {HOLDER!r}
child = subprocess.Popen([sys.executable, "-c", HOLDER, HOLDER], start_new_session=True,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
print(os.getpid(), child.stdout.readline().strip())
"""


@pytest.fixture
def reaper():
    """This test process adopts the orphans of its descendants, as init does (the init of some
    containers never reaps them); returns a function that reaps the given pids once they exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    def reap(pids: list[int]) -> bool:
        for pid in pids:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    return False
            except ChildProcessError:
                pass  # reaped already, or never adopted
        return True

    yield reap
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_a_killed_servers_restart_stops_a_gone_kernels_children_before_releasing_its_slice(user_env, tmp_path, reaper):
    server = Server(tmp_path, user_env, "--VGPUApp.kernel_survival=0")
    started = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "4GiB"})
    kernel_id = started["kernel"]["id"]
    kernel_pid, child, grandchild = map(int, run_code(user_env, kernel_id, KERNEL_CODE).split())
    (listed,) = server.api("GET", "api/vgpu/slices")
    assert {p["pid"] for p in listed["usage"]["processes"]} == {child, grandchild}
    assert os.getpgid(child) != os.getpgid(kernel_pid)  # out of reach of the kernel's process group

    server.kill()
    wait_for(lambda: not running(kernel_pid), 30, "the kernel to end with its server")
    assert running(child) and running(grandchild)  # what it started lives on, holding 1 GiB
    restarted = Server(tmp_path, user_env)
    try:
        # The start-up reconcile stopped them before it released the slice, not after.
        assert not running(child) and not running(grandchild) and not running(kernel_pid)
        assert restarted.api("GET", "api/vgpu/slices") == []
        wait_for(lambda: reaper([kernel_pid, child, grandchild]), 10, "the stopped processes to be reaped")
        (device,) = restarted.api("GET", "api/vgpu/devices")
        assert device["memory_outside_bytes"] == 0 and device["memory_free_bytes"] == 16 * GIB
        # The whole GPU can be promised again, and is really there.
        whole = restarted.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "16GiB"})
        assert run_code(user_env, whole["kernel"]["id"], CUDA_PRELUDE + "print(allocate(16 << 30))").strip() == "0"
    finally:
        restarted.stop()
