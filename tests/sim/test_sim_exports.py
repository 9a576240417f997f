"""What the simulated libraries export and how their symbols are found."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from sim_helpers import GIB, MIB, probe, run_program

CUDA_SUCCESS = "0"
NVML_ERROR_UNINITIALIZED = "1"

HEADERS = Path(__file__).resolve().parents[2] / "native" / "include" / "vgpu"


def entry_points(header: str, macro: str) -> set[str]:
    text = (HEADERS / header).read_text()
    body = re.search(rf"#define {macro}\(X\)(.*?)(?:\n\n|\n#)", text, re.DOTALL).group(1)
    return set(re.findall(r"X\([^,]+,\s*(\w+),", body))


def exported(library: Path) -> set[str]:
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}


def relocated(library: Path) -> set[str]:
    """Symbols the dynamic loader resolves for the library (names in its relocations)."""
    listing = subprocess.run(
        ["readelf", "--relocs", "--wide", str(library)], capture_output=True, text=True, check=True
    )
    return set(re.findall(r"^\s*[0-9a-f]+\s+[0-9a-f]+\s+\S+\s+[0-9a-f]+\s+(\w+)", listing.stdout, re.MULTILINE))


def test_libcuda_exports_every_entry_point_it_models(native_libs):
    # and the real driver's others (tests/sim/test_sim_proc_address.py)
    required = entry_points("cuda_abi.h", "VGPU_CUDA_ENTRY_POINTS")
    optional = entry_points("cuda_abi.h", "VGPU_CUDA_OPTIONAL_ENTRY_POINTS")
    assert len(required) > 80 and optional
    assert exported(native_libs.sim_dir / "libcuda.so.1") >= required | optional


def test_libnvidia_ml_exports_every_entry_point_and_nothing_else(native_libs):
    required = entry_points("nvml_abi.h", "VGPU_NVML_ENTRY_POINTS")
    assert len(required) > 20
    assert exported(native_libs.sim_dir / "libnvidia-ml.so.1") == required


def test_the_entry_points_hami_core_resolves_at_start_are_there(native_libs):
    # HAMi-core's libvgpu.so crashed over the simulated driver without these.
    assert {
        "cuDeviceGetDefaultMemPool",
        "cuDeviceGetMemPool",
        "cuDeviceSetMemPool",
        "cuMemPoolGetAttribute",
        "cuMemPoolSetAttribute",
        "cuMemPoolTrimTo",
    } <= exported(native_libs.sim_dir / "libcuda.so.1")
    assert "nvmlDeviceGetComputeRunningProcesses" in exported(native_libs.sim_dir / "libnvidia-ml.so.1")


def test_pynvml_finds_every_symbol_it_needs_for_the_calls_jupyter_vgpu_makes():
    import pynvml

    source = Path(pynvml.__file__).read_text()
    wanted = set()
    for wrapper in (
        "nvmlInitWithFlags",
        "nvmlShutdown",
        "nvmlErrorString",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization",
    ):
        body = re.search(rf"\ndef {wrapper}\(.*?(?=\ndef )", source, re.DOTALL).group(0)
        wanted |= set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', body))
    assert wanted <= entry_points("nvml_abi.h", "VGPU_NVML_ENTRY_POINTS")


def test_get_proc_address_resolves_base_names_by_version_and_stream_mode(programs, env):
    seen = probe(programs, env, "proc-address")
    for key in (
        "cuInit",
        "cuMemAlloc",
        "cuCtxCreate_12080",
        "cuCtxCreate_12000",
        "cuCtxCreate_11000",
        "cuLaunchKernel_ptds",
        "cuMemAlloc_ptds",
        "cuGetProcAddress",
        "cuDeviceGetUuid_11000",
        "cuGraphInstantiate_12000",
        "cuGraphInstantiate_11040",
        "cuGraphInstantiateWithFlags_11040",
        "cuGraphExecUpdate_12000",
        "cuGraphExecUpdate_11000",
        "unknown_fn",
    ):
        assert seen[key] == "1", key
    assert seen["before_init"] == "0"  # the runtime asks for cuInit itself before initialising
    assert (seen["unknown"], seen["unknown_status"]) == ("500", "1")  # NOT_FOUND, SYMBOL_NOT_FOUND
    assert (seen["too_new"], seen["too_new_status"]) == ("500", "2")  # VERSION_NOT_SUFFICIENT


def test_error_names_and_strings_cover_the_driver_codes(programs, env):
    seen = probe(programs, env, "proc-address")
    assert seen["error_name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["error_string"] == "too many blocks in cooperative launch"
    assert seen["error_unknown"] == "1"


def test_calls_and_addresses_of_their_own_entry_points_bind_inside_the_libraries(native_libs):
    # Resolved by the loader, nvmlDeviceGetCount_v2's call to nvmlDeviceGetCount (or the address
    # cuGetProcAddress hands out) would go to a preloaded interposer's definition: -Bsymbolic.
    for library in ("libcuda.so.1", "libnvidia-ml.so.1"):
        path = native_libs.sim_dir / library
        assert exported(path) and relocated(path)
        assert relocated(path) & exported(path) == set(), library


def test_every_name_of_a_query_gives_the_same_answer(programs, env):
    seen = run_program(programs.entry_points, env, "versions")
    assert seen["same_uuid"] == "1"
    assert seen["total"] == str(16 * GIB)
    assert seen["nvml_count"] == seen["nvml_count_v2"] == "1"
    assert seen["nvml_cuda_version"] == seen["nvml_cuda_version_v2"] == "13000"  # the default setting
    assert seen["nvml_same_handle"] == "1"
    assert seen["nvml_total"] == str(16 * GIB)
    assert seen["used_after_alloc"] == seen["nvml_used"] == seen["nvml_used_v2"] == str(5 * MIB)
    assert seen["used_with_async"] == str(11 * MIB)  # 5 + 1 + 1 + 2 + 2
    assert seen["used_after_async"] == str(11 * MIB)  # the default pool keeps what was freed into it
    assert seen["used_after_sync"] == str(5 * MIB)
    assert seen["used_at_end"] == "0"
    for key in (
        "alloc_async",
        "alloc_async_ptsz",
        "alloc_from_pool",
        "alloc_from_pool_ptsz",
        "free_async",
        "free_async_ptsz",
        "free_pooled",
        "free_pooled_ptsz",
        "launch",
        "launch_ptsz",
        "launch_ex",
        "launch_ex_ptsz",
        "launch_cooperative",
        "launch_cooperative_ptsz",
        "instantiate",
        "instantiate_ptsz",
        "graph_launch",
        "graph_launch_ptsz",
    ):
        assert seen[key] == CUDA_SUCCESS, key
    assert seen["nvml_shutdown_once_more"] == NVML_ERROR_UNINITIALIZED  # three inits, three shutdowns
