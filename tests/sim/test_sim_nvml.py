"""The simulated NVML, through pynvml (nvidia-ml-py) as monitoring tools and jupyter-vgpu use it, and
through its C API where pynvml does not go (the v1 process list HAMi-core calls)."""

from __future__ import annotations

import time

from sim_helpers import MIB, full_wave, python_json, run_program, with_devices

NVML_ERROR_INSUFFICIENT_SIZE = "7"

PYNVML_TOUR = r"""
import json, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
memory = pynvml.nvmlDeviceGetMemoryInfo(h)
memory_v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
print(json.dumps({
    "name": pynvml.nvmlDeviceGetName(h),
    "uuid": pynvml.nvmlDeviceGetUUID(h),
    "memory": [memory.total, memory.used, memory.free],
    "memory_v2": [memory_v2.total, memory_v2.reserved, memory_v2.used, memory_v2.free],
    "processes": [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
    "samples": [[s.pid, s.smUtil] for s in samples],
}))
pynvml.nvmlShutdown()
"""


def test_pynvml_works_against_the_simulated_nvml(programs, env, workloads):
    env = with_devices(env, "name=Tour GPU,memory=8GiB,context_memory=100MiB,sms=100,block_ns=100000")
    holder = workloads(env, "hold", str(300 * MIB))
    holder.wait_for("ready")
    runner = workloads(env, "busy", "1.0", str(full_wave(100, 256)), "256")
    runner.wait_for("started")
    seen = python_json(env, PYNVML_TOUR)
    runner.finish()
    holder.finish()
    assert seen["name"] == "Tour GPU"
    assert seen["uuid"] == "GPU-5eed0000-0000-4000-8000-000000000000"
    total = 8 << 30
    used = 300 * MIB + 2 * 100 * MIB  # the holder's allocation, and each process's context
    assert seen["memory"] == [total, used, total - used]
    assert seen["memory_v2"] == [total, 0, used, total - used]
    assert sorted(seen["processes"]) == sorted([[holder.pid, 400 * MIB], [runner.pid, 100 * MIB]])
    assert [pid for pid, _ in seen["samples"]] == [runner.pid]  # only the process that ran kernels


def test_process_utilisation_has_no_samples_without_kernels_since_last_seen(programs, env, workloads):
    holder = workloads(env, "hold", str(MIB))
    holder.wait_for("ready")
    code = r"""
import json, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
results = []
for last_seen in (0, int(time.time() * 1e6) + 10**6):
    try:
        results.append(len(pynvml.nvmlDeviceGetProcessUtilization(h, last_seen)))
    except pynvml.NVMLError_NotFound:
        results.append("not found")
print(json.dumps(results))
"""
    assert python_json(env, code) == ["not found", "not found"]


def test_process_utilisation_only_reports_kernels_after_last_seen(programs, env, workloads):
    env = with_devices(env, "sms=100,block_ns=100000")
    runner = workloads(env, "busy", "0.3", str(full_wave(100, 256)), "256")
    runner.wait_for("done")  # its kernels have all ended; the process still holds its context
    code = r"""
import json, time, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
before = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
try:
    after = len(pynvml.nvmlDeviceGetProcessUtilization(h, before[0].timeStamp))
except pynvml.NVMLError_NotFound:
    after = "not found"
print(json.dumps([[s.pid for s in before], after]))
"""
    seen = python_json(env, code)
    runner.finish()
    assert seen == [[runner.pid], "not found"]


def test_nvml_init_is_reference_counted(env):
    code = r"""
import json, pynvml
pynvml.nvmlInit(); pynvml.nvmlInit()
pynvml.nvmlShutdown()
steps = [pynvml.nvmlDeviceGetCount()]
pynvml.nvmlShutdown()
for call in (pynvml.nvmlDeviceGetCount, pynvml.nvmlShutdown):
    try:
        call()
        steps.append("ok")
    except pynvml.NVMLError_Uninitialized:
        steps.append("uninitialized")
print(json.dumps(steps))
"""
    assert python_json(env, code) == [1, "uninitialized", "uninitialized"]


def test_memory_info_v2_refuses_a_wrong_struct_version(env):
    code = r"""
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2 + 1)
    print(json.dumps("accepted"))
except pynvml.NVMLError as error:
    print(json.dumps(error.value))
"""
    assert python_json(env, code) == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_device_queries_report_a_plausible_device(env):
    env = with_devices(env, "sms=132;uuid=GPU-12345678-1234-1234-1234-123456789abc")
    code = r"""
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
print(json.dumps({
    "count": pynvml.nvmlDeviceGetCount(),
    "by_uuid": pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID("GPU-12345678-1234-1234-1234-123456789abc")),
    "cc": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
    "cores": pynvml.nvmlDeviceGetNumGpuCores(pynvml.nvmlDeviceGetHandleByIndex(0)),
    "bus_id": pci.busId,
    "temperature": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "power_mw": pynvml.nvmlDeviceGetPowerUsage(h),
    "driver": pynvml.nvmlSystemGetDriverVersion(),
    "cuda": pynvml.nvmlSystemGetCudaDriverVersion(),
    "utilization": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
}))
"""
    seen = python_json(env, code)
    assert seen["count"] == 2 and seen["by_uuid"] == 1
    assert seen["cc"] == [9, 0]
    assert seen["cores"] == 132 * 128
    assert seen["bus_id"] == "00000000:19:00.0"
    assert 20 <= seen["temperature"] <= 90 and 10_000 <= seen["power_mw"] <= 1_000_000
    assert seen["driver"].count(".") == 2 and seen["cuda"] == 13000
    assert seen["utilization"] == 0


def test_nvml_error_string_names_every_code(env):
    code = r"""
import json, pynvml
pynvml.nvmlInit()
print(json.dumps({code: pynvml.nvmlErrorString(code) for code in list(range(0, 31)) + [999, 12345]}))
"""
    strings = python_json(env, code)
    assert strings["0"] == "Success"
    assert strings["6"] == "Not Found"
    assert all(strings[str(code)] != "Unknown Error" for code in range(31))
    assert strings["999"] == strings["12345"] == "Unknown Error"


def test_a_process_that_exits_is_gone_from_nvml_at_once(programs, env, workloads):
    holder = workloads(env, "hold", str(512 * MIB))
    holder.wait_for("ready")
    holder.finish()  # exits normally: its memory returns when the driver shuts down
    code = r"""
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(json.dumps([pynvml.nvmlDeviceGetMemoryInfo(h).used, len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))]))
"""
    start = time.monotonic()
    assert python_json(env, code) == [0, 0]
    assert time.monotonic() - start < 30


def test_nvml_v1_process_list_fills_the_v1_layout(programs, env):
    seen = run_program(programs.entry_points, env, "versions")
    assert seen["processes_v1"] == seen["processes_v2"] == seen["processes_v3"] == "1"
    assert seen["processes_v1_self"] == seen["processes_v3_self"] == str(5 * MIB)
    assert seen["processes_v1_past_end_untouched"] == "1"  # 16-byte entries, not v2's 24
    assert (seen["processes_v1_no_room"], seen["processes_v1_room_needed"]) == (NVML_ERROR_INSUFFICIENT_SIZE, "1")
