"""Hatch build hook: compile native/ (the interposer and the simulated GPU) into the package.

The native parts are plain shared libraries (libvgpu.so is preloaded, the simulated libcuda.so.1
and libnvidia-ml.so.1 are found through LD_LIBRARY_PATH, Python opens them with ctypes and reads
region.h with cffi's ABI mode), not Python extension modules. So a wheel works with every Python 3
and is tagged ``py3-none-<platform>``, where the platform is the manylinux tag that auditwheel
finds the libraries comply with (their newest glibc symbol version decides it):

    pip wheel .                                       # this machine's architecture
    JUPYTER_VGPU_WHEEL_ARCH=aarch64 pip wheel .       # cross-built (Debian's gcc-aarch64-linux-gnu)

``JUPYTER_VGPU_WHEEL_ARCH`` is ``x86_64`` or ``aarch64`` (default: this machine's). The compiler
is ``$CC`` (default ``cc``) for this machine's architecture and ``<arch>-linux-gnu-gcc`` for the
other one (``JUPYTER_VGPU_WHEEL_CC`` names another). The libraries are built in a temporary folder
and put into the wheel as ``jupyter_vgpu/_native``, so a cross build never overwrites the
checkout's own build. The wheel is refused when a library is of another architecture or needs a
shared library outside the manylinux policy (nothing is grafted: libvgpu.so must depend on glibc
alone), and once written it is checked again with ``auditwheel show``.

The sdist carries native/'s sources and compiles nothing. An editable install builds the
libraries for this machine into ``jupyter_vgpu/_native`` in the checkout, where the package runs.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ARCH_VARIABLE = "JUPYTER_VGPU_WHEEL_ARCH"
CROSS_COMPILER_VARIABLE = "JUPYTER_VGPU_WHEEL_CC"
# ELF e_machine of each supported architecture.
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}
# The names pip also accepts for a manylinux_2_5/2_12/2_17 wheel (PEP 600); auditwheel adds them too.
LEGACY_ALIASES = {"manylinux_2_5": "manylinux1", "manylinux_2_12": "manylinux2010", "manylinux_2_17": "manylinux2014"}


def host_architecture() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def target_architecture() -> str:
    arch = os.environ.get(ARCH_VARIABLE, "").strip() or host_architecture()
    if arch not in ELF_MACHINES:
        raise SystemExit(
            f"jupyter-vgpu wheel: {ARCH_VARIABLE}={arch!r} is not supported; use one of {', '.join(ELF_MACHINES)}"
        )
    return arch


def compiler_environment(arch: str) -> dict[str, str]:
    """The environment native/build.py runs in: CC is the cross compiler for another architecture."""
    env = dict(os.environ)
    if arch != host_architecture():
        env["CC"] = os.environ.get(CROSS_COMPILER_VARIABLE) or f"{arch}-linux-gnu-gcc"
    return env


def build_native(root: Path, output: Path, arch: str) -> None:
    env = compiler_environment(arch)
    compiler = shlex.split(env.get("CC", "cc"))[0]
    if not shutil.which(compiler):
        raise SystemExit(
            f"jupyter-vgpu wheel: {compiler} not found: building the native libraries for {arch} needs it "
            "(for aarch64 on x86-64: Debian's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross)"
        )
    subprocess.run([sys.executable, str(root / "native" / "build.py"), str(output)], env=env, check=True)


def check_elf_machines(directory: Path, arch: str) -> None:
    """Every ELF file under `directory` is built for `arch` (auditwheel only warns about others)."""
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        with path.open("rb") as file:
            header = file.read(20)
        if header[:4] != b"\x7fELF":
            continue
        machine = int.from_bytes(header[18:20], "big" if header[5] == 2 else "little")
        if machine != ELF_MACHINES[arch]:
            raise SystemExit(
                f"jupyter-vgpu wheel: {path.name} is not an {arch} library (ELF machine {machine}); "
                f"check $CC or ${CROSS_COMPILER_VARIABLE}"
            )


def auditwheel_show(wheel: Path) -> dict:
    """`auditwheel show --json` of a wheel: the manylinux tag its ELF files comply with and why."""
    result = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], check=False, capture_output=True, text=True
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        report = {"error": (result.stdout + result.stderr).strip() or f"auditwheel exited {result.returncode}"}
    if result.returncode != 0 or "error" in report or "overall_tag" not in report:
        raise SystemExit(f"jupyter-vgpu wheel: auditwheel show {wheel.name}: {report.get('error', report)}")
    if report["external_libs"]:
        raise SystemExit(
            f"jupyter-vgpu wheel: the native libraries need {', '.join(report['external_libs'])}, outside the "
            "manylinux policy; they must depend on glibc alone (nothing is grafted into the wheel)"
        )
    return report


def platform_tag(native: Path, arch: str) -> str:
    """The manylinux tag auditwheel finds for the libraries in `native`, with its legacy alias if it
    has one, read from a throwaway wheel that holds nothing else."""
    with tempfile.TemporaryDirectory(prefix="jupyter-vgpu-probe-") as scratch:
        probe = Path(scratch) / f"probe-0-py3-none-linux_{arch}.whl"
        names = []
        with zipfile.ZipFile(probe, "w") as archive:
            for path in sorted(native.rglob("*")):
                if path.is_file():
                    names.append(f"probe/{path.relative_to(native).as_posix()}")
                    archive.write(path, names[-1])
            archive.writestr("probe-0.dist-info/METADATA", "Metadata-Version: 2.1\nName: probe\nVersion: 0\n")
            archive.writestr(
                "probe-0.dist-info/WHEEL",
                f"Wheel-Version: 1.0\nGenerator: hatch_build.py\nRoot-Is-Purelib: false\nTag: py3-none-linux_{arch}\n",
            )
            names += ["probe-0.dist-info/METADATA", "probe-0.dist-info/WHEEL", "probe-0.dist-info/RECORD"]
            archive.writestr("probe-0.dist-info/RECORD", "".join(f"{name},,\n" for name in names))
        tag = auditwheel_show(probe)["overall_tag"]
    if not tag.endswith(f"_{arch}") or not tag.startswith("manylinux_"):
        raise SystemExit(f"jupyter-vgpu wheel: auditwheel found {tag} for {arch}, not a manylinux tag")
    base = tag[: -len(f"_{arch}")]
    return f"{tag}.{LEGACY_ALIASES[base]}_{arch}" if base in LEGACY_ALIASES else tag


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        self._staging = None
        self._platform = None
        if self.target_name != "wheel":
            return  # the sdist ships native/'s sources; a wheel built from it compiles them
        root = Path(self.root)
        if version == "editable":
            # The package runs from the checkout: its libraries go where it looks for them (the
            # editable wheel itself holds only a .pth file, and hatchling tags it py3-none-any).
            if target_architecture() != host_architecture():
                raise SystemExit(f"jupyter-vgpu: an editable install is for this machine; unset {ARCH_VARIABLE}")
            build_native(root, root / "jupyter_vgpu" / "_native", host_architecture())
            return
        arch = target_architecture()
        build_data["pure_python"] = False
        self._staging = tempfile.TemporaryDirectory(prefix="jupyter-vgpu-native-")
        native = Path(self._staging.name) / "_native"
        build_native(root, native, arch)
        check_elf_machines(native, arch)
        self._platform = platform_tag(native, arch)
        self.app.display_info(f"jupyter-vgpu: native libraries for {arch}, wheel tagged py3-none-{self._platform}")
        build_data["tag"] = f"py3-none-{self._platform}"
        build_data["force_include"][str(native)] = "jupyter_vgpu/_native"

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if self._staging is not None:
            self._staging.cleanup()
            self._staging = None
        if self._platform is None:
            return
        # The wheel as written, every ELF file in it, complies with the tag it carries.
        found = auditwheel_show(Path(artifact_path))["overall_tag"]
        if found != self._platform.split(".")[0]:
            raise SystemExit(f"jupyter-vgpu wheel: auditwheel show finds {found}, the wheel says {self._platform}")
