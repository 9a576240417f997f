"""libvgpu.so exports exactly its hooks (hooks.def) and dlsym: nothing else of ours leaks into
the program's symbol namespace, and no hook is forgotten in exports.map."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

INTERPOSER = Path(__file__).resolve().parents[2] / "native" / "interposer"


def hooks_def_names() -> set[str]:
    text = (INTERPOSER / "hooks.def").read_text()
    return set(re.findall(r"^VGPU_(?:CUDA|NVML)_HOOK\((\w+)\)", text, re.M))


def test_exported_dynamic_symbols_are_the_hooks_and_dlsym(native_libs):
    output = subprocess.run(
        ["nm", "-D", "--defined-only", str(native_libs.vgpu)], check=True, capture_output=True, text=True
    ).stdout
    exported = {line.split()[-1].split("@")[0] for line in output.splitlines() if line.strip()}
    assert exported == hooks_def_names() | {"dlsym"}


def test_exports_map_lists_exactly_the_hooks_and_dlsym():
    text = (INTERPOSER / "exports.map").read_text()
    global_part = text.split("global:")[1].split("local:")[0]
    listed = set(re.findall(r"(\w+)\s*;", global_part))
    assert listed == hooks_def_names() | {"dlsym"}
