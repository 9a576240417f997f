"""libvgpu.so and HAMi-core in one process: the lower memory cap wins, whichever of the two has it.

On Kubernetes with HAMi, HAMi-core's interposer, also a file named libvgpu.so, is loaded into
every container process through /etc/ld.so.preload; the dynamic linker loads the libraries of
LD_PRELOAD first and those of /etc/ld.so.preload after them, so ours comes first in the search
order and HAMi-core right after it. A test cannot edit /etc/ld.so.preload, so the stand-in for
HAMi-core (tests/programs/hami_standin.c, built as a library named libvgpu.so in a folder of its
own) is put after ours in LD_PRELOAD: the same objects in the same order. The probe
(tests/programs/coexist_probe.c) checks in /proc/self/maps that both files named libvgpu.so are
mapped, then allocates over the simulated GPU on each way a program reaches the driver (direct
linking, dlopen + dlsym, cuGetProcAddress), with the stand-in finding its real entry points as
HAMi-core does (the driver's handle) and through dlsym(RTLD_NEXT) (libvgpu.so's dlsym).

Who refused is told by stderr: ours prints "out of GPU memory", the stand-in "hami_standin: OOM".
A hook of the stand-in entered again while it runs (a forwarding loop) aborts the probe."""

from __future__ import annotations

import subprocess

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GIB, MIB

PATHS = ["direct", "dlsym", "procaddr"]
RESOLVE = ["handle", "rtld_next"]
NVML_SUCCESS = 0
STANDIN_FIELDS = ["cap", "used", "alloc", "free", "info", "nvml", "procaddr", "refused"]
COMMANDS = ["maps", "init", "alloc:1536M", "alloc:512M", "info", "nvml", "standin", "free", "info", "standin"]


@pytest.fixture(scope="module")
def coexist_probe(compile_c):
    return compile_c("coexist_probe")


@pytest.fixture(scope="module")
def hami_standin(build_shared):
    return build_shared("hami_standin", "libvgpu.so")


def run_probe(executable, env: dict[str, str], path: str, *commands: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(
        [str(executable), f"--path={path}", *commands], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    lines: dict[str, list[list[str]]] = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        lines.setdefault(fields[0], []).append(fields[1:])
    return result, lines


def both_loaded(sim_env, make_slice, standin, ours_limit: int, standin_limit: str, resolve: str) -> dict[str, str]:
    """A slice of `ours_limit` bytes with the stand-in loaded after us, capped at `standin_limit`
    (HAMi's format)."""
    env, _ = make_slice(sim_env, memory_limit=ours_limit)
    env["LD_PRELOAD"] = f"{env['LD_PRELOAD']} {standin}"
    env["CUDA_DEVICE_MEMORY_LIMIT"] = standin_limit
    env["HAMI_STANDIN_RESOLVE"] = resolve
    return env


def check_common(result, lines, native_libs, standin, path: str):
    """Both libraries named libvgpu.so are mapped, nothing failed, and after the refused 1.5 GiB
    the 0.5 GiB fits and both views agree on the lower cap (1 GiB)."""
    assert result.returncode == 0, result.stderr
    assert "re-entered" not in result.stderr
    (maps,) = lines["maps"]
    assert int(maps[0]) == 2 and set(maps[1:]) == {str(native_libs.vgpu), str(standin)}, maps
    assert lines["init"] == [[str(CUDA_SUCCESS)]]
    assert lines["alloc"] == [[str(CUDA_ERROR_OUT_OF_MEMORY)], [str(CUDA_SUCCESS)]]
    assert lines["info"][0] == [str(CUDA_SUCCESS), str(512 * MIB), str(GIB)]
    assert lines["nvml"] == [[str(NVML_SUCCESS), str(512 * MIB), str(GIB)]]
    assert lines["free"] == [[str(CUDA_SUCCESS)]]
    assert lines["info"][1] == [str(CUDA_SUCCESS), str(GIB), str(GIB)]
    # The stand-in was in the chain of every call: it counted the 0.5 GiB and saw it freed. On the
    # cuGetProcAddress path its own cuGetProcAddress_v2 answered too, with its wrappers for
    # cuMemAlloc and cuMemFree and the driver's own cuMemGetInfo_v2 (as HAMi-core built without
    # HOOK_MEMINFO_ENABLE does): each must still lead through both libraries.
    before, after = (dict(zip(STANDIN_FIELDS, map(int, fields), strict=True)) for fields in lines["standin"])
    assert (before["used"], before["free"], before["info"], before["nvml"]) == (512 * MIB, 0, 1, 1)
    assert (before["procaddr"] > 0) == (path == "procaddr")
    assert (after["used"], after["free"], after["info"]) == (0, 1, 2)
    return before


@pytest.mark.parametrize("resolve", RESOLVE)
@pytest.mark.parametrize("path", PATHS)
def test_our_lower_cap_wins_with_hami_loaded_after_us(
    coexist_probe, hami_standin, native_libs, sim_env, make_slice, path, resolve
):
    env = both_loaded(sim_env, make_slice, hami_standin, GIB, "2048m", resolve)
    result, lines = run_probe(coexist_probe, env, path, *COMMANDS)
    standin = check_common(result, lines, native_libs, hami_standin, path)
    assert standin["cap"] == 2 * GIB
    # Ours refused the 1.5 GiB before the stand-in saw it; the 0.5 GiB went through both.
    assert (standin["alloc"], standin["refused"]) == (1, 0)
    ours = [line for line in result.stderr.splitlines() if "out of GPU memory" in line]
    assert len(ours) == 1 and "asked for 1.5 GiB" in ours[0], result.stderr
    assert "hami_standin: OOM" not in result.stderr


@pytest.mark.parametrize("resolve", RESOLVE)
@pytest.mark.parametrize("path", PATHS)
def test_hamis_lower_cap_wins_with_hami_loaded_after_us(
    coexist_probe, hami_standin, native_libs, sim_env, make_slice, path, resolve
):
    env = both_loaded(sim_env, make_slice, hami_standin, 2 * GIB, "1024m", resolve)
    result, lines = run_probe(coexist_probe, env, path, *COMMANDS)
    standin = check_common(result, lines, native_libs, hami_standin, path)
    assert standin["cap"] == GIB
    # Ours let the 1.5 GiB through (under its 2 GiB) and the stand-in refused it.
    assert (standin["alloc"], standin["refused"]) == (2, 1)
    assert "out of GPU memory" not in result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("hami_standin: OOM")]
    assert len(refusals) == 1 and f"asked for {1536 * MIB} bytes" in refusals[0], result.stderr


def test_without_the_stand_in_our_cap_alone_lets_the_allocation_through(
    coexist_probe, native_libs, sim_env, make_slice
):
    """The control: the same probe with only ours (2 GiB) loaded, so the refusal above is the
    stand-in's doing, and the probe sees one libvgpu.so."""
    env, _ = make_slice(sim_env, memory_limit=2 * GIB)
    env["CUDA_DEVICE_MEMORY_LIMIT"] = "1024m"
    result, lines = run_probe(coexist_probe, env, "direct", "maps", "init", "alloc:1536M", "info", "standin")
    assert result.returncode == 0, result.stderr
    assert lines["maps"] == [["1", str(native_libs.vgpu)]]
    assert lines["alloc"] == [[str(CUDA_SUCCESS)]]
    assert lines["info"] == [[str(CUDA_SUCCESS), str(512 * MIB), str(2 * GIB)]]
    assert lines["standin"] == [["absent"]]
