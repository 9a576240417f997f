"""CI holds on a shared machine (issue 27): the test session and every benchmark smoke of README.md's
test block run beside a user's own Jupyter server with jupyter-vgpu on the simulated GPU, started
as a user starts it (Jupyter's and the simulated GPU's default places, under the user's home and
runtime folder), whose kernel holds all of its GPU. A program that joined that server's ledger
would find no room; one that shared its simulated GPU, another device list in use.

The user's runtime folder stands in for /dev/shm (XDG_RUNTIME_DIR), so that this test leaves the
real user's simulated GPU alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster.build import cache_folder
from private_machine import PLACES
from support import CUDA_PRELUDE, JUPYTER, JupyterProcess, kernel_client, wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)  # every smoke, one after another
USERS_GPU = "name=a user's own GPU,memory=4GiB,sms=100,context_memory=0"
HOLD_ALL = CUDA_PRELUDE + "\nfree, total = memory()\nprint(allocate(total))\n"


def readme_smokes() -> list[str]:
    """The benchmark smokes of README.md's test block, as CI runs them."""
    block = re.search(r"<!-- ci:test -->\s*```\w*\n(.*?)\n```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "README.md has no ci:test block"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.startswith("python benchmarks/")]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(the user's environment, their server): the environment a user's shell has on this machine
    (none of the test session's own places), in which their server runs, with its kernel holding
    every byte and SM of their simulated GPU."""
    folder = tmp_path_factory.mktemp("user")
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in PLACES and name not in ("VGPU_SIM_STATE", "LD_PRELOAD", "VGPU_REGION", "PYTEST_CURRENT_TEST")
    }
    environment.update(HOME=str(folder / "home"), XDG_RUNTIME_DIR=str(folder / "runtime"), VGPU_SIM_DEVICES=USERS_GPU)
    # The control plane README's install block built, where it built it (under the real home):
    # a user who ran that block has it, whatever home their server runs under.
    environment["JUPYTER_VGPU_CLUSTER_CACHE"] = str(cache_folder().parent)
    (folder / "runtime").mkdir(mode=0o700)
    server = JupyterProcess(
        environment,
        folder / "server.log",
        "users-token",
        "--VGPUApp.simulate=True",
        "--VGPUApp.default_memory=4GiB",
        "--VGPUApp.default_cores=100",
        "--VGPUApp.default_policy=hard",
        f"--ServerApp.root_dir={folder}",
        timeout=180,  # a loaded shared machine
    )
    try:
        kernel = server.api("POST", "api/kernels", {"name": "python3-vgpu"})["id"]
        # Where the user's own tools find it: Jupyter's runtime folder under their home.
        connection_file = folder / "home" / ".local" / "share" / "jupyter" / "runtime" / f"kernel-{kernel}.json"
        wait_for(connection_file.is_file, 120, "the user's kernel's connection file", interval=0.1)
        client = kernel_client(connection_file, timeout=120)
        try:
            client.wait_for_ready(timeout=120)
            printed: list[str] = []
            reply = client.execute_interactive(
                HOLD_ALL,
                timeout=120,
                output_hook=lambda message: printed.append(message["content"].get("text", "")),
            )
        finally:
            client.stop_channels()
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "".join(printed).strip() == "0"  # CUDA_SUCCESS: the whole GPU is the kernel's
        yield environment, server
    finally:
        server.stop()


def test_the_users_own_programs_beside_their_server_share_its_ledger_and_its_simulated_gpu(user):
    """What the rest must not inherit: next to their server, a user's `jupyter vgpu run` counts
    against the server's ledger (on purpose), and a program on the simulated GPU with another
    device list is refused its state file."""
    environment, _ = user
    ran = subprocess.run(
        [JUPYTER, "vgpu", "run", "--simulate", "--memory", "1GiB", "--", "true"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode != 0 and "does not fit" in ran.stderr, ran.stderr
    listed = subprocess.run(
        [JUPYTER, "vgpu", "devices", "--simulate"],
        env={**environment, "VGPU_SIM_DEVICES": "name=another GPU,memory=2GiB,sms=10,context_memory=0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "in use by running processes with another VGPU_SIM_DEVICES" in listed.stderr, listed.stderr


def test_a_tests_program_runs_on_the_sessions_own_machine_beside_a_users_server(user):
    """A test's process, with the same home as the user's server, neither joins its ledger nor
    uses its simulated GPU's state file: the session's environment (tests/conftest.py) is its own."""
    environment, _ = user
    ran = subprocess.run(
        [JUPYTER, "vgpu", "run", "--simulate", "--memory", "1GiB", "--", "true"],
        env={**os.environ, "HOME": environment["HOME"]},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize("command", readme_smokes())
def test_every_benchmark_smoke_runs_beside_a_users_server_that_holds_its_whole_gpu(user, command):
    environment, _ = user
    ran = subprocess.run(
        [sys.executable, *command.split()[1:]],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
