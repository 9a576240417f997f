"""cuGetProcAddress serves every entry point the simulated driver exports, under the name and
version a client asks for, and the real driver's entry points the simulator does not model
answer CUDA_ERROR_NOT_SUPPORTED instead of being missing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_sim_exports import entry_points, exported

NATIVE = Path(__file__).resolve().parents[2] / "native"
CUDA_ERROR_NOT_SUPPORTED = 801


def driver_api() -> list[tuple[str, str, int]]:
    text = (NATIVE / "sim" / "cuda" / "driver_api.def").read_text()
    return [(n, b, int(v)) for n, b, v in re.findall(r"^SIM_DRIVER_API\((\w+), (\w+), (\d+)\)$", text, re.MULTILINE)]


def modelled() -> set[str]:
    lists = ("VGPU_CUDA_ENTRY_POINTS", "VGPU_CUDA_OPTIONAL_ENTRY_POINTS", "VGPU_SIM_CLIENT_ENTRY_POINTS")
    return set().union(*(entry_points("cuda_abi.h", macro) for macro in lists))


def per_thread(name: str) -> bool:
    return name.endswith(("_ptds", "_ptsz"))


def ask(program: Path, env: dict[str, str], rows: list[tuple[str, str, int]], call: set[str]) -> dict[str, list[str]]:
    lines = "".join(f"{n} {b} {v} {int(per_thread(n))}{' call' if n in call else ''}\n" for n, b, v in rows)
    result = subprocess.run(
        [str(program)], input=lines, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    answers: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        name, *rest = line.split()
        answers.setdefault(name, []).extend(rest)
    return answers


@pytest.fixture(scope="module")
def proc_address(compile_c) -> Path:
    return compile_c("sim_proc_address")


def test_the_exports_are_the_real_drivers_entry_points(native_libs):
    real = {name for name, _, _ in driver_api()}
    assert len(real) > 600
    assert modelled() <= real
    assert exported(native_libs.sim_dir / "libcuda.so.1") == real
    listed = (native_libs.sim_dir / "not-modelled.txt").read_text().split()
    not_modelled = {name for name in listed if not name.startswith("#") and name.startswith("cu")}
    same_function = {n for n in real - modelled() if per_thread(n) and n[:-5] in modelled()}
    assert not_modelled == real - modelled() - same_function


@pytest.mark.parametrize("driver", ["12.8", "13.0"])
def test_get_proc_address_serves_every_export_at_every_version_it_answers(proc_address, env, driver):
    env["VGPU_SIM_DRIVER_VERSION"] = driver
    driver_version = int(driver.split(".")[0]) * 1000 + int(driver.split(".")[1]) * 10
    rows = driver_api()
    not_modelled = set((Path(env["LD_LIBRARY_PATH"].split(":")[0]) / "not-modelled.txt").read_text().split())
    # Each variant as its own version asks for it, and as newer clients ask: a variant is
    # handed out until the version that introduced the next one of its name.
    versions = sorted({v for _, _, v in rows if v <= driver_version} | {driver_version})
    newest: dict[tuple[str, bool, int], tuple[int, str]] = {}
    for name, base, introduced in rows:
        for asked in versions:
            key = (base, per_thread(name), asked)
            if introduced <= asked and introduced > newest.get(key, (-1, ""))[0]:
                newest[key] = (introduced, name)
    queries = [(name, base, asked) for (base, _, asked), (_, name) in newest.items()]
    answers = ask(proc_address, env, queries, call=set())
    assert answers.pop("driver_version") == [str(driver_version)]
    wrong = sorted({name for name, verdicts in answers.items() for verdict in verdicts[0::2] if verdict != "served"})
    assert wrong == []
    assert {name for name, _, v in rows if v <= driver_version} == set(answers)
    # Newer than the driver: cuGetProcAddress does not hand them out (an older variant of the name
    # where there is one), as a real driver of that version; the library still exports them.
    too_new = [(name, base, v) for name, base, v in rows if v > driver_version]
    assert (driver == "12.8") == bool(too_new)
    unserved = ask(proc_address, env, too_new, call=set())
    unserved.pop("driver_version")
    assert "served" not in {verdicts[0] for verdicts in unserved.values()}
    # What is not modelled answers NOT_SUPPORTED, called with no arguments at all.
    called = ask(proc_address, env, [r for r in rows if r[0] in not_modelled and r[2] <= driver_version], not_modelled)
    called.pop("driver_version")
    assert {verdicts[2] for verdicts in called.values()} == {str(CUDA_ERROR_NOT_SUPPORTED)}


@pytest.mark.parametrize("driver", ["12.8", "13.0"])
def test_a_cuda_12_or_13_client_asking_for_a_modelled_name_gets_a_modelled_variant(driver):
    # A variant the simulator does not model must not shadow one it does: cuCtxCreate asked for
    # at 12.0 is cuCtxCreate_v3, at 12.5 cuCtxCreate_v4.
    driver_version = int(driver.split(".")[0]) * 1000 + int(driver.split(".")[1]) * 10
    rows = driver_api()
    names_of: dict[str, set[str]] = {}
    for name, base, _ in rows:
        names_of.setdefault(base, set()).add(name)
    stubs = set()
    for asked in sorted({v for _, _, v in rows if 12000 <= v <= driver_version} | {12000, driver_version}):
        newest: dict[tuple[str, bool], tuple[int, str]] = {}
        for name, base, introduced in rows:
            if introduced <= asked:
                key = (base, per_thread(name))
                newest[key] = max(newest.get(key, (-1, "")), (introduced, name))
        stubs |= {
            (asked, name)
            for (base, threaded), (_, name) in newest.items()
            if names_of[base] & modelled() and name not in modelled() and not (threaded and name[:-5] in modelled())
        }
    assert sorted(stubs) == []


def test_a_malformed_driver_version_is_refused_saying_what_is_accepted(env):
    env["VGPU_SIM_DRIVER_VERSION"] = "14"
    code = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "100"  # CUDA_ERROR_NO_DEVICE
    assert "VGPU_SIM_DRIVER_VERSION is '14'; it accepts a CUDA version 12.0 to 13.9" in result.stderr
