"""Fixtures of the real-client tests: NVIDIA's cuda-bindings and cuda.core and numba-cuda (from
PyPI, pinned in pyproject.toml's test extras), run in slices of the simulated GPU as a user runs
them (`jupyter vgpu run`, a notebook kernel of a real server). The simulator never runs kernel
code: these tests check the memory and launch paths, never a kernel's results."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

JUPYTER = str(Path(sys.executable).with_name("jupyter"))
OOM_LINE = "jupyter-vgpu: out of GPU memory in this slice"


@pytest.fixture
def user_env(sim_env, tmp_path):
    """A user's environment on a private simulated machine: nothing preloaded or on the library
    path (`jupyter vgpu run --simulate` sets both up), Jupyter's folders of the test's own."""
    env = dict(sim_env)
    env.pop("LD_LIBRARY_PATH")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "data")
    # numba caches compiled kernels beside the source; the scripts come from -c.
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    return env


@pytest.fixture
def in_slice(user_env, tmp_path):
    """in_slice(code, *run_options, env=user_env) -> the finished `jupyter vgpu run --simulate
    RUN_OPTIONS -- python client.py` running CODE, output captured (a file, not -c: a
    multiprocessing child started by spawn imports its parent's main module)."""
    scripts = iter(range(1000))

    def run(code: str, *options: str, env: dict[str, str] | None = None, timeout: float = 180):
        script = tmp_path / f"client_{next(scripts)}.py"
        script.write_text(textwrap.dedent(code))
        command = [JUPYTER, "vgpu", "run", "--simulate", *options, "--", sys.executable, str(script)]
        return subprocess.run(
            command, check=False, env=env or user_env, capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture
def jp_server_config(in_process_sim, tmp_path, monkeypatch):
    """A real Jupyter server (pytest-jupyter, in this process) with the extension on the
    session's one in-process simulated machine (tests/conftest.py's in_process_sim)."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "numba-cache"))
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}},
        "VGPUApp": {
            "simulate": True,
            "ledger_path": str(tmp_path / "ledger.sqlite"),
            "region_dir": str(tmp_path / "regions"),
        },
    }


@pytest.fixture
def sliced_kernelspec(jp_data_dir) -> str:
    """A kernelspec whose kernels start in 1 GiB slices with every SM."""
    folder = jp_data_dir / "kernels" / "vgpu-clients"
    folder.mkdir(parents=True)
    provisioner = {"provisioner_name": "vgpu-provisioner", "config": {"memory": "1GiB", "cores": "100"}}
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (GPU slice, clients)",
        "language": "python",
        "metadata": {"kernel_provisioner": provisioner},
    }
    (folder / "kernel.json").write_text(json.dumps(spec))
    return "vgpu-clients"


def values(completed: subprocess.CompletedProcess) -> dict[str, str]:
    """The "key value" lines a client script printed; fails with its output if it failed."""
    assert completed.returncode == 0, f"exit {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
    found = {}
    for line in completed.stdout.splitlines():
        key, _, value = line.partition(" ")
        found[key] = value
    return found
