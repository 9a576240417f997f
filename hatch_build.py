"""Hatch build hook: compile native/ (the interposer and the simulated GPU) into the package."""

from __future__ import annotations

import runpy
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        native = runpy.run_path(str(root / "native" / "build.py"))
        native["build"](root / "jupyter_vgpu" / "_native")
        # The libraries are Linux x86-64/arm64 binaries: the wheel is not pure Python.
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
