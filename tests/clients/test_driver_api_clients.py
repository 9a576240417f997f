"""NVIDIA's own Python layer (cuda-bindings, cuda.core) and numba-cuda, unmodified from PyPI,
in slices of the simulated GPU: `jupyter vgpu run` and a notebook kernel of a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from conftest import JUPYTER, OOM_LINE, values
from support import CUDA_BINDINGS_PRELUDE

GIB = 1 << 30
MIB = 1 << 20

BINDINGS = (
    "\nimport numpy as np"
    + CUDA_BINDINGS_PRELUDE
    + """
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
free, total = ok(cu.cuMemGetInfo())
print("total", total)
print("over_cap", cu.cuMemAlloc(2 << 30)[0].name)
a, b = ok(cu.cuMemAlloc(1 << 20)), ok(cu.cuMemAlloc(1 << 20))
fresh = np.zeros(4096, np.uint8)
ok(cu.cuMemcpyDtoH(fresh.ctypes.data, a, fresh.nbytes))
print("fresh_bytes", sorted(set(fresh.tolist())))
pattern = np.arange(1 << 18, dtype=np.uint32)
stream = ok(cu.cuStreamCreateWithPriority(cu.CUstream_flags.CU_STREAM_NON_BLOCKING, -1))
ok(cu.cuMemcpyHtoDAsync(a, pattern.ctypes.data, pattern.nbytes, stream))
ok(cu.cuMemcpyDtoDAsync(b, a, pattern.nbytes, stream))
back = np.zeros_like(pattern)
ok(cu.cuMemcpyDtoHAsync(back.ctypes.data, b, back.nbytes, stream))
ok(cu.cuStreamSynchronize(stream))
print("round_trip", bool((back == pattern).all()))
ok(cu.cuMemsetD32(b, 0xDEADBEEF, 16))
ok(cu.cuMemcpyDtoH(back.ctypes.data, b, 64))
print("memset", hex(int(back[0])), hex(int(back[15])), int(back[16]) == 16)
print("priority", ok(cu.cuStreamGetPriority(stream)))
memory_type = ok(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a))
print("pointer", memory_type)
pinned = ok(cu.cuMemHostAlloc(3 << 30, 0))
print("pinned_free_after", ok(cu.cuMemGetInfo())[0] == free - (2 << 20))
ok(cu.cuMemFreeHost(pinned))
print("bus_id", ok(cu.cuDeviceGetPCIBusId(16, device)).split(b"\\0")[0].decode())
"""
)


def test_cuda_bindings_sees_its_slice_copies_exactly_and_stops_at_the_cap(in_slice):
    ran = in_slice(BINDINGS, "--memory", "1GiB")
    seen = values(ran)
    assert seen["total"] == str(GIB)
    assert seen["over_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert ran.stderr.count(OOM_LINE) == 1
    # New device memory holds the poison byte, not zeros: no test can pass on results the
    # simulator never computed.
    assert seen["fresh_bytes"] == "[165]"
    assert seen["round_trip"] == "True"
    assert seen["memset"] == "0xdeadbeef 0xdeadbeef True"
    assert seen["priority"] == "-1"
    assert seen["pointer"] == "2"  # CU_MEMORYTYPE_DEVICE
    # 3 GiB of pinned host memory in a 1 GiB slice: host memory, never charged to the device.
    assert seen["pinned_free_after"] == "True"
    assert seen["bus_id"] == "0000:18:00.0"


CUDA_CORE = """
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
from cuda.core._utils.cuda_utils import CUDAError

device = Device()
device.set_current()
stream = device.create_stream()
buffers = [device.memory_resource.allocate(256 << 20, stream=stream) for _ in range(3)]
print("granted", sum(buffer.size for buffer in buffers))
try:
    device.memory_resource.allocate(512 << 20, stream=stream)
except CUDAError as error:
    print("refused", "CUDA_ERROR_OUT_OF_MEMORY" in str(error))
kernel = Program('extern "C" __global__ void k(int *x) { x[threadIdx.x] = 1; }', code_type="c++",
                 options=ProgramOptions(arch="sm_90")).compile("cubin").get_kernel("k")
launch(stream, LaunchConfig(grid=4, block=128), kernel, buffers[0])
stream.sync()
print("launched", True)
for buffer in buffers:
    buffer.close(stream)
print("after_free", device.memory_resource.allocate(512 << 20, stream=stream).size)
"""


def test_cuda_core_memory_resource_and_streams_work_under_the_cap(in_slice):
    ran = in_slice(CUDA_CORE, "--memory", "1GiB")
    seen = values(ran)
    assert seen["granted"] == str(768 * MIB)
    assert seen["refused"] == "True"
    assert seen["launched"] == "True"
    assert seen["after_free"] == str(512 * MIB)
    assert ran.stderr.count(OOM_LINE) == 1


NUMBA_OOM = """
import numpy as np
from numba import cuda

print("total", cuda.current_context().get_memory_info().total)
def try_to_allocate(size):
    try:
        return cuda.device_array(size, np.uint8)
    except cuda.cudadrv.driver.CudaAPIError as error:
        print("refused", int(error.code))

try_to_allocate(2 << 30)
try_to_allocate(2 << 30)  # the same request at once, nothing granted between: the same burst
granted = try_to_allocate(1 << 20)
try_to_allocate(2 << 30)  # after a grant: a new burst
try_to_allocate(3 << 30)  # another request: a new burst
"""


def test_numba_out_of_memory_raises_its_own_error_and_the_line_appears_once_per_burst(in_slice):
    # numba retries a refused allocation once after freeing what it can: two refusals a burst.
    ran = in_slice(NUMBA_OOM, "--memory", "1GiB")
    seen = values(ran)
    assert seen["total"] == str(GIB)
    assert ran.stdout.count("refused 2") == 4  # CUDA_ERROR_OUT_OF_MEMORY, as numba's own error
    assert ran.stderr.count(OOM_LINE) == 3  # three bursts, eight refusals


NUMBA_JIT = """
import numpy as np
from numba import cuda

@cuda.jit
def add_one(values):
    i = cuda.grid(1)
    if i < values.size:
        values[i] += 1

data = cuda.to_device(np.zeros(1024, np.float32))
try:
    add_one[4, 256](data)
    cuda.synchronize()
    print("launched", True)
except Exception as error:  # numba launches through cuda.core: its CUDAError
    print("launch_failed", "CUDA_ERROR_LAUNCH_FAILED" in str(error))
print("bytes_in_slice", cuda.current_context().get_memory_info().total)
"""


def test_numba_jit_kernel_compiles_loads_and_launches_in_a_slice(in_slice):
    seen = values(in_slice(NUMBA_JIT, "--memory", "1GiB"))
    assert seen["launched"] == "True"
    assert seen["bytes_in_slice"] == str(GIB)


def test_launches_fail_when_the_simulator_is_told_to_so_no_result_is_trusted(in_slice, user_env):
    seen = values(in_slice(NUMBA_JIT, "--memory", "1GiB", env={**user_env, "VGPU_SIM_FAIL_LAUNCHES": "1"}))
    assert seen["launch_failed"] == "True"
    assert "launched" not in seen


NUMBA_CHILD = """
import multiprocessing
import numpy as np

def allocate(size, answers):
    from numba import cuda
    try:
        cuda.device_array(size, np.uint8)
        answers.put("granted")
    except cuda.cudadrv.driver.CudaAPIError as error:
        answers.put(f"refused {int(error.code)}")

if __name__ == "__main__":
    from numba import cuda
    held = cuda.device_array(600 << 20, np.uint8)
    spawn = multiprocessing.get_context("spawn")
    answers = spawn.Queue()
    for size in (600 << 20, 300 << 20):
        child = spawn.Process(target=allocate, args=(size, answers))
        child.start()
        child.join()
        print(f"child_{size >> 20}", answers.get())
"""


def test_a_multiprocessing_child_using_numba_shares_its_parents_cap(in_slice):
    seen = values(in_slice(NUMBA_CHILD, "--memory", "1GiB"))
    assert seen["child_600"] == "refused 2"  # 600 MiB held by the parent + 600 MiB > 1 GiB
    assert seen["child_300"] == "granted"


async def test_numba_in_a_notebook_kernel_sees_the_slice_and_a_live_resize(jp_fetch, sliced_kernelspec, run_in_kernel):
    started = await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": sliced_kernelspec}))
    kernel_id = json.loads(started.body)["kernel"]["id"]
    shown = await run_in_kernel(
        kernel_id,
        textwrap.dedent(
            """
            import numpy as np
            from numba import cuda
            print("total", cuda.current_context().get_memory_info().total)
            try:
                cuda.device_array(1536 << 20, np.uint8)
            except cuda.cudadrv.driver.CudaAPIError as error:
                print("refused", int(error.code))
            """
        ),
    )
    assert f"total {GIB}" in shown and "refused 2" in shown
    body = json.dumps({"memory": "2GiB"})
    await jp_fetch("api", "vgpu", "slices", kernel_id, method="PATCH", body=body)
    grown = await run_in_kernel(
        kernel_id,
        "held = cuda.device_array(1536 << 20, np.uint8)\n"
        'print("granted", held.nbytes, "total", cuda.current_context().get_memory_info().total)',
    )
    assert f"granted {1536 * MIB} total {2 * GIB}" in grown


NUMBA_LAUNCH_LOOP = """
import os, time
import numpy as np
from numba import cuda

@cuda.jit
def touch(values):
    i = cuda.grid(1)
    if i < values.size:
        values[i] = i

data = cuda.device_array(1 << 20, np.float32)
touch[16000, 256](data)  # compiled and loaded before the clock starts
cuda.synchronize()
print("pid", os.getpid(), flush=True)
print("start_us", time.time_ns() // 1000, flush=True)
end = time.monotonic() + 4
while time.monotonic() < end:
    for _ in range(20):
        touch[16000, 256](data)  # 20 waves of every SM: 1 ms of device time each
    cuda.synchronize()
"""
PACED_DEVICE = "name=jupyter-vgpu pacing GPU,memory=16GiB,sms=100,context_memory=0,block_ns=50000"


def test_numba_launches_are_held_to_a_hard_sm_share(user_env, compile_c, native_libs, tmp_path):
    """SM utilisation measured from outside the slice by NVML (tests/programs/pacing_monitor.c),
    as tests/interposer/test_pacing.py does, over seconds 1 to 3 of a numba launch loop: the same
    loop unlimited, then in a 30 % hard share, side by side. Unlimited it must use more than the
    share (else this machine cannot tell pacing from a slow loop); paced, never more."""
    monitor = compile_c("pacing_monitor")
    env = {**user_env, "VGPU_SIM_DEVICES": PACED_DEVICE}
    monitor_env = {**env, "LD_LIBRARY_PATH": str(native_libs.sim_dir)}  # NVML outside any slice
    script = tmp_path / "launch_loop.py"
    script.write_text(NUMBA_LAUNCH_LOOP)
    measured = {}
    for cores in (100, 30):
        command = [JUPYTER, "vgpu", "run", "--simulate", "--memory", "1GiB", "--cores", str(cores), "--policy", "hard"]
        with subprocess.Popen(
            [*command, "--", sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
        ) as loop:
            pid = int(loop.stdout.readline().split()[1])
            start_us = int(loop.stdout.readline().split()[1])
            remaining = (start_us + 3_000_000) / 1e6 - time.time()
            if remaining > 0:
                time.sleep(remaining)  # the end of the measurement window: a schedule, not a race
            report = subprocess.run(
                [str(monitor), "since", str(start_us + 1_000_000)],
                env=monitor_env,
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            assert loop.wait(60) == 0
        samples = (line.split() for line in report.splitlines())
        measured[cores] = {int(w[1]): int(w[2]) for w in samples if w and w[0] == "s"}[pid]
    assert measured[100] > 33, f"the unlimited loop used {measured[100]} %: too little to tell pacing apart"
    assert 0 < measured[30] <= 33, f"NVML measured {measured[30]} % in a 30 % hard share ({measured[100]} % unlimited)"
