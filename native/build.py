"""Build the native libraries of jupyter-vgpu with the system C compiler.

Used by the wheel build hook (hatch_build.py) and by hand:

    python native/build.py [OUTPUT_DIR]        # default: jupyter_vgpu/_native

Needs only a C11 compiler (``$CC``, default ``cc``): no CUDA toolkit, no NVIDIA headers.
Every target compiles with ``-Wall -Wextra -Werror`` and hidden visibility; what a library
exports is listed in its ``exports.map``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
INCLUDE = NATIVE / "include"
DEFAULT_OUTPUT = NATIVE.parent / "jupyter_vgpu" / "_native"

COMMON_FLAGS = [
    "-std=c11",
    "-D_GNU_SOURCE",
    "-O2",
    "-g",
    "-fPIC",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
    f"-I{INCLUDE}",
]


@dataclass(frozen=True)
class Library:
    """One shared library: its sources are every .c and .S file of its directories."""

    output: str  # path relative to the output directory
    directories: tuple[str, ...]  # relative to native/
    exports: str  # version script, relative to native/
    libraries: tuple[str, ...] = ("-ldl", "-lpthread")
    # Linker flags of this library alone. The simulated driver and NVML link with -Bsymbolic: a
    # call from one of their entry points to another (nvmlDeviceGetCount_v2 to nvmlDeviceGetCount)
    # stays inside the library, as in a real driver, instead of re-entering a preloaded
    # interposer of the callee (HAMi-core's libvgpu.so recursed until its stack ran out).
    link_flags: tuple[str, ...] = ()

    def sources(self) -> list[Path]:
        found: list[Path] = []
        for directory in self.directories:
            found += sorted((NATIVE / directory).glob("*.c"))
            found += sorted((NATIVE / directory).glob("*.S"))
        return found


LIBRARIES = (
    Library("libvgpu.so", ("interposer",), "interposer/exports.map"),
    Library("sim/libcuda.so.1", ("sim/common", "sim/cuda"), "sim/cuda/exports.map", link_flags=("-Wl,-Bsymbolic",)),
    Library("sim/libnvidia-ml.so.1", ("sim/common", "sim/nvml"), "sim/nvml/exports.map", link_flags=("-Wl,-Bsymbolic",)),
)

# Headers shipped inside the package: Python reads the region layout from the same text.
SHIPPED_HEADERS = ("vgpu/region.h",)


def compiler() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc"))


def build_library(library: Library, output_dir: Path) -> Path:
    sources = library.sources()
    if not sources:
        raise SystemExit(f"native/build.py: no sources for {library.output}")
    target = output_dir / library.output
    target.parent.mkdir(parents=True, exist_ok=True)
    soname = Path(library.output).name
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    command = [
        *compiler(),
        *COMMON_FLAGS,
        "-shared",
        f"-Wl,-soname,{soname}",
        f"-Wl,--version-script={NATIVE / library.exports}",
        "-Wl,-z,now",
        "-Wl,-z,defs",
        *library.link_flags,
        "-o",
        str(staging),
        *map(str, sources),
        *library.libraries,
    ]
    subprocess.run(command, check=True)
    # Renamed into place: a process starting meanwhile (another test session, a running
    # kernel) maps either the old library or the new one, never a half-written file.
    os.replace(staging, target)
    return target


def build(output_dir: Path = DEFAULT_OUTPUT) -> list[Path]:
    """Compile every library into ``output_dir`` and copy the shared headers beside them."""
    built = [build_library(library, output_dir) for library in LIBRARIES]
    for header in SHIPPED_HEADERS:
        destination = output_dir / "include" / header
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(INCLUDE / header, destination)
        built.append(destination)
    return built


if __name__ == "__main__":
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT
    for path in build(output):
        print(path)
