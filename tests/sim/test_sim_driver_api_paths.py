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


GRAPH_POOL = (
    CUDA_BINDINGS_PRELUDE
    + """
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
stream = ok(cu.cuStreamCreate(0))
graph = ok(cu.cuGraphCreate(0))
params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
params.poolProps.location.id = 0
params.bytesize = 64 << 20
allocation = ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params))
freeing = ok(cu.cuGraphAddMemFreeNode(graph, [allocation], 1, params.dptr))
print("types", ok(cu.cuGraphNodeGetType(allocation)).name, ok(cu.cuGraphNodeGetType(freeing)).name)
print("node_size", ok(cu.cuGraphMemAllocNodeGetParams(allocation)).bytesize >> 20)
print("freed_address", int(ok(cu.cuGraphMemFreeNodeGetParams(freeing))) == int(params.dptr))

def pool():
    return [int(ok(cu.cuDeviceGetGraphMemAttribute(device, a))) >> 20 for a in cu.CUgraphMem_attribute]

def held():
    free, total = ok(cu.cuMemGetInfo())
    return (total - free) >> 20

before = held()
executable = ok(cu.cuGraphInstantiate(graph, 0))
print("second_instantiation", cu.cuGraphInstantiate(graph, 0)[0].name)
print("instantiated", held() - before, pool())
ok(cu.cuGraphLaunch(executable, stream))
print("launched", held() - before, pool())
ok(cu.cuGraphLaunch(executable, stream))  # freed in the graph: launched again at will
ok(cu.cuDeviceSetGraphMemAttribute(device, cu.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)))
ok(cu.cuDeviceGraphMemTrim(device))
print("trimmed", held() - before, pool())
print("access_after_free", cu.cuMemcpyHtoD(params.dptr, b"x", 1)[0].name)
"""
)


def test_graph_memory_nodes_are_backed_on_launch_and_kept_by_the_pool_until_trimmed(env):
    result = run_checked([sys.executable, "-c", textwrap.dedent(GRAPH_POOL)], env, timeout=120)
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert seen["types"] == "CU_GRAPH_NODE_TYPE_MEM_ALLOC CU_GRAPH_NODE_TYPE_MEM_FREE"
    assert seen["node_size"] == "64"
    assert seen["freed_address"] == "True"
    assert seen["second_instantiation"] != "CUDA_SUCCESS"  # one executable at a time
    assert seen["instantiated"] == "0 [0, 0, 0, 0]"
    # used, used high, reserved, reserved high (MiB): freed within the graph, kept reserved.
    assert seen["launched"] == "64 [0, 64, 64, 64]"
    assert seen["trimmed"] == "0 [0, 0, 0, 64]"
    assert seen["access_after_free"] == "CUDA_ERROR_INVALID_VALUE"
