"""Real programs in a slice: the driver, NVML, nvidia-smi, cuda-bindings, cuda.core, numba-cuda,
PyTorch (its default, expandable-segments and cudaMallocAsync allocators), CuPy and JAX under a
4 GiB cap; a PyTorch tensor suspended to host memory and resumed; a tensor read back while
suspended (it waits in libvgpu.so saying so, an interrupt ends it, intact after); PyTorch's cache released
before a suspend (host bytes and seconds with and without); and a bf16 matmul loop at a
30 % SM share against the same loop unlimited.

    python benchmarks/framework_checks.py              # on a GPU machine: every check
    python benchmarks/framework_checks.py --simulate   # the simulated GPU: the driver-API clients
    python benchmarks/framework_checks.py --smoke      # as CI runs it: --simulate
    python benchmarks/framework_checks.py --prepare    # here: the wheels a GPU machine needs
    python benchmarks/framework_checks.py --only 'read back while suspended'   # one check (issue 34)

The GPU machines have the frameworks but not this project's dependencies, and fetch nothing:
`--prepare` builds this project's wheel and downloads its dependencies for their Python (3.12,
x86-64) into build/gpu-wheels (ignored by git), and prints the one command to run there, which
installs from that folder alone into the machine's own python3 (a virtual environment holding the
frameworks: a `--system-site-packages` venv made from it would not see them) and runs every check
in well under 10 minutes (about 140 s on an H100). The checks run this checkout's package, so its
native libraries must be there: built here (`python native/build.py`) and carried along with the
wheels, or built there with the same command.

Each check is a child program started the way a user starts one,
`jupyter vgpu run --memory 4GiB [--cores N] -- python -c ...`, that prints one JSON object; this
script judges it and prints a table. A framework that is not installed, or a check that needs the
real driver (frameworks do not run on the simulated one; nvidia-smi is NVIDIA's), is reported as
not run, with the reason, never as passed. Exits 1 when a check that ran failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from private_machine import private_machine  # noqa: E402

GIB = 1 << 30
CAP = 4 * GIB
SHARE = 30
# Issue 2 asked for 30 +/- 5 % of the unlimited throughput. An SM share is a share of the GPU's
# time, and on an H100 the two differ: a loop held to 30 % of the time runs at the boost clock
# (1980 MHz) while the unlimited loop is held at its power limit (about 1370 MHz), so 31 % of
# the time gave 36 % of the throughput (docs/benchmarks.md). The check judges the time share,
# NVML's utilisation read from outside the slice, and prints the throughput ratio beside it.
SHARE_TOLERANCE = 5  # percentage points of GPU time
OOM_LINE = "jupyter-vgpu: out of GPU memory in this slice"
WHEELS = ROOT / "build" / "gpu-wheels"
GPU_MACHINE_PYTHON = "3.12"  # ../shared/FIELD-NOTES.md: the GPU machines' python3

# Child programs. Each prints one JSON object on its last line of stdout.
DRIVER_TOTALS = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
context, free, total, pointer = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0
device = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
assert cuda.cuCtxSetCurrent(context) == 0
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
over_cap = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(5 << 30))
print(json.dumps({"total": total.value, "free": free.value, "over_cap_result": over_cap}))
"""

NVML_TOTALS = """
import json, pynvml
pynvml.nvmlInit()
info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print(json.dumps({"total": info.total, "used": info.used}))
"""

TORCH_TOTALS = """
import json, torch
free, total = torch.cuda.mem_get_info()
print(json.dumps({"total": total, "free": free}))
"""

TORCH_FILL = """
import json, torch
blocks, block = [], 256 << 20
try:
    while len(blocks) < 64:
        blocks.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    print(json.dumps({"raised": None, "allocated": len(blocks) * block}))
except torch.cuda.OutOfMemoryError:
    print(json.dumps({"raised": "torch.cuda.OutOfMemoryError", "allocated": len(blocks) * block}))
"""

CUPY_CHECK = """
import json, cupy
free, total = cupy.cuda.runtime.memGetInfo()
try:
    cupy.empty(5 << 30, dtype=cupy.uint8)
    raised = None
except cupy.cuda.memory.OutOfMemoryError:
    raised = "cupy.cuda.memory.OutOfMemoryError"
print(json.dumps({"total": total, "raised": raised}))
"""

JAX_CHECK = """
import json, jax, jax.numpy as jnp
try:
    jnp.ones(5 << 30, dtype=jnp.uint8).block_until_ready()
    raised = None
except Exception as error:  # XlaRuntimeError; its class moved between JAX releases
    raised = type(error).__name__ if "RESOURCE_EXHAUSTED" in str(error) else f"other: {error}"[:200]
print(json.dumps({"raised": raised, "backend": jax.default_backend()}))
"""

CUDA_BINDINGS_CHECK = """
import json
from cuda.bindings import driver as cu
assert cu.cuInit(0)[0] == 0
device = cu.cuDeviceGet(0)[1]
assert cu.cuCtxSetCurrent(cu.cuDevicePrimaryCtxRetain(device)[1])[0] == 0
error, free, total = cu.cuMemGetInfo()
over_cap = cu.cuMemAlloc(5 << 30)[0]
pinned = cu.cuMemHostAlloc(5 << 30, 0)
print(json.dumps({"total": total, "over_cap_result": int(over_cap), "pinned_5GiB": int(pinned[0]) == 0}))
"""

CUDA_CORE_CHECK = """
import json
from cuda.core import Device
device = Device()
device.set_current()
stream = device.create_stream()
held = device.memory_resource.allocate(1 << 30, stream=stream)
try:
    device.memory_resource.allocate(5 << 30, stream=stream)
    raised = None
except Exception as error:
    raised = "CUDA_ERROR_OUT_OF_MEMORY" if "OUT_OF_MEMORY" in str(error) else str(error)[:200]
print(json.dumps({"held": held.size, "raised": raised}))
"""

NUMBA_CHECK = """
import json
import numpy as np
if not hasattr(np, "row_stack"):  # numba-cuda <= 0.30 registers it; numpy 2.5 removed it
    np.row_stack = np.vstack
from numba import cuda
@cuda.jit
def add_one(values):
    i = cuda.grid(1)
    if i < values.size:
        values[i] += 1
data = cuda.to_device(np.zeros(1 << 20, np.float32))
add_one[(1 << 20) // 256, 256](data)
result = data.copy_to_host()
total = cuda.current_context().get_memory_info().total
try:
    cuda.device_array(5 << 30, np.uint8)
    raised = None
except cuda.cudadrv.driver.CudaAPIError as error:
    raised = int(error.code)
print(json.dumps({"total": total, "raised": raised, "sum": float(result.sum())}))
"""

TORCH_SUSPENDABLE = """
import json, os, sys, torch
size = int(sys.argv[1])
tensor = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
host_copy = tensor.cpu()
print(json.dumps({"pid": os.getpid(), "ready": True}), flush=True)
sys.stdin.readline()  # the checker suspends and resumes this process meanwhile
intact = torch.equal(tensor.cpu(), host_copy)
tensor += 1  # the GPU computes on the restored memory
intact_after_kernel = torch.equal(tensor.cpu(), host_copy + 1)
print(json.dumps({"intact": intact, "intact_after_kernel": intact_after_kernel}), flush=True)
"""

# Issue 34 item 1: a tensor read back while its process is suspended. The read (tensor.cpu():
# the runtime's copy, cuMemcpyDtoHAsync and a synchronize, no hook of libvgpu.so's) waits in
# libvgpu.so's gate saying so, the user's Interrupt (the page's leave_line) fails it with CUDA's
# out-of-memory error, and after the resume the same read gives the same bytes. Each stdin line
# is one read; the child answers each with a JSON line.
TORCH_READ_BACK = """
import json, os, sys, time, torch
tensor = torch.randint(0, 256, (int(sys.argv[1]),), dtype=torch.uint8, device="cuda")
expected = tensor.cpu()
print(json.dumps({"pid": os.getpid(), "region": os.environ.get("VGPU_REGION"),
                  "limits": os.environ.get("VGPU_LIMITS")}), flush=True)
for line in sys.stdin:
    started = time.monotonic()
    try:
        intact, error = torch.equal(tensor.cpu(), expected), None
    except Exception as caught:  # the interrupted read: torch's out-of-memory error
        intact, error = None, f"{type(caught).__name__}: {caught}"[:200]
    print(json.dumps({"intact": intact, "error": error, "seconds": time.monotonic() - started}), flush=True)
"""
READ_BACK_TENSOR = GIB

# Issue 26 item 2: a tensor the program holds and twice as much cached by PyTorch's caching
# allocator (a tensor freed: its block stays reserved). The process answers the limits page's
# release requests as a sliced kernel does (jupyter_vgpu/notebook/release.py, started here by
# hand: it is no IPython kernel); each line on stdin is one suspend and resume by the checker.
TORCH_CACHED = """
import json, os, sys, torch
from jupyter_vgpu.notebook.release import watch_release_requests
held, cached = int(sys.argv[1]), int(sys.argv[2])
tensor = torch.randint(0, 256, (held,), dtype=torch.uint8, device="cuda")
scratch = torch.empty(cached, dtype=torch.uint8, device="cuda")
del scratch  # freed by the program, kept by PyTorch's cache
torch.cuda.synchronize()
host_copy = tensor.cpu()
watch_release_requests()
print(json.dumps({"pid": os.getpid(), "region": os.environ.get("VGPU_REGION"), "limits": os.environ.get("VGPU_LIMITS"),
                  "reserved": torch.cuda.memory_reserved()}), flush=True)
for line in sys.stdin:
    print(json.dumps({"intact": torch.equal(tensor.cpu(), host_copy), "reserved": torch.cuda.memory_reserved()}), flush=True)
"""

FILL_FREE_MEMORY = """
import json, sys, torch
tensor = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps({"allocated": tensor.numel()}))
"""

MATMUL_RATE = """
import json, sys, time, torch
warm_up, seconds = float(sys.argv[1]), float(sys.argv[2])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
def run(duration):
    count, end = 0, time.perf_counter() + duration
    start = time.perf_counter()
    while time.perf_counter() < end:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        count += 10
    return count / (time.perf_counter() - start)
run(warm_up)  # the limiter learns what a launch costs
started = time.time()
rate = run(seconds)
print(json.dumps({"matmuls_per_second": rate, "from": started, "to": time.time()}))
"""


Judge = Callable[[dict, str], tuple[bool, str]]


@dataclass
class Check:
    name: str
    code: str
    judge: Judge
    needs_module: str | None = None
    needs_real_gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)


CHECK_TIMEOUT = 180  # seconds for one child program; a hung one is a failure, not a hung table
LOG: list[str] = []  # every child's command, output and errors, for --log


def slice_command(command: list[str], *, simulate: bool, cores: int = 100) -> list[str]:
    """`jupyter vgpu run` of `command` in a fresh 4 GiB slice, from this checkout whether or not
    the package is installed."""
    return [
        sys.executable,
        "-c",
        "from jupyter_vgpu.cli import main; main()",
        "run",
        "--memory",
        f"{CAP >> 30}GiB",
        "--cores",
        str(cores),
        *(["--simulate"] if simulate else []),
        "--",
        *command,
    ]


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **(env or {})}


def in_slice(command: list[str], *, simulate: bool, cores: int = 100, env: dict[str, str] | None = None):
    """Runs `command` in a fresh 4 GiB slice as a user would (`jupyter vgpu run`); a run past
    CHECK_TIMEOUT ends as exit status 124 with what it printed so far."""
    run = slice_command(command, simulate=simulate, cores=cores)
    try:
        result = subprocess.run(
            run, check=False, env=child_environment(env), capture_output=True, text=True, timeout=CHECK_TIMEOUT
        )
    except subprocess.TimeoutExpired as expired:
        printed = [
            (output.decode(errors="replace") if isinstance(output, bytes) else output) or ""
            for output in (expired.stdout, expired.stderr)
        ]
        result = subprocess.CompletedProcess(run, 124, printed[0], printed[1] + f"\ntimed out after {CHECK_TIMEOUT} s")
    LOG.append(f"$ {' '.join(run)[:300]}\n[exit {result.returncode}]\n{result.stdout}\n--- stderr\n{result.stderr}\n")
    return result


def run_program(
    code: str, *args: str, simulate: bool, cores: int = 100, env: dict[str, str] | None = None
) -> tuple[dict | None, str]:
    """Runs a child program in a slice; returns (the JSON it printed last, its stderr)."""
    result = in_slice([sys.executable, "-c", code, *args], simulate=simulate, cores=cores, env=env)
    lines = result.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]), result.stderr
    except (IndexError, json.JSONDecodeError):
        return None, f"exit {result.returncode}: {result.stderr.strip()[-400:]}"


def totals_are_the_cap(report: dict, stderr: str) -> tuple[bool, str]:
    return report["total"] == CAP, f"total {report['total'] / GIB:.2f} GiB"


def over_cap_refused(report: dict, stderr: str) -> tuple[bool, str]:
    oom_line = "jupyter-vgpu: out of GPU memory in this slice" in stderr
    ok = report["total"] == CAP and report["over_cap_result"] == 2 and oom_line  # CUDA_ERROR_OUT_OF_MEMORY
    return ok, (
        f"total {report['total'] / GIB:.2f} GiB; 5 GiB alloc -> {report['over_cap_result']}; "
        f"OOM line {'printed' if oom_line else 'missing'}"
    )


def filled_to_the_cap(report: dict, stderr: str) -> tuple[bool, str]:
    # The CUDA context's own memory counts against the slice, so the tensors stop short of 4 GiB.
    ok = report["raised"] == "torch.cuda.OutOfMemoryError" and 2.5 * GIB <= report["allocated"] <= CAP
    return ok, f"{report['raised']} after {report['allocated'] / GIB:.2f} GiB of tensors"


def cupy_capped(report: dict, stderr: str) -> tuple[bool, str]:
    ok = report["total"] == CAP and report["raised"] == "cupy.cuda.memory.OutOfMemoryError"
    return ok, f"total {report['total'] / GIB:.2f} GiB; 5 GiB -> {report['raised']}"


def jax_capped(report: dict, stderr: str) -> tuple[bool, str]:
    ok = report["raised"] in ("XlaRuntimeError", "JaxRuntimeError")  # the name differs between JAX releases
    return ok, f"5 GiB array -> {report['raised']} ({report['backend']})"


def once_per_burst(stderr: str) -> tuple[bool, str]:
    count = stderr.count(OOM_LINE)
    return count == 1, f"OOM line {count}x"


def bindings_capped(report: dict, stderr: str) -> tuple[bool, str]:
    once, lines = once_per_burst(stderr)
    ok = report["total"] == CAP and report["over_cap_result"] == 2 and report["pinned_5GiB"] and once
    return ok, (
        f"total {report['total'] / GIB:.2f} GiB; 5 GiB -> {report['over_cap_result']}; "
        f"5 GiB pinned host {'granted' if report['pinned_5GiB'] else 'refused'}; {lines}"
    )


def core_capped(report: dict, stderr: str) -> tuple[bool, str]:
    once, lines = once_per_burst(stderr)
    ok = report["held"] == GIB and report["raised"] == "CUDA_ERROR_OUT_OF_MEMORY" and once
    return ok, f"1 GiB held, 5 GiB -> {report['raised']}; {lines}"


def numba_capped(simulate: bool) -> Judge:
    def judge(report: dict, stderr: str) -> tuple[bool, str]:
        once, lines = once_per_burst(stderr)
        # On a GPU the kernel ran: every element is 1. The simulator runs no kernel code.
        computed = simulate or report["sum"] == float(1 << 20)
        ok = report["total"] == CAP and report["raised"] == 2 and once and computed
        kernel = "launched (not run: simulated)" if simulate else f"sum {report['sum']:.0f}"
        return ok, f"total {report['total'] / GIB:.2f} GiB; @cuda.jit {kernel}; 5 GiB -> {report['raised']}; {lines}"

    return judge


def torch_filled_once(report: dict, stderr: str) -> tuple[bool, str]:
    ok, detail = filled_to_the_cap(report, stderr)
    once, lines = once_per_burst(stderr)
    return ok and once, f"{detail}; {lines}"


CHECKS = [
    Check("CUDA driver: cuMemGetInfo_v2 and a 5 GiB cuMemAlloc_v2", DRIVER_TOTALS, over_cap_refused),
    Check(
        "cuda-bindings: memory info, 5 GiB device and pinned",
        CUDA_BINDINGS_CHECK,
        bindings_capped,
        needs_module="cuda.bindings",
    ),
    Check("cuda.core: memory resource past the cap", CUDA_CORE_CHECK, core_capped, needs_module="cuda.core"),
    Check("NVML: nvmlDeviceGetMemoryInfo", NVML_TOTALS, totals_are_the_cap, needs_module="pynvml"),
    Check(
        "PyTorch: torch.cuda.mem_get_info", TORCH_TOTALS, totals_are_the_cap, needs_module="torch", needs_real_gpu=True
    ),
    Check(
        "PyTorch: fill with 256 MiB tensors", TORCH_FILL, torch_filled_once, needs_module="torch", needs_real_gpu=True
    ),
    Check(
        "PyTorch, cudaMallocAsync: fill",
        TORCH_FILL,
        torch_filled_once,
        needs_module="torch",
        needs_real_gpu=True,
        env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    ),
    Check(
        "PyTorch, expandable_segments: fill",
        TORCH_FILL,
        torch_filled_once,
        needs_module="torch",
        needs_real_gpu=True,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    ),
    Check("CuPy: memGetInfo and a 5 GiB array", CUPY_CHECK, cupy_capped, needs_module="cupy", needs_real_gpu=True),
    Check(
        "JAX: a 5 GiB array",
        JAX_CHECK,
        jax_capped,
        needs_module="jax",
        needs_real_gpu=True,
        env={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    ),
]


def nvidia_smi_row(simulate: bool) -> tuple[str, str, str]:
    name = "nvidia-smi: memory.total in the slice"
    if simulate or not shutil.which("nvidia-smi"):
        return name, "not run", "needs NVIDIA's nvidia-smi and driver"
    result = in_slice(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"], simulate=False)
    shown = result.stdout.strip().splitlines()[:1]
    ok = shown == [str(CAP >> 20)]
    return name, "pass" if ok else "FAIL", f"shows {shown[0] if shown else result.stderr.strip()[-200:]} MiB"


def matmul_row(simulate: bool, warm_up: float, seconds: float) -> tuple[str, str, str]:
    name = f"PyTorch: bf16 matmul loop at a {SHARE} % SM share"
    if simulate:
        return name, "not run", "needs the real driver"
    if importlib.util.find_spec("torch") is None:
        return name, "not run", "torch is not installed"
    timing = (str(warm_up), str(seconds))
    with GpuSampler() as sampled_u:
        unlimited, err_u = run_program(MATMUL_RATE, *timing, simulate=False)
    with GpuSampler() as sampled_l:
        limited, err_l = run_program(MATMUL_RATE, *timing, simulate=False, cores=SHARE)
    if unlimited is None or limited is None:
        return name, "FAIL", (err_u if unlimited is None else err_l)[-300:]
    ratio = limited["matmuls_per_second"] / unlimited["matmuls_per_second"]
    busy_u, clock_u = sampled_u.during(unlimited["from"], unlimited["to"])
    busy_l, clock_l = sampled_l.during(limited["from"], limited["to"])
    ok = abs(busy_l - SHARE) <= SHARE_TOLERANCE
    return (
        name,
        "pass" if ok else "FAIL",
        (
            f"GPU busy {busy_l:.0f} % (goal {SHARE} +/- {SHARE_TOLERANCE}) vs {busy_u:.0f} % unlimited; "
            f"{limited['matmuls_per_second']:.1f} / {unlimited['matmuls_per_second']:.1f} matmuls/s = {ratio:.3f} "
            f"at SM clocks {clock_l:.0f} / {clock_u:.0f} MHz"
        ),
    )


class GpuSampler:
    """Samples GPU 0's utilisation (the share of time a kernel ran, NVML) and SM clock from
    outside the slice every 50 ms, while a `with` block runs."""

    def __enter__(self) -> Self:
        import threading

        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.05):
                busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                self.samples.append((time.time(), busy, clock))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        import pynvml

        self._stop.set()
        self._thread.join()
        pynvml.nvmlShutdown()

    def during(self, start: float, end: float) -> tuple[float, float]:
        """Mean utilisation (%) and SM clock (MHz) sampled between start and end."""
        inside = [(busy, clock) for at, busy, clock in self.samples if start <= at <= end] or [(0, 0)]
        return sum(b for b, _ in inside) / len(inside), sum(c for _, c in inside) / len(inside)


SUSPENDED_TENSOR = 3 * GIB


def gpu_pids() -> list[int]:
    shown = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    return [int(line) for line in shown.stdout.split() if line.strip().isdigit()]


def free_memory() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free
    finally:
        pynvml.nvmlShutdown()


def suspend_row(simulate: bool) -> tuple[str, str, str]:
    """Issue 18 on a real GPU: a PyTorch tensor in a slice is suspended by the controller the
    server uses (holders/checkpoint.py), its pid leaves nvidia-smi, another process allocates the
    memory it gave up, and after the resume the tensor holds the same bytes and computes."""
    name = f"PyTorch: a {SUSPENDED_TENSOR >> 30} GiB tensor suspended to host memory and resumed"
    if simulate:
        return name, "not run", "tests/server/test_suspend.py covers the simulated GPU"
    if importlib.util.find_spec("torch") is None or not shutil.which("nvidia-smi"):
        return name, "not run", "needs torch and nvidia-smi"
    sys.path.insert(0, str(ROOT))
    from jupyter_vgpu.holders.checkpoint import CheckpointController, CheckpointError

    command = slice_command([sys.executable, "-c", TORCH_SUSPENDABLE, str(SUSPENDED_TENSOR)], simulate=False)
    child = subprocess.Popen(
        command,
        env=child_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    facts: list[str] = []
    try:
        ready = json.loads(child.stdout.readline() or "{}")
        if not ready.get("ready"):
            return name, "FAIL", f"the tensor's process did not start: {child.communicate(timeout=30)[1][-300:]}"
        pid = ready["pid"]
        controller = CheckpointController()
        probe = controller.probe([pid])
        if not probe.possible:
            return name, "FAIL", "probe: " + "; ".join(probe.reasons)
        free_before = free_memory()
        suspension = controller.suspend([pid], lock_timeout=10.0)
        moved = suspension.memory
        free_suspended = free_memory()
        gone = pid not in gpu_pids()
        facts.append(
            f"suspend {suspension.seconds:.2f} s for {moved / GIB:.2f} GiB; pid {'gone from' if gone else 'STILL IN'} "
            f"nvidia-smi; free {free_before / GIB:.1f} -> {free_suspended / GIB:.1f} GiB"
        )
        # Another process takes what the suspended one gave up (more than was free before).
        wanted = free_before + GIB  # more than was free before; a new process's context needs ~0.5 GiB of the rest
        other = subprocess.run(
            [sys.executable, "-c", FILL_FREE_MEMORY, str(wanted)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lent = other.returncode == 0 and wanted > free_before
        facts.append(f"another process {'allocated' if lent else 'could NOT allocate'} {wanted / GIB:.1f} GiB")
        resumed_in = controller.resume(suspension)
        back = pid in gpu_pids()
        facts.append(f"resume {resumed_in:.2f} s ({moved / GIB / max(resumed_in, 1e-9):.1f} GiB/s)")
        child.stdin.write("\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=60)
        LOG.append(f"$ suspend check\n{out}\n--- stderr\n{err}\n{other.stderr}\n")
        final = json.loads(out.strip().splitlines()[-1])
        facts.append(
            f"bytes {'intact' if final['intact'] else 'CHANGED'}, kernel after resume {'ran' if final['intact_after_kernel'] else 'WRONG'}"
        )
        ok = gone and lent and back and final["intact"] and final["intact_after_kernel"] and moved >= SUSPENDED_TENSOR
        return name, "pass" if ok else "FAIL", "; ".join(facts)
    except (CheckpointError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, KeyError) as error:
        return name, "FAIL", "; ".join([*facts, f"{type(error).__name__}: {error}"])[-600:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def read_back_row(simulate: bool) -> tuple[str, str, str]:
    """Issue 34 item 1 on a real GPU: a PyTorch tensor's read-back made while its process is
    suspended (the limits page's flag raised, as the server raises it, then the driver's lock and
    checkpoint by the server's controller) waits in libvgpu.so and says so on stderr (the cell), a
    leave_line (Kernel > Interrupt) ends it with an error, and once resumed the read gives the
    tensor's bytes. What it answers too: whether PyTorch's read reaches the driver only through
    entry points libvgpu.so gates (were it to call one of the runtime's private tables first, it
    would block in the driver: no waiting line within 20 s)."""
    name = f"PyTorch: a {READ_BACK_TENSOR >> 30} GiB tensor read back while suspended, interrupted, intact after"
    if simulate:
        return name, "not run", "tests/holders/test_checkpoint.py covers the simulated GPU (cuMemcpyDtoH)"
    if importlib.util.find_spec("torch") is None:
        return name, "not run", "needs torch"
    sys.path.insert(0, str(ROOT))
    import threading

    from jupyter_vgpu.holders.checkpoint import CheckpointController, CheckpointError
    from jupyter_vgpu.holders.region import Region, RegionError

    command = slice_command([sys.executable, "-c", TORCH_READ_BACK, str(READ_BACK_TENSOR)], simulate=False)
    child = subprocess.Popen(
        command,
        env=child_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    said: list[str] = []
    threading.Thread(target=lambda: said.extend(iter(child.stderr.readline, "")), daemon=True).start()
    facts: list[str] = []

    def read() -> None:
        child.stdin.write("\n")
        child.stdin.flush()

    def answer(timeout: float) -> dict:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(child.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return json.loads(found[0]) if found and found[0] else {}

    def said_within(text: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(text in line for line in said):
                return True
            time.sleep(0.05)
        return False

    try:
        ready = json.loads(child.stdout.readline() or "{}")
        if "pid" not in ready or not ready.get("region"):
            return name, "FAIL", f"the process did not start in a slice: {child.communicate(timeout=30)[1][-300:]}"
        controller = CheckpointController()
        with Region.open(ready["region"], limits_path=ready.get("limits") or None) as region:
            region.set_suspended(True)  # the server's order: the flag, then the driver's lock
            suspension = controller.suspend([ready["pid"]], lock_timeout=10.0)
            facts.append(f"suspended {suspension.memory / GIB:.2f} GiB in {suspension.seconds:.2f} s")
            read()
            waited = said_within("waiting for room", 20.0)
            asked = region.resume_requests() > 0
            facts.append(
                f"the read {'said it waits' if waited else 'said NOTHING in 20 s (blocked in the driver?)'}, "
                f"{'asked for room' if asked else 'asked NOTHING'}"
            )
            region.leave_line()  # Kernel > Interrupt
            interrupted = answer(20.0)
            ended = interrupted.get("error") is not None
            facts.append(
                f"interrupt {'ended it: ' + str(interrupted.get('error')) if ended else 'did NOT end it within 20 s'}"
            )
            resumed_in = controller.resume(suspension)
            region.set_suspended(False)
            facts.append(f"resumed in {resumed_in:.2f} s")
            if not ended:
                after = answer(60.0)  # the blocked read itself, once unlocked
            read()
            after = answer(60.0)
            intact = bool(after.get("intact"))
            facts.append(f"read after the resume: bytes {'intact' if intact else 'CHANGED or no answer'}")
        child.stdin.close()  # the child ends; its stderr is read by the thread above
        child.wait(timeout=60)
        LOG.append(f"$ read-back check\n--- stderr\n{''.join(said)}\n")
        return name, "pass" if waited and asked and ended and intact else "FAIL", "; ".join(facts)
    except (CheckpointError, RegionError, subprocess.TimeoutExpired, json.JSONDecodeError, OSError) as error:
        return name, "FAIL", "; ".join([*facts, f"{type(error).__name__}: {error}"])[-600:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


RELEASE_HELD, RELEASE_CACHED = GIB, 2 * GIB  # with a context, under the 4 GiB cap


def release_row(simulate: bool) -> tuple[str, str, str]:
    """Issue 26 item 2 on a real GPU: a process holding a 1 GiB tensor with 2 GiB more cached by
    PyTorch's caching allocator is suspended and resumed twice by the server's controller: first as
    it is (the checkpoint copies the cache too), then after the release the server asks for first
    (the limits page's request: torch.cuda.empty_cache() in the process, the driver's pools
    trimmed by libvgpu.so). Host bytes and suspend/resume seconds of each, bytes intact."""
    name = "PyTorch: cached memory released before a suspend (host bytes, seconds, with and without)"
    if simulate:
        return name, "not run", "tests/server/test_suspend.py covers the simulated GPU (a stand-in torch)"
    if importlib.util.find_spec("torch") is None:
        return name, "not run", "needs torch"
    sys.path.insert(0, str(ROOT))
    from jupyter_vgpu.holders.checkpoint import CheckpointController, CheckpointError
    from jupyter_vgpu.holders.region import Region, RegionError

    command = slice_command(
        [sys.executable, "-c", TORCH_CACHED, str(RELEASE_HELD), str(RELEASE_CACHED)], simulate=False
    )
    env = child_environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    facts: list[str] = []

    def round_trip(controller: CheckpointController, pid: int) -> tuple[int, float, float, dict]:
        suspension = controller.suspend([pid], lock_timeout=10.0)
        resumed_in = controller.resume(suspension)
        child.stdin.write("\n")
        child.stdin.flush()
        return suspension.memory, suspension.seconds, resumed_in, json.loads(child.stdout.readline() or "{}")

    try:
        ready = json.loads(child.stdout.readline() or "{}")
        if "pid" not in ready or not ready.get("region"):
            return name, "FAIL", f"the process did not start in a slice: {child.communicate(timeout=30)[1][-300:]}"
        controller = CheckpointController()
        moved, suspend_s, resume_s, after = round_trip(controller, ready["pid"])
        facts.append(
            f"as it is: {moved / GIB:.2f} GiB to host memory, suspend {suspend_s:.2f} s, resume {resume_s:.2f} s"
        )
        with Region.open(ready["region"], limits_path=ready.get("limits") or None) as region:
            started = time.monotonic()
            released = region.release_cached(wait=5.0)
            release_s = time.monotonic() - started
        moved_after, suspend_after, resume_after, final = round_trip(controller, ready["pid"])
        facts.append(
            f"released {released.get('torch', 0) / GIB:.2f} GiB cached by PyTorch and "
            f"{released.get('pools', 0) / GIB:.2f} GiB of the driver's pools in {release_s:.2f} s; then "
            f"{moved_after / GIB:.2f} GiB to host memory, suspend {suspend_after:.2f} s, resume {resume_after:.2f} s"
        )
        intact = after.get("intact") and final.get("intact")
        facts.append(f"bytes {'intact' if intact else 'CHANGED'}")
        child.stdin.close()
        out, err = child.communicate(timeout=60)
        LOG.append(f"$ release check\n{out}\n--- stderr\n{err}\n")
        ok = (
            bool(intact)
            and released.get("torch", 0) >= RELEASE_CACHED
            and moved_after <= moved - RELEASE_CACHED
            and "unanswered" not in released
        )
        return name, "pass" if ok else "FAIL", "; ".join(facts)
    except (CheckpointError, RegionError, subprocess.TimeoutExpired, json.JSONDecodeError, OSError) as error:
        return name, "FAIL", "; ".join([*facts, f"{type(error).__name__}: {error}"])[-600:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def prepare(wheels: Path) -> None:
    """Fills `wheels` with what a GPU machine needs to run these checks: this project's wheel and
    its dependencies, for that machine's Python, and prints the command to run there."""
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    target = ["--only-binary=:all:", "--python-version", GPU_MACHINE_PYTHON, "--implementation", "cp"]
    platforms = [f"--platform=manylinux_2_{minor}_x86_64" for minor in (17, 28, 34)] + ["--platform=linux_x86_64"]
    subprocess.run([*pip, "download", "-d", str(wheels), *target, *platforms, *dependencies], check=True)
    size = sum(path.stat().st_size for path in wheels.iterdir()) >> 20
    relative = wheels.relative_to(ROOT)
    print(f"\n{len(list(wheels.iterdir()))} files, {size} MiB in {relative}. On the GPU machine, in this checkout:")
    print(
        f"  python3 -m pip install -q --no-index --find-links {relative} jupyter-vgpu && "
        "python3 benchmarks/framework_checks.py --log framework_checks.log"
    )
    print("(one check alone: add --only 'read back while suspended', or any part of a check's name)")
    print("with jupyter_vgpu/_native (python native/build.py) carried along, or built there by the same command.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="the simulated GPU: the driver-API clients only")
    parser.add_argument("--smoke", action="store_true", help="as CI runs it: --simulate")
    parser.add_argument("--prepare", action="store_true", help=f"download what a GPU machine needs into {WHEELS}")
    parser.add_argument(
        "--check-timeout", type=float, default=CHECK_TIMEOUT, help="seconds one child program may run (a FAIL past it)"
    )
    parser.add_argument("--log", type=Path, help="write every child program's command, output and errors here")
    parser.add_argument(
        "--only",
        metavar="TEXT",
        help="run only the checks whose name contains TEXT (case-insensitive), e.g. 'read back while suspended'",
    )
    args = parser.parse_args()
    if args.prepare:
        prepare(WHEELS)
        return
    simulate = args.simulate or args.smoke
    globals()["CHECK_TIMEOUT"] = args.check_timeout

    checks = [
        *CHECKS,
        Check(
            "numba-cuda: @cuda.jit and a 5 GiB device array",
            NUMBA_CHECK,
            numba_capped(simulate),
            needs_module="numba.cuda",
        ),
    ]

    def check_row(check: Check) -> tuple[str, str, str]:
        if check.needs_real_gpu and simulate:
            return check.name, "not run", "needs the real driver"
        if check.needs_module and importlib.util.find_spec(check.needs_module) is None:
            return check.name, "not run", f"{check.needs_module} is not installed"
        report, stderr = run_program(check.code, simulate=simulate, env=check.env)
        if report is None:
            return check.name, "FAIL", stderr
        ok, detail = check.judge(report, stderr)
        return check.name, "pass" if ok else "FAIL", detail

    row_makers: list[tuple[str, Callable[[], tuple[str, str, str]]]] = [
        *((check.name, lambda check=check: check_row(check)) for check in checks),
        ("nvidia-smi", lambda: nvidia_smi_row(simulate)),
        ("suspend", lambda: suspend_row(simulate)),
        ("read back while suspended", lambda: read_back_row(simulate)),
        ("release", lambda: release_row(simulate)),
        ("matmul", lambda: matmul_row(simulate, warm_up=3.0, seconds=10.0)),
    ]
    if args.only:
        row_makers = [(name, make) for name, make in row_makers if args.only.lower() in name.lower()]
        if not row_makers:
            parser.error(f"no check's name contains {args.only!r}")
    rows = []
    for name, make_row in row_makers:
        try:
            row = make_row()
        except Exception as error:  # noqa: BLE001 -- one broken check must not cost the rest of the table (a GPU run is one shot)
            row = (name, "FAIL", f"the check itself broke: {type(error).__name__}: {error}"[:600])
        rows.append(row)
        print(f"[{row[1]}] {row[0]}: {row[2]}", flush=True)
        if args.log:
            args.log.write_text("\n".join(LOG))

    where = "simulated GPU: launches cost time, no kernel code runs" if simulate else "real driver"
    print(f"\nReal programs in a 4 GiB slice ({where})")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'check':<{width}}  {'result':<8} detail")
    for name, status, detail in rows:
        print(f"{name:<{width}}  {status:<8} {detail}")
    sys.exit(1 if any(status == "FAIL" for _, status, _ in rows) else 0)


if __name__ == "__main__":
    # A user's own server on this machine is not joined: every check's slice is as sized.
    with private_machine("vgpu-bench-frameworks-"):
        main()
