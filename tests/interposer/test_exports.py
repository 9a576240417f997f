"""libvgpu.so exports exactly its hooks (hooks.def), its gate's trampolines (every other entry
point of the driver, sim/cuda/driver_api.def, but those hooks.def leaves alone) and dlsym:
nothing else of ours leaks into the program's symbol namespace, and no hook or driver entry
point is forgotten. The export list is generated from hooks.def and the driver's list at build
time (native/build.py), never kept by hand."""

from __future__ import annotations

import re
import runpy
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTERPOSER = ROOT / "native" / "interposer"


def hooks_def_names(text: str) -> set[str]:
    return set(re.findall(r"^VGPU_(?:CUDA|NVML)_HOOK\((\w+)\)", text, re.MULTILINE))


def ungated_names(text: str) -> set[str]:
    return set(re.findall(r"^VGPU_CUDA_UNGATED\((\w+)\)", text, re.MULTILINE))


def gated_names(text: str) -> set[str]:
    """Every entry point of the driver that `text` (a hooks.def) neither hooks nor leaves alone."""
    driver = (ROOT / "native" / "sim" / "cuda" / "driver_api.def").read_text()
    every = set(re.findall(r"^SIM_DRIVER_API\((\w+),", driver, re.MULTILINE))
    return every - hooks_def_names(text) - ungated_names(text)


def global_names(script: str) -> set[str]:
    return set(re.findall(r"(\w+)\s*;", script.split("global:")[1].split("local:")[0]))


def test_exported_dynamic_symbols_are_the_hooks_the_gated_driver_entry_points_and_dlsym(native_libs):
    output = subprocess.run(
        ["nm", "-D", "--defined-only", str(native_libs.vgpu)], check=True, capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1].split("@")[0] for line in output.splitlines() if line.strip()}
    text = (INTERPOSER / "hooks.def").read_text()
    assert exported == hooks_def_names(text) | gated_names(text) | {"dlsym"}
    # Copies, memsets and synchronizes are gated; the error strings and private tables are not.
    assert {"cuMemcpyDtoH_v2", "cuMemsetD8_v2", "cuCtxSynchronize", "cuStreamSynchronize", "cuInit"} <= exported
    assert not {"cuGetErrorString", "cuGetErrorName", "cuDriverGetVersion", "cuGetExportTable"} & exported


def test_the_version_script_follows_hooks_def(tmp_path):
    """A hook added to hooks.def is exported without another list to edit (none is kept in the
    tree), and everything else stays local."""
    assert not (INTERPOSER / "exports.map").exists()
    hooks_def = tmp_path / "hooks.def"
    hooks_def.write_text(
        (INTERPOSER / "hooks.def")
        .read_text()
        .replace(
            "#undef VGPU_CUDA_HOOK",
            "VGPU_CUDA_HOOK(cuMemHostAlloc)\nVGPU_NVML_HOOK(nvmlDeviceGetCount_v2)\n#undef VGPU_CUDA_HOOK",
        )
    )
    script = runpy.run_path(str(ROOT / "native" / "build.py"))["version_script"](hooks_def)
    names = hooks_def_names(hooks_def.read_text())
    assert {"cuMemHostAlloc", "nvmlDeviceGetCount_v2"} <= names
    assert "cuMemHostAlloc" not in gated_names(hooks_def.read_text())  # a hook now, no longer gated
    assert global_names(script) == names | gated_names(hooks_def.read_text()) | {"dlsym"}
    assert re.search(r"local:\s*\*;", script)
