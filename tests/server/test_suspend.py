"""Suspending a kernel to host memory and resuming it (issue 18) through a real server, with real
kernels on the simulated 16 GiB GPU (device 1 of the server tests' machine): the checkpoint API
of the simulated driver moves the kernel's device memory to host memory, the ledger lends the
slice's room, and a resume takes the room back first and then restores the memory, intact.

The server runs in the test's event loop: waiting is polling with ``await``, which lets the
server's periodic watcher run meanwhile."""

from __future__ import annotations

import json

import pynvml
import pytest
from tornado.httpclient import HTTPClientError

GIB, MIB = 1 << 30, 1 << 20
LARGE = 1  # the 16 GiB device of the server tests' simulated machine

# Kernel code (after the CUDA prelude): 12 GiB held, the last 64 MiB of it written with a pattern
# (the simulated driver copies only memory that was written, so the host copy stays small).
HOLD_12_GIB_WITH_A_PATTERN = """
untouched, written = ctypes.c_uint64(), ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(untouched), ctypes.c_size_t((12 << 30) - (64 << 20))) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(written), ctypes.c_size_t(64 << 20)) == 0
pattern = bytes(range(251)) * ((64 << 20) // 251)
assert cuda.cuMemcpyHtoD_v2(written, pattern, ctypes.c_size_t(len(pattern))) == 0
def intact():
    back = ctypes.create_string_buffer(len(pattern))
    assert cuda.cuMemcpyDtoH_v2(back, written, ctypes.c_size_t(len(pattern))) == 0
    return back.raw == pattern
print(intact())
"""


async def start_sliced(jp_fetch, kernelspec, **fields) -> str:
    body = json.dumps({"name": kernelspec, **fields})
    response = await jp_fetch("api", "vgpu", "kernels", method="POST", body=body)
    return json.loads(response.body)["kernel"]["id"]


async def post(jp_fetch, kernel_id: str, action: str) -> dict:
    return json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id, action, method="POST", body="")).body)


async def refusal(jp_fetch, kernel_id: str, action: str) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, kernel_id, action)
    return refused.value.code, json.loads(refused.value.response.body)["message"]


def nvml_device(index: int) -> dict:
    """What NVML (the simulated one, loaded in this process by the server) says of a device."""
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "free": pynvml.nvmlDeviceGetMemoryInfo(handle).free,
            "pids": {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)},
        }
    finally:
        pynvml.nvmlShutdown()


def kernel_pid(jp_serverapp, kernel_id: str) -> int:
    return jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid


async def test_a_suspended_kernels_memory_is_lent_and_comes_back_intact_when_resumed(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    a = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(a, cuda_prelude + HOLD_12_GIB_WITH_A_PATTERN)).strip() == "True"
    pid = kernel_pid(jp_serverapp, a)
    assert pid in nvml_device(LARGE)["pids"]

    suspended = await post(jp_fetch, a, "suspend")
    assert (suspended["state"], suspended["host_memory_bytes"]) == ("suspended", 12 * GIB)
    assert nvml_device(LARGE) == {"free": 16 * GIB, "pids": set()}
    devices = json.loads((await jp_fetch("api", "vgpu", "devices")).body)
    assert devices[LARGE]["memory_free_bytes"] == 16 * GIB
    assert (await post(jp_fetch, a, "suspend"))["state"] == "suspended"  # again: as it is

    # Its room is lent: another kernel gets 12 GiB of the 16, and A cannot come back meanwhile.
    b = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    code, message = await refusal(jp_fetch, a, "resume")
    assert code == 409
    assert message.startswith(f"kernel {a!r} cannot resume yet: its 12GiB slice needs 12GiB on GPU 1, which has 4GiB free")
    assert nvml_device(LARGE)["pids"] == set()  # nothing was restored

    await jp_fetch("api", "kernels", b, method="DELETE")
    resumed = await post(jp_fetch, a, "resume")
    assert (resumed["state"], resumed["host_memory_bytes"]) == ("running", 0)
    assert pid in nvml_device(LARGE)["pids"]
    assert (await run_in_kernel(a, "print(intact())")).strip() == "True"
    code, message = await refusal(jp_fetch, "no-such-kernel", "resume")
    assert code == 404


async def test_a_kernel_with_managed_memory_is_not_suspended_and_the_refusal_says_why(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", device=LARGE)
    managed = "pointer = ctypes.c_uint64()\nprint(cuda.cuMemAllocManaged(ctypes.byref(pointer), ctypes.c_size_t(1 << 20), 1))"
    assert (await run_in_kernel(kernel, cuda_prelude + managed)).strip() == "0"
    code, message = await refusal(jp_fetch, kernel, "suspend")
    assert code == 409
    assert "the kernel uses managed (unified) memory, which the driver cannot suspend" in message
    assert (json.loads((await jp_fetch("api", "vgpu", "slices", kernel)).body))["state"] == "running"
