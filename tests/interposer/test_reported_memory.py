"""What a program in a slice is told about memory: with a cap, the slice (cuMemGetInfo,
cuDeviceTotalMem, NVML's memory info, as pynvml reads it); without a cap, or for another device,
exactly what the driver says (never 0 bytes)."""

from __future__ import annotations

import json
import subprocess
import sys

from slice_helpers import GIB, MIB

# Runs inside the slice: allocates argv[1] bytes on device 0 through ctypes (dlopen + dlsym),
# then reports what CUDA and NVML (pynvml) say about every device.
REPORT = r"""
import ctypes, json, sys
import pynvml

cuda = ctypes.CDLL("libcuda.so.1")
def check(rc):
    assert rc == 0, rc
check(cuda.cuInit(0))
device = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(device), 0))
context = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
check(cuda.cuCtxSetCurrent(context))
pointer = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(sys.argv[1]))))
free, total = ctypes.c_size_t(), ctypes.c_size_t()
check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
count = ctypes.c_int()
check(cuda.cuDeviceGetCount(ctypes.byref(count)))
device_totals = []
for index in range(count.value):
    bytes_ = ctypes.c_size_t()
    check(cuda.cuDeviceTotalMem_v2(ctypes.byref(bytes_), index))
    device_totals.append(bytes_.value)
pynvml.nvmlInit()
nvml = []
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    nvml.append(dict(total=v1.total, used=v1.used, free=v1.free,
                     v2_total=v2.total, v2_used=v2.used, v2_free=v2.free, v2_reserved=v2.reserved))
print(json.dumps(dict(free=free.value, total=total.value, device_totals=device_totals, nvml=nvml)))
"""

TWO_DEVICES = (
    "name=slice GPU,uuid=GPU-11111111-2222-3333-4444-555555555555,memory=16GiB,sms=100,context_memory=0;"
    "name=other GPU,uuid=GPU-66666666-7777-8888-9999-aaaaaaaaaaaa,memory=8GiB,sms=50,context_memory=0"
)


def report(env: dict[str, str], allocate: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", REPORT, str(allocate)], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def driver_view(sim_env: dict[str, str], tmp_path, allocate: int) -> dict:
    """The same report straight from the simulated driver, on a machine of its own."""
    env = dict(sim_env, VGPU_SIM_STATE=str(tmp_path / "driver-view-state"))
    return report(env, allocate)


def test_capped_slice_reports_cap_and_slice_usage_to_cuda_and_nvml(sim_env, make_slice, tmp_path):
    sim_env["VGPU_SIM_DEVICES"] = TWO_DEVICES
    env, _ = make_slice(sim_env, memory_limit=3 * GIB)
    seen = report(env, 1 * GIB)
    assert (seen["total"], seen["free"]) == (3 * GIB, 2 * GIB)
    assert seen["device_totals"][0] == 3 * GIB
    slice_device = seen["nvml"][0]
    assert (slice_device["total"], slice_device["used"], slice_device["free"]) == (3 * GIB, GIB, 2 * GIB)
    assert (slice_device["v2_total"], slice_device["v2_used"], slice_device["v2_free"]) == (3 * GIB, GIB, 2 * GIB)
    assert slice_device["v2_reserved"] == 0


def test_other_devices_pass_through_untouched(sim_env, make_slice, tmp_path):
    sim_env["VGPU_SIM_DEVICES"] = TWO_DEVICES
    env, _ = make_slice(sim_env, memory_limit=3 * GIB)
    seen = report(env, 256 * MIB)
    driver = driver_view(sim_env, tmp_path, 256 * MIB)
    assert seen["device_totals"][1] == driver["device_totals"][1] == 8 * GIB
    assert seen["nvml"][1] == driver["nvml"][1]


def test_without_a_cap_everything_passes_through_and_is_never_zero(sim_env, make_slice, tmp_path):
    env, _ = make_slice(sim_env, memory_limit=0)
    seen = report(env, 256 * MIB)
    driver = driver_view(sim_env, tmp_path, 256 * MIB)
    assert seen == driver
    assert seen["total"] == seen["device_totals"][0] == seen["nvml"][0]["total"] == 16 * GIB


def test_probe_sees_totals_from_cuda_on_every_path(probe, sim_env, make_slice):
    env, _ = make_slice(sim_env, memory_limit=5 * GIB)
    for path in ("direct", "dlsym", "procaddr", "procaddr_ptsz"):
        run = probe(env, "init", "alloc:1G", "info", "total", path=path)
        assert run.returncode == 0, run.stderr
        assert run.values(2) == [0, 4 * GIB, 5 * GIB], path
        assert run.values(3) == [0, 5 * GIB], path


def test_cap_above_the_device_reports_the_device(probe, sim_env, make_slice):
    env, _ = make_slice(sim_env, memory_limit=64 * GIB)
    run = probe(env, "init", "info", "total")
    assert run.returncode == 0, run.stderr
    assert run.values(1)[2] == 16 * GIB
    assert run.values(2) == [0, 16 * GIB]
