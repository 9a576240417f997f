"""The failures HAMi-core's users report (../shared/FIELD-NOTES.md), each tried with NVIDIA's
cuda-bindings in a 1 GiB slice of the simulated GPU: allocation paths an accounting can miss
(pools, VMM from worker threads, graph memory nodes, memory imported from another process),
lookups through cuGetProcAddress with the per-thread-default-stream flag, CUDA 13's
cuCtxCreate, NVML before CUDA, and exit with threads still inside hooked calls."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import JUPYTER, OOM_LINE, values
from support import CUDA_BINDINGS_PRELUDE

GIB = 1 << 30

PRELUDE = "\nimport threading" + CUDA_BINDINGS_PRELUDE
# The device's primary context made current, as `context`.
IN_PRIMARY_CONTEXT = (
    PRELUDE
    + """
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
context = ok(cu.cuCtxGetCurrent())
"""
)


def test_pool_and_vmm_allocations_from_worker_threads_are_charged_to_the_slice(in_slice):
    code = (
        IN_PRIMARY_CONTEXT
        + """stream = ok(cu.cuStreamCreate(0))
pool = ok(cu.cuDeviceGetDefaultMemPool(device))
pooled = ok(cu.cuMemAllocFromPoolAsync(400 << 20, pool, stream))
print("pool_over_cap", cu.cuMemAllocFromPoolAsync(700 << 20, pool, stream)[0].name)

prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
answers = []

def create(size):  # as PyTorch's expandable segments grow, from whichever thread allocates
    ok(cu.cuCtxSetCurrent(context))
    answers.append(cu.cuMemCreate(size, prop, 0)[0].name)

workers = [threading.Thread(target=create, args=(200 << 20,)) for _ in range(4)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print("vmm", sorted(answers))
free, total = ok(cu.cuMemGetInfo())
print("used", total - free)
"""
    )
    ran = in_slice(code, "--memory", "1GiB")
    seen = values(ran)
    assert seen["pool_over_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # 400 MiB pooled + 3 x 200 MiB = 1000 MiB; the fourth 200 MiB handle would pass 1 GiB.
    assert seen["vmm"] == "['CUDA_ERROR_OUT_OF_MEMORY', 'CUDA_SUCCESS', 'CUDA_SUCCESS', 'CUDA_SUCCESS']"
    assert seen["used"] == str(1000 << 20)
    assert ran.stderr.count(OOM_LINE) == 2


def test_an_expandable_segments_retry_is_one_refusal_burst_though_its_pieces_are_granted_again(in_slice):
    # PyTorch's expandable segments map a tensor in 20 MiB handles; when one is refused they
    # release the handles of that tensor, empty the cache and map them all again, so the retry is
    # granted the same pieces before the same piece is refused (two lines on an H100 before).
    code = (
        IN_PRIMARY_CONTEXT
        + """prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
held = [ok(cu.cuMemCreate(20 << 20, prop, 0)) for _ in range(40)]  # 800 MiB of tensors already

def map_tensor():  # 13 pieces: 260 MiB does not fit beside 800 MiB in 1 GiB
    pieces = []
    for _ in range(13):
        error, handle = cu.cuMemCreate(20 << 20, prop, 0)
        if error != cu.CUresult.CUDA_SUCCESS:
            for piece in pieces:
                ok(cu.cuMemRelease(piece))
            return error.name, len(pieces)
        pieces.append(handle)
    return "CUDA_SUCCESS", len(pieces)

print("first", map_tensor())
ok(cu.cuMemRelease(held.pop()))  # the allocator empties its cache: one cached block goes back
print("retry", map_tensor())
print("another_size", cu.cuMemCreate(400 << 20, prop, 0)[0].name)
"""
    )
    ran = in_slice(code, "--memory", "1GiB")
    seen = values(ran)
    assert seen["first"].startswith("('CUDA_ERROR_OUT_OF_MEMORY'")
    assert seen["retry"].startswith("('CUDA_ERROR_OUT_OF_MEMORY'")
    assert seen["another_size"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # The first and the retry are one burst (one line); another request is another.
    assert ran.stderr.count(OOM_LINE) == 2, ran.stderr


def test_per_thread_stream_lookups_and_cuda_13_cuctxcreate_are_capped(in_slice, user_env):
    # cuda-bindings looks every entry point up through cuGetProcAddress, with the per-thread
    # default stream flag when asked: it gets the _ptds/_ptsz variants, which must be hooked too.
    code = (
        PRELUDE
        + """
params = cu.CUctxCreateParams()
context = ok(cu.cuCtxCreate(params, 0, device))  # cuCtxCreate_v4 in CUDA 13
stream = ok(cu.cuStreamCreate(0))
print("async_over_cap", cu.cuMemAllocAsync(2 << 30, cu.CUstream(0))[0].name)
held = ok(cu.cuMemAllocAsync(512 << 20, cu.CUstream(0)))
print("copy_ptds", cu.cuMemcpyHtoD(held, b"x" * 64, 64)[0].name)
print("alloc_over_cap", cu.cuMemAlloc(768 << 20)[0].name)
free, total = ok(cu.cuMemGetInfo())
print("total", total, "free", free)
"""
    )
    env = {**user_env, "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}
    seen = values(in_slice(code, "--memory", "1GiB", env=env))
    assert seen["async_over_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["copy_ptds"] == "CUDA_SUCCESS"
    assert seen["alloc_over_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    total, free = seen["total"].split()[0], seen["total"].split()[2]
    assert int(total) == GIB and 0 <= int(free) <= GIB - (512 << 20)


def test_nvml_before_cuda_and_a_process_that_never_calls_cuda(in_slice):
    code = (
        """
import pynvml
pynvml.nvmlInit()
print("nvml_total", pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
"""
        + CUDA_BINDINGS_PRELUDE
        + """
ok(cu.cuCtxSetCurrent(ok(cu.cuDevicePrimaryCtxRetain(device))))
print("cuda_total", ok(cu.cuMemGetInfo())[1])
print("over_cap", cu.cuMemAlloc(2 << 30)[0].name)
"""
    )
    seen = values(in_slice(code, "--memory", "1GiB"))
    assert seen["nvml_total"] == seen["cuda_total"] == str(GIB)
    assert seen["over_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values(in_slice("print('no_cuda', 1)", "--memory", "1GiB"))["no_cuda"] == "1"


def test_no_hang_at_exit_with_threads_still_inside_hooked_calls(in_slice):
    code = (
        IN_PRIMARY_CONTEXT
        + """
import os
started = threading.Barrier(5)

def churn():
    ok(cu.cuCtxSetCurrent(context))
    started.wait()
    while True:
        pointer = cu.cuMemAlloc(1 << 20)[1]
        cu.cuMemFree(pointer)
        cu.cuMemGetInfo()

for _ in range(4):
    threading.Thread(target=churn, daemon=True).start()
started.wait()
print("exiting", 1, flush=True)
"""
    )
    # Exits while four threads are inside cuMemAlloc/cuMemFree/cuMemGetInfo; a hang is a timeout.
    assert values(in_slice(code, "--memory", "1GiB", timeout=60))["exiting"] == "1"


# A graph with one allocation node of `size` bytes: `graph_with_allocation(size) -> (graph, dptr)`.
GRAPH_MEMORY = (
    IN_PRIMARY_CONTEXT
    + """stream = ok(cu.cuStreamCreate(0))

def graph_with_allocation(size):
    graph = ok(cu.cuGraphCreate(0))
    params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = 0
    params.bytesize = size
    ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params))
    return graph, params.dptr

def used():
    free, total = ok(cu.cuMemGetInfo())
    return (total - free) >> 20

def pool(attribute):
    return int(ok(cu.cuDeviceGetGraphMemAttribute(device, attribute))) >> 20
"""
)


def test_graph_memory_nodes_are_paid_by_the_slice_that_launches_them(in_slice):
    # The address is fixed when the node is made; the memory is backed on launch and stays in the
    # driver's graph pool (freed or not) until trimmed: the slice pays from the launch to the trim.
    code = (
        GRAPH_MEMORY
        + """
first, first_dptr = graph_with_allocation(600 << 20)
second, second_dptr = graph_with_allocation(600 << 20)
first_exec = ok(cu.cuGraphInstantiate(first, 0))
second_exec = ok(cu.cuGraphInstantiate(second, 0))
before = used()
print("instantiated", used() - before)
ok(cu.cuGraphLaunch(first_exec, stream))
print("launched", used() - before, pool(cu.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT))
print("written", cu.cuMemcpyHtoD(first_dptr, b"graph", 5)[0].name)
# Twice, as frameworks retry: one refusal burst, one line.
print("second", [cu.cuGraphLaunch(second_exec, stream)[0].name for _ in range(2)])
ok(cu.cuMemFreeAsync(first_dptr, stream))
print("freed", used() - before, pool(cu.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))
print("relaunched", cu.cuGraphLaunch(first_exec, stream)[0].name, used() - before)
ok(cu.cuMemFree(first_dptr))
ok(cu.cuGraphExecDestroy(first_exec))
print("destroyed", used() - before)
ok(cu.cuDeviceGraphMemTrim(device))
print("trimmed", used() - before, pool(cu.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))
print("second_after_trim", cu.cuGraphLaunch(second_exec, stream)[0].name, used() - before)
"""
    )
    ran = in_slice(code, "--memory", "1GiB")
    seen = values(ran)
    assert seen["instantiated"] == "0"
    assert seen["launched"] == "600 600"
    assert seen["written"] == "CUDA_SUCCESS"
    assert seen["second"] == "['CUDA_ERROR_OUT_OF_MEMORY', 'CUDA_ERROR_OUT_OF_MEMORY']"
    assert ran.stderr.count(OOM_LINE) == 1, ran.stderr
    # Freed, the memory stays reserved by the pool (and charged); a relaunch reuses it.
    assert seen["freed"] == "600 600"
    assert seen["relaunched"] == "CUDA_SUCCESS 600"
    assert seen["destroyed"] == "600"
    assert seen["trimmed"] == "0 0"
    assert seen["second_after_trim"] == "CUDA_SUCCESS 600"


# Sharing memory between two processes: the 64 bytes of a legacy IPC handle travel in a file, a
# VMM handle's descriptor over a Unix socket (SCM_RIGHTS), as programs pass them.
SHARING = (
    IN_PRIMARY_CONTEXT
    + """import ctypes, os, socket, sys, time
folder = sys.argv[1]
handle_file, socket_path = os.path.join(folder, "handle"), os.path.join(folder, "socket")
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
location = cu.CUmemLocation()
location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
location.id = 0

def used():
    free, total = ok(cu.cuMemGetInfo())
    return (total - free) >> 20

def map_vmm(handle, size):
    address = ok(cu.cuMemAddressReserve(size, 0, 0, 0))
    ok(cu.cuMemMap(address, size, 0, handle, 0))
    access = cu.CUmemAccessDesc()
    access.location = location
    access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(cu.cuMemSetAccess(address, size, [access], 1))
    return address

def read(address, size):
    buffer = bytearray(size)
    ok(cu.cuMemcpyDtoH(buffer, address, size))
    return bytes(buffer).decode()
"""
)

EXPORTER = (
    SHARING
    + """
legacy = ok(cu.cuMemAlloc(600 << 20))
ok(cu.cuMemcpyHtoD(legacy, b"from the exporter", 17))
ipc_handle = ok(cu.cuIpcGetMemHandle(legacy))
prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location = location
prop.requestedHandleTypes = POSIX_FD
physical = ok(cu.cuMemCreate(200 << 20, prop, 0))
ok(cu.cuMemcpyHtoD(map_vmm(physical, 200 << 20), b"vmm bytes", 9))
descriptor = ok(cu.cuMemExportToShareableHandle(physical, POSIX_FD, 0))
server = socket.socket(socket.AF_UNIX)
server.bind(socket_path)
server.listen(1)
with open(handle_file + ".part", "wb") as out:
    out.write(ctypes.string_at(ipc_handle.getPtr(), 64))
os.rename(handle_file + ".part", handle_file)
connection, _ = server.accept()
socket.send_fds(connection, [b"fd"], [descriptor])
assert connection.recv(4) == b"done"  # the importer closed and released what it opened
print("exporter_used", used())
print("exporter_reads", read(legacy, 17))
"""
)

IMPORTER = (
    SHARING
    + """
deadline = time.monotonic() + 60
while not os.path.exists(handle_file):
    assert time.monotonic() < deadline, "the exporter wrote no handle"
    time.sleep(0.02)
before = used()
ipc_handle = cu.CUipcMemHandle()
ctypes.memmove(ipc_handle.getPtr(), open(handle_file, "rb").read(), 64)
opened = ok(cu.cuIpcOpenMemHandle(ipc_handle, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
print("legacy_reads", read(opened, 17))
ok(cu.cuMemcpyHtoD(opened, b"FROM THE IMPORTER", 17))
print("legacy_used", used() - before)
room = cu.cuMemAlloc(900 << 20)  # fits only if the 600 MiB opened are not counted here
print("room", room[0].name)
ok(cu.cuMemFree(room[1]))
ok(cu.cuIpcCloseMemHandle(opened))
connection = socket.socket(socket.AF_UNIX)
connection.connect(socket_path)
_, descriptors, _, _ = socket.recv_fds(connection, 16, 1)
imported = ok(cu.cuMemImportFromShareableHandle(descriptors[0], POSIX_FD))
mapped = map_vmm(imported, 200 << 20)
print("vmm_reads", read(mapped, 9))
print("vmm_used", used() - before)
ok(cu.cuMemUnmap(mapped, 200 << 20))
ok(cu.cuMemRelease(imported))
connection.send(b"done")
"""
)


def test_imported_ipc_memory_is_paid_by_the_exporters_slice_only(user_env, tmp_path):
    # Two processes in two 1 GiB slices. A real driver maps the exporter's memory into the
    # importer: no new device memory, so the importer's slice is not charged again (its free
    # memory does not drop) and its close gives the exporter's slice nothing back.
    def start(code: str, name: str) -> subprocess.Popen:
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(code))
        command = [JUPYTER, "vgpu", "run", "--simulate", "--memory", "1GiB", "--", sys.executable, str(script)]
        return subprocess.Popen(
            [*command, str(tmp_path)], env=user_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
        out, err = process.communicate(timeout=180)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    exporter, importer = start(EXPORTER, "exporter"), start(IMPORTER, "importer")
    imported, exported = finish(importer), finish(exporter)
    seen, exporter_seen = values(imported), values(exported)
    assert seen["legacy_reads"] == "from the exporter"
    assert seen["legacy_used"] == "0"
    assert seen["room"] == "CUDA_SUCCESS"
    assert seen["vmm_reads"] == "vmm bytes"
    assert seen["vmm_used"] == "0"
    assert exporter_seen["exporter_reads"] == "FROM THE IMPORTER"
    assert int(exporter_seen["exporter_used"]) >= 800  # 600 + 200 MiB, still charged after the close
    assert OOM_LINE not in imported.stderr + exported.stderr
