"""The interposer's dlsym keeps the program's own RTLD_NEXT lookups (and another preloaded
library's) resolving relative to their real caller, at -O0 and -O2, on every call; a hooked
name whose real entry point the driver lacks is reported missing on every path, as the driver
alone would report it. Each test runs on this machine and on aarch64 under qemu-user (the
`machine` fixture): the dlsym entry point is assembly, one per architecture."""

from __future__ import annotations

import os
import subprocess

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GIB
from support import run_checked


@pytest.mark.parametrize("optimisation", ["-O0", "-O2"])
def test_program_rtld_next_lookups_find_the_next_library(machine, sim_env, make_slice, optimisation):
    env, _ = make_slice(sim_env, memory_limit=GIB)
    result = subprocess.run(
        machine.command(machine.compile("rtld_next", optimisation)),
        check=False,
        env=machine.environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["hello through the wrapper"] * 3
    assert lines[3:] == ["puts-next OK", "getpid-next OK", "hook-next-before-load OK", "hook-next 1", "wrapper absent"]


@pytest.mark.parametrize("order", ["vgpu-first", "wrapper-first"])
@pytest.mark.parametrize("optimisation", ["-O0", "-O2"])
def test_other_preloaded_librarys_rtld_next_lookups_still_work(machine, sim_env, make_slice, optimisation, order):
    env, _ = make_slice(sim_env, memory_limit=GIB)
    env = machine.environment(env)
    wrapper = machine.build_shared("rtld_wrapper", "librtld_wrapper.so")
    libraries = [str(machine.libs.vgpu), str(wrapper)]
    env["LD_PRELOAD"] = ":".join(libraries if order == "vgpu-first" else libraries[::-1])
    result = run_checked(machine.command(machine.compile("rtld_next", optimisation)), env=env, timeout=60)
    assert result.stdout.splitlines()[3:] == [
        "puts-next OK",
        "getpid-next OK",
        "hook-next-before-load OK",
        "hook-next 1",
        "wrapper OK",
    ]


def test_hooked_name_the_driver_lacks_is_missing_on_every_path(machine, sim_env, make_slice):
    fake = machine.build_shared("driver_without_vmm", "libcuda.so.1")
    env, _ = make_slice(sim_env, memory_limit=GIB)
    env = machine.environment(env)
    env["LD_LIBRARY_PATH"] = f"{fake.parent}{os.pathsep}{env['LD_LIBRARY_PATH']}"
    driver_env = {name: value for name, value in env.items() if name not in ("LD_PRELOAD", "VGPU_REGION")}
    names = ["cuMemCreate", "cuMemRelease", "cuMemAlloc_v2"]
    program = machine.compile("missing_entry")

    def run(environment):
        result = subprocess.run(
            machine.command(program, *names), check=False, env=environment, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    driver_alone, interposed = run(driver_env), run(env)
    # name, dlsym(driver), dlsym(RTLD_DEFAULT), dlsym(RTLD_NEXT), cuGetProcAddress rc:status:found
    assert driver_alone[:3] == ["cuMemCreate 0 0 0 500:1:0", "cuMemRelease 0 0 0 500:1:0", "cuMemAlloc_v2 1 1 1 0:0:1"]
    assert interposed[:3] == driver_alone[:3]
    assert driver_alone[3:] == [f"alloc-dlsym {CUDA_SUCCESS}", f"alloc-procaddr {CUDA_SUCCESS}"]
    # ... and what was found of the driver is our hook: 2 GiB is over the 1 GiB slice
    assert interposed[3:] == [f"alloc-dlsym {CUDA_ERROR_OUT_OF_MEMORY}", f"alloc-procaddr {CUDA_ERROR_OUT_OF_MEMORY}"]
