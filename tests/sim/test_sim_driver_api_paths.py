"""The simulated driver's memory and launch paths as NVIDIA's cuda-bindings call them, straight
on the simulated GPU (no slice): what issue 19 added for driver-API clients."""

from __future__ import annotations

import sys
import textwrap

from support import CUDA_BINDINGS_PRELUDE, run_checked

PATHS = (
    "\nimport ctypes\nimport numpy as np"
    + CUDA_BINDINGS_PRELUDE
    + """
# The CUDA 12 library API loads without a current context; its kernels launch once one is.
library = ok(cu.cuLibraryLoadData(b"any image", None, None, 0, None, None, 0))
kernel = ok(cu.cuLibraryGetKernel(library, b"k"))
print("kernel_name", ok(cu.cuKernelGetName(kernel)).decode())
print("function_without_context", cu.cuKernelGetFunction(kernel)[0].name)
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
function = ok(cu.cuKernelGetFunction(kernel))
attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
ok(cu.cuFuncSetAttribute(function, attribute, 100000))
print("dynamic_shared", ok(cu.cuFuncGetAttribute(attribute, function)))
link = ok(cu.cuLinkCreate(0, [], []))
ok(cu.cuLinkAddData(link, cu.CUjitInputType.CU_JIT_INPUT_PTX, b"ptx", 3, b"a.ptx", 0, [], []))
image, size = ok(cu.cuLinkComplete(link))
print("linked", size > 0)
module = ok(cu.cuModuleLoadData(image))
ok(cu.cuLinkDestroy(link))
print("export_table", cu.cuGetExportTable(cu.CUuuid())[0].name)

# Memory: device, pinned host, unknown pointers; a memset of each width; event ordering.
stream = ok(cu.cuStreamCreate(0))
before = ok(cu.cuMemGetInfo())[0]
pinned = ok(cu.cuMemHostAlloc(64 << 20, 0))
print("pinned_charged", before - ok(cu.cuMemGetInfo())[0])
device_memory = ok(cu.cuMemAlloc(1 << 20))
kind = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
print("types", int(ok(cu.cuPointerGetAttribute(kind, device_memory))), int(ok(cu.cuPointerGetAttribute(kind, pinned))))
print("unknown", cu.cuPointerGetAttribute(kind, 4096)[0].name)
base, size = ok(cu.cuMemGetAddressRange(int(device_memory) + 100))
print("range", int(base) == int(device_memory), size)
ok(cu.cuMemsetD16(device_memory, 0xBEEF, 4))
words = np.zeros(4, np.uint16)
ok(cu.cuMemcpyDtoH(words.ctypes.data, device_memory, 8))
print("d16", [hex(w) for w in words.tolist()])
print("priority_range", ok(cu.cuCtxGetStreamPriorityRange()))
print("stack_limit", ok(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_STACK_SIZE)))
print("launch", cu.cuLaunchKernel(function, 100, 1, 1, 256, 1, 1, 0, stream, 0, 0)[0].name)
ran = []
host_function = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: ran.append(1))
ok(cu.cuLaunchHostFunc(stream, ctypes.cast(host_function, ctypes.c_void_p).value, 0))
ok(cu.cuStreamSynchronize(stream))
print("host_function_ran", len(ran))
print("capturing", ok(cu.cuStreamIsCapturing(stream)).name)
print("peer", ok(cu.cuDeviceCanAccessPeer(device, device)))
"""
)


def run(env: dict[str, str]) -> dict[str, str]:
    result = run_checked([sys.executable, "-c", textwrap.dedent(PATHS)], env, timeout=120)
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def test_library_link_memory_and_stream_paths_as_cuda_bindings_calls_them(env):
    seen = run(env)
    assert seen["kernel_name"] == "k"
    assert seen["function_without_context"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert seen["dynamic_shared"] == "100000"
    assert seen["linked"] == "True"
    assert seen["export_table"] == "CUDA_ERROR_NOT_SUPPORTED"  # refused by design, never emulated
    assert seen["pinned_charged"] == "0"
    assert seen["types"] == "2 1"  # device, host
    assert seen["unknown"] == "CUDA_ERROR_INVALID_VALUE"
    assert seen["range"] == f"True {1 << 20}"
    assert seen["d16"] == "['0xbeef', '0xbeef', '0xbeef', '0xbeef']"
    assert seen["priority_range"] == "[0, -5]"
    assert seen["stack_limit"] == "1024"
    assert seen["launch"] == "CUDA_SUCCESS"
    assert seen["capturing"] == "CU_STREAM_CAPTURE_STATUS_NONE"
    assert seen["peer"] == "0"
    assert seen["host_function_ran"] == "1"


def test_launches_fail_when_told_to(env):
    assert run({**env, "VGPU_SIM_FAIL_LAUNCHES": "1"})["launch"] == "CUDA_ERROR_LAUNCH_FAILED"
