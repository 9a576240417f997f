"""Fixtures shared by every test: the native libraries built from this checkout, C test programs
linked against the simulated GPU, and slices (a region plus the environment of a process in it)."""

from __future__ import annotations

import os
import runpy
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
SIM_DEVICE_DEFAULT = "name=jupyter-vgpu test GPU,memory=16GiB,sms=100,context_memory=0"


@dataclass(frozen=True)
class NativeLibs:
    vgpu: Path
    sim_dir: Path
    include: Path


@pytest.fixture(scope="session")
def native_libs() -> NativeLibs:
    """Builds native/ from this checkout once per test session, so tests always run the C
    code as it is in the tree (not a stale build from install time)."""
    build = runpy.run_path(str(ROOT / "native" / "build.py"))
    output = ROOT / "jupyter_vgpu" / "_native"
    build["build"](output)
    return NativeLibs(vgpu=output / "libvgpu.so", sim_dir=output / "sim", include=ROOT / "native" / "include")


@pytest.fixture(scope="session")
def compile_c(native_libs, tmp_path_factory):
    """compile_c(name, *flags) -> Path of tests/programs/<name>.c built against the simulated GPU."""
    out_dir = tmp_path_factory.mktemp("programs")
    built: dict[tuple, Path] = {}

    def compile_program(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in built:
            suffix = "".join(flag.strip("-").replace("=", "_").replace("/", "_") for flag in flags)
            executable = out_dir / f"{name}{suffix}"
            command = [
                os.environ.get("CC", "cc"),
                "-std=c11",
                "-D_GNU_SOURCE",
                "-O2",
                "-g",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-I{native_libs.include}",
                *flags,
                "-o",
                str(executable),
                str(PROGRAMS / f"{name}.c"),
                f"-L{native_libs.sim_dir}",
                "-l:libcuda.so.1",
                "-l:libnvidia-ml.so.1",
                "-lpthread",
                "-ldl",
            ]
            subprocess.run(command, check=True)
            built[key] = executable
        return built[key]

    return compile_program


@pytest.fixture
def sim_env(native_libs, tmp_path) -> dict[str, str]:
    """Environment of a process on a private simulated machine (its own state file)."""
    env = dict(os.environ)
    for name in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES", "VGPU_LOG_LEVEL"):
        env.pop(name, None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(native_libs.sim_dir), env.get("LD_LIBRARY_PATH")]))
    env["VGPU_SIM_STATE"] = str(tmp_path / "sim-state")
    env["VGPU_SIM_DEVICES"] = SIM_DEVICE_DEFAULT
    return env


def simulated_device_uuid(env: dict[str, str], index: int = 0) -> str:
    """UUID of a simulated device, as NVML reports it, read in a child with the env's setup."""
    code = (
        "import pynvml; pynvml.nvmlInit(); "
        f"print(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex({index})))"
    )
    result = subprocess.run(
        [os.environ.get("PYTHON", __import__("sys").executable), "-c", code],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


@pytest.fixture
def make_slice(native_libs, tmp_path):
    """make_slice(env, memory_limit=..., sm_share=100, policy="hard") -> (slice_env, region)."""
    from jupyter_vgpu.region import Region

    regions = []

    def create(env: dict[str, str], memory_limit: int = 0, sm_share: int = 100, policy: str = "hard", device_index: int = 0):
        path = tmp_path / f"slice-{len(regions)}.region"
        region = Region.create(
            path,
            memory_limit=memory_limit,
            sm_share=sm_share,
            policy=policy,
            device_uuid=simulated_device_uuid(env, device_index),
            device_index=device_index,
        )
        regions.append(region)
        slice_env = dict(env)
        slice_env["LD_PRELOAD"] = str(native_libs.vgpu)
        slice_env["VGPU_REGION"] = str(path)
        return slice_env, region

    yield create
    for region in regions:
        region.close()
