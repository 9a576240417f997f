"""The packages people install: the sdist, and the wheels built from it.

The sdist holds sources only (native/, labextension/'s TypeScript); a wheel built from it compiles
them with gcc and Node. The wheel holds no Python extension module (the native parts are shared
libraries loaded by LD_PRELOAD, LD_LIBRARY_PATH and ctypes), so it is tagged py3-none with the
manylinux platform auditwheel finds for its libraries, and it works where no compiler and no Node
are: installed into a fresh virtual environment whose PATH has neither, it runs a program in a
slice of the simulated GPU, enables the server extension and brings the prebuilt lab extension.
The aarch64 wheel is cross-built (JUPYTER_VGPU_WHEEL_ARCH=aarch64, hatch_build.py) and checked the
same way, short of running it.

Cost: one sdist, two wheel builds from one unpacked copy of it (the second reuses its
node_modules) and one virtual environment whose dependencies come from pip's cache at the
versions of the running one; 2.5 minutes on the shared two-core development machine with warm pip
and npm caches (the venv's install about half of it, the first wheel a third).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import venv_with_pinned_dependencies

ROOT = Path(__file__).resolve().parents[2]
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}
LIBRARIES = (
    "jupyter_vgpu/_native/libvgpu.so",
    "jupyter_vgpu/_native/sim/libcuda.so.1",
    "jupyter_vgpu/_native/sim/libnvidia-ml.so.1",
)
NOT_ON_PATH = ("gcc", "cc", "npm", "node")
PYNVML_PROBE = "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)))"

pytestmark = pytest.mark.timeout(900)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Runs `command`, failing the test with its output when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def build_environment(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("JUPYTER_VGPU_WHEEL_ARCH", "JUPYTER_VGPU_WHEEL_CC", "HATCH_JUPYTER_BUILDER_SKIP_NPM")
    }
    # npm from its cache without revalidating each package, and no audit: half the lab
    # extension's install time (the lockfile pins every version either way).
    npm = {"npm_config_prefer_offline": "true", "npm_config_audit": "false", "npm_config_fund": "false"}
    return env | npm | extra


def build_wheel(source: Path, output: Path, **extra: str) -> Path:
    output.mkdir(exist_ok=True)
    before = set(output.glob("*.whl"))
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(output), str(source)],
        env=build_environment(**extra),
    )
    (wheel,) = set(output.glob("*.whl")) - before
    return wheel


def auditwheel_show(wheel: Path) -> dict:
    return json.loads(run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)]).stdout)


def elf_machine(data: bytes) -> int:
    assert data[:4] == b"\x7fELF"
    return int.from_bytes(data[18:20], "little")


def check_platform_wheel(wheel: Path, arch: str) -> str:
    """The wheel is py3-none-manylinux_2_N_<arch> with N <= 28 (it installs on RHEL 8's glibc 2.28),
    auditwheel agrees, and its libraries are <arch> ELF files needing glibc alone. Returns the
    platform tag."""
    match = re.fullmatch(rf"jupyter_vgpu-[^-]+-py3-none-(manylinux_2_(\d+)_{arch})\.whl", wheel.name)
    assert match, wheel.name
    assert int(match[2]) <= 28, f"{wheel.name} does not install on glibc 2.28"
    report = auditwheel_show(wheel)
    assert report["overall_tag"] == match[1], report
    assert report["external_libs"] == {}, report
    assert set(report["versioned_symbols"]) <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, report
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert set(LIBRARIES) <= names
        for library in LIBRARIES:
            assert elf_machine(archive.read(library)) == ELF_MACHINES[arch], library
        (wheel_file,) = (name for name in names if name.endswith(".dist-info/WHEEL"))
        metadata = archive.read(wheel_file).decode()
    assert "Root-Is-Purelib: false" in metadata
    assert f"Tag: py3-none-{match[1]}" in metadata
    # No Python extension module: nothing ties the wheel to one interpreter.
    assert not [name for name in names if re.search(r"\.(cpython-|abi3\.so|pyd$)", name)]
    return match[1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("sdist")
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(output), str(ROOT)], env=build_environment())
    (archive,) = output.glob("jupyter_vgpu-*.tar.gz")
    return archive


@pytest.fixture(scope="module")
def source(sdist, tmp_path_factory) -> Path:
    """The sdist unpacked, as pip unpacks it to build a wheel."""
    destination = tmp_path_factory.mktemp("source")
    with tarfile.open(sdist) as archive:
        # The "data" filter where this Python has it (3.10.12+, 3.11.4+): plain files only.
        archive.extractall(destination, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = destination.iterdir()
    return unpacked


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(scope="module")
def x86_64_wheel(source, wheels) -> Path:
    return build_wheel(source, wheels, JUPYTER_VGPU_WHEEL_ARCH="x86_64")


def test_the_sdist_holds_sources_and_no_builds(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for expected in (
        "pyproject.toml",
        "hatch_build.py",
        "LICENSE",
        "CHANGELOG.md",
        "CONTRIBUTING.md",
        "README.md",
        "native/build.py",
        "native/interposer/hooks.def",
        "labextension/package.json",
        "labextension/src/index.ts",
    ):
        assert expected in names, expected
    built = [
        name
        for name in names
        if name.startswith(("jupyter_vgpu/_native", "jupyter_vgpu/labextension/", "labextension/lib/"))
        or "node_modules" in name
        or name.endswith((".so", ".so.1", ".tsbuildinfo", ".pyc"))
    ]
    assert not built


def test_the_x86_64_wheel_is_manylinux_and_for_any_python_3(x86_64_wheel):
    check_platform_wheel(x86_64_wheel, "x86_64")
    with zipfile.ZipFile(x86_64_wheel) as archive:
        names = set(archive.namelist())
    data = f"jupyter_vgpu-{x86_64_wheel.name.split('-')[1]}.data/data/"
    for expected in (
        "jupyter_vgpu/_native/include/vgpu/region.h",
        f"{data}share/jupyter/kernels/python3-vgpu/kernel.json",
        f"{data}etc/jupyter/jupyter_server_config.d/jupyter_vgpu.json",
        f"{data}share/jupyter/labextensions/jupyter-vgpu/package.json",
        f"{data}share/jupyter/labextensions/jupyter-vgpu/install.json",
    ):
        assert expected in names, expected


def test_the_installed_wheel_works_without_compilers_or_node(x86_64_wheel, tmp_path):
    """README's first example, with nothing but the wheel and its dependencies installed."""
    venv, constraints = venv_with_pinned_dependencies(tmp_path)
    run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--no-compile",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            str(x86_64_wheel),
            "jupyterlab",
        ]
    )

    home = tmp_path / "home"
    home.mkdir()
    path = str(venv / "bin")
    for tool in NOT_ON_PATH:
        assert shutil.which(tool, path=path) is None, tool
    env = {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8"}

    def jupyter(*arguments: str) -> str:
        result = run([str(venv / "bin" / "jupyter"), *arguments], env=env, cwd=home)
        return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)

    shown = jupyter("vgpu", "run", "--simulate", "--memory", "1GiB", "--", "python", "-c", PYNVML_PROBE)
    assert "c_nvmlMemory_t(total: 1073741824 B, free: 1073741824 B, used: 0 B)" in shown

    extensions = jupyter("server", "extension", "list")
    assert re.search(r"^\s*jupyter_vgpu enabled$", extensions, re.MULTILINE), extensions
    assert re.search(r"^\s*jupyter_vgpu \S+ OK$", extensions, re.MULTILINE), extensions

    labextensions = jupyter("labextension", "list")
    assert f"{venv}/share/jupyter/labextensions" in labextensions, labextensions
    assert re.search(r"^\s*jupyter-vgpu v\S+ enabled OK \(python, jupyter-vgpu\)$", labextensions, re.MULTILINE), (
        labextensions
    )

    # The package and its libraries are the wheel's, not the checkout's.
    where = run(
        [str(venv / "bin" / "python"), "-c", "import jupyter_vgpu.native as n; print(n.interposer_path())"],
        env=env,
        cwd=home,
    ).stdout.strip()
    assert where.startswith(str(venv)), where


def test_the_aarch64_wheel_is_manylinux_with_aarch64_libraries(source, wheels, x86_64_wheel):
    if not shutil.which("aarch64-linux-gnu-gcc") and os.uname().machine != "aarch64":
        pytest.fail(
            "aarch64-linux-gnu-gcc not found: the aarch64 wheel needs Debian's gcc-aarch64-linux-gnu and "
            "libc6-dev-arm64-cross (README.md's install block installs them as root)"
        )
    wheel = build_wheel(source, wheels, JUPYTER_VGPU_WHEEL_ARCH="aarch64")
    check_platform_wheel(wheel, "aarch64")

    def package_files(path: Path) -> set[str]:
        with zipfile.ZipFile(path) as archive:
            return {name for name in archive.namelist() if "/static/" not in name and ".dist-info/" not in name}

    assert package_files(wheel) == package_files(x86_64_wheel)
