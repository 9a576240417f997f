"""Where the native parts built with the package live."""

from __future__ import annotations

from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent / "_native"


class NativeLibraryMissing(RuntimeError):
    """The package was installed without its native libraries."""


def _existing(path: Path) -> Path:
    if not path.exists():
        raise NativeLibraryMissing(
            f"{path} is missing: jupyter-vgpu's native libraries were not built. Install the package "
            "with a C compiler present (`pip install .`), or build them in a checkout with "
            "`python native/build.py`."
        )
    return path


def interposer_path() -> Path:
    """``libvgpu.so``, the LD_PRELOAD interposer."""
    return _existing(NATIVE_DIR / "libvgpu.so")


def simulator_dir() -> Path:
    """The folder holding the simulated ``libcuda.so.1`` and ``libnvidia-ml.so.1``."""
    directory = NATIVE_DIR / "sim"
    _existing(directory / "libcuda.so.1")
    _existing(directory / "libnvidia-ml.so.1")
    return directory


def region_header_path() -> Path:
    """The region layout header, shared by the C side and :mod:`jupyter_vgpu.region`."""
    return _existing(NATIVE_DIR / "include" / "vgpu" / "region.h")
