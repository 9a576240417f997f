"""A Python kernel started by jupyter_client in a slice sees its slice: cuMemGetInfo through
ctypes (dlopen + dlsym) reports the cap and the kernel's own usage."""

from __future__ import annotations

import json
import queue

import jupyter_client
import pytest
from slice_helpers import GIB, MIB

CODE = r"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
assert cuda.cuCtxSetCurrent(context) == 0
pointer = ctypes.c_uint64()
allocated = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(300 << 20))
refused = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(2 << 30))
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
print(json.dumps(dict(allocated=allocated, refused=refused, free=free.value, total=total.value)))
"""


def run_in_kernel(env: dict[str, str], code: str, timeout: float = 60) -> tuple[str, str]:
    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(env=env)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
        message_id = client.execute(code)
        stdout, stderr = [], []
        while True:
            try:
                message = client.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"kernel went quiet; stdout so far {stdout}, stderr {stderr}")
            if message["parent_header"].get("msg_id") != message_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                (stdout if content["name"] == "stdout" else stderr).append(content["text"])
            elif kind == "error":
                pytest.fail("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(stdout), "".join(stderr)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_kernel_started_in_a_slice_reports_its_slice(sim_env, make_slice):
    env, _ = make_slice(sim_env, memory_limit=GIB)
    stdout, _stderr = run_in_kernel(env, CODE)
    seen = json.loads(stdout)
    assert seen == {"allocated": 0, "refused": 2, "free": GIB - 300 * MIB, "total": GIB}
