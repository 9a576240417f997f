"""What a device really holds beyond the slices' promises, read from NVML and attributed to
slices by process ancestry (what the node's broker can see of users' kernels): real processes on
a private simulated 16 GiB GPU, the reading made by a process of its own on the same machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from support import CUDA_PRELUDE, wait_for

GIB = 1 << 30

# Holds what its argument says, prints its pid, waits for stdin to close.
HOLDER = CUDA_PRELUDE + (
    "import os, sys\nassert allocate(int(sys.argv[1])) == 0\nprint(os.getpid(), flush=True)\nsys.stdin.read()\n"
)
# The same, holding until it is killed (a child whose parent dies loses its stdin).
HOLDER_UNTIL_KILLED = HOLDER.replace("sys.stdin.read()", "import threading; threading.Event().wait()")
# A kernel (no GPU use of its own) whose child, in a session of its own, holds what it is told.
KERNEL = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], start_new_session=True,"
    " stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
    "print(child.stdout.readline().strip(), flush=True)\nsys.stdin.read()\n"
)
# Reads the device as the broker does, for one allocation (on the machine's one GPU) given as JSON.
READER = """
import json, sys
from jupyter_vgpu.holders.device_memory import DeviceMemoryReader, kernel_pid
from jupyter_vgpu.ledger import Allocation
from jupyter_vgpu.model import list_devices, use_simulator
use_simulator()
(device,) = list_devices()
allocation = Allocation(**json.loads(sys.argv[1]), device_uuid=device.uuid)
seen = DeviceMemoryReader(kernel_pid)([allocation])[device.uuid]
print(json.dumps([seen.outside, seen.over_cap]))
"""


def start(env, code, *args) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def test_a_kernels_descendants_count_in_its_slice_and_others_outside_any(sim_env):
    outsider, _ = start(sim_env, HOLDER, str(GIB))
    kernel, child = start(sim_env, KERNEL, HOLDER_UNTIL_KILLED, str(3 * GIB))
    allocation = {
        "kernel_id": "k1",
        "device_index": 0,
        "memory_limit": 2 * GIB,
        "sm_share": 50,
        "policy": "hard",
        "owner": "ada",
        "created_at": 0.0,
        "metadata": {"provisioner_info": {"pid": kernel.pid, "pid_start_time": start_time(kernel.pid)}},
    }

    def read() -> list[int]:
        reader_env = {**sim_env, "PYTHONPATH": os.pathsep.join(sys.path)}
        result = subprocess.run(
            [sys.executable, "-c", READER, json.dumps(allocation)],
            env=reader_env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    try:
        # The child holds 3 GiB of a 2 GiB slice: 1 GiB over its cap; the outsider's 1 GiB is outside.
        assert read() == [GIB, GIB]
        kernel.kill()  # the kernel is gone: its child, adopted by init, belongs to no slice any more
        kernel.wait()
        wait_for(lambda: read() == [4 * GIB, 0], 10, "the orphaned child to count outside any slice")
    finally:
        for process in (outsider, kernel):
            process.kill()
        os.kill(child, signal.SIGKILL)
