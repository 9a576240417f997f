"""What the simulated libraries export and how their symbols are found."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from sim_helpers import probe

HEADERS = Path(__file__).resolve().parents[2] / "native" / "include" / "vgpu"


def entry_points(header: str, macro: str) -> set[str]:
    text = (HEADERS / header).read_text()
    body = re.search(rf"#define {macro}\(X\)(.*?)(?:\n\n|\n#)", text, re.S).group(1)
    return set(re.findall(r"X\([^,]+,\s*(\w+),", body))


def exported(library: Path) -> set[str]:
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}


def test_libcuda_exports_every_entry_point_and_nothing_else(native_libs):
    required = entry_points("cuda_abi.h", "VGPU_CUDA_ENTRY_POINTS")
    optional = entry_points("cuda_abi.h", "VGPU_CUDA_OPTIONAL_ENTRY_POINTS")
    assert len(required) > 80 and optional
    assert exported(native_libs.sim_dir / "libcuda.so.1") == required | optional


def test_libnvidia_ml_exports_every_entry_point_and_nothing_else(native_libs):
    required = entry_points("nvml_abi.h", "VGPU_NVML_ENTRY_POINTS")
    assert len(required) > 20
    assert exported(native_libs.sim_dir / "libnvidia-ml.so.1") == required


def test_pynvml_finds_every_symbol_it_needs_for_the_calls_jupyter_vgpu_makes():
    import pynvml

    source = Path(pynvml.__file__).read_text()
    wanted = set()
    for wrapper in ("nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString", "nvmlDeviceGetCount",
                    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetName",
                    "nvmlDeviceGetUUID", "nvmlDeviceGetComputeRunningProcesses_v3",
                    "nvmlDeviceGetProcessUtilization"):
        body = re.search(rf"\ndef {wrapper}\(.*?(?=\ndef )", source, re.S).group(0)
        wanted |= set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', body))
    assert wanted <= entry_points("nvml_abi.h", "VGPU_NVML_ENTRY_POINTS")


def test_get_proc_address_resolves_base_names_by_version_and_stream_mode(programs, env):
    seen = probe(programs, env, "proc-address")
    for key in ("cuInit", "cuMemAlloc", "cuCtxCreate_12080", "cuCtxCreate_12000", "cuLaunchKernel_ptds",
                "cuMemAlloc_ptds", "cuGetProcAddress", "cuDeviceGetUuid_11000", "cuGraphInstantiate_12000",
                "cuGraphInstantiate_11040", "cuGraphInstantiateWithFlags_11040", "cuGraphExecUpdate_12000",
                "cuGraphExecUpdate_11000", "unknown_fn"):
        assert seen[key] == "1", key
    assert seen["before_init"] == "0"  # the runtime asks for cuInit itself before initialising
    assert (seen["unknown"], seen["unknown_status"]) == ("500", "1")  # NOT_FOUND, SYMBOL_NOT_FOUND
    assert (seen["too_new"], seen["too_new_status"]) == ("500", "2")  # VERSION_NOT_SUFFICIENT


def test_error_names_and_strings_cover_the_driver_codes(programs, env):
    seen = probe(programs, env, "proc-address")
    assert seen["error_name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["error_string"] == "too many blocks in cooperative launch"
    assert seen["error_unknown"] == "1"
