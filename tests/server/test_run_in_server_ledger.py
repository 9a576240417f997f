"""`jupyter vgpu run` beside a running server joins the server's ledger like a batch kernel:
admitted (or refused with what is free), listed by REST and `jupyter vgpu status` with its
command line and pid, released when the command exits or the run is killed. A real server
process, the real CLI, real processes on one simulated 16 GiB GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import test_server_process
from support import CUDA_PRELUDE, JUPYTER, wait_for
from test_server_process import KERNEL_NAME, Server, vgpu_cli

GIB = 1 << 30
# The user's environment and kernelspec of the server-process tests.
user_env = test_server_process.user_env
vgpu_kernelspec_dir = test_server_process.vgpu_kernelspec_dir

# Holds 1 GiB of its slice (when asked), prints its pid, waits for stdin to close.
HOLD = CUDA_PRELUDE + (
    "import os, sys\nif sys.argv[1:] == ['allocate']: assert allocate(1 << 30) == 0\n"
    "print(os.getpid(), flush=True)\nsys.stdin.read()\n"
)


def start_run(env, ledger, memory: str, *command: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            JUPYTER,
            "vgpu",
            "run",
            "--simulate",
            f"--ledger={ledger}",
            "--memory",
            memory,
            "--cores",
            "50",
            "--",
            *command,
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def command_pid(run: subprocess.Popen) -> int:
    """The pid the command prints once it holds what it was asked to, or the run's failure."""
    line = run.stdout.readline()
    assert line, f"the run ended ({run.wait(60)}): {run.stderr.read()}"
    return int(line)


def runs(server: Server) -> list[dict]:
    return [item for item in server.api("GET", "api/vgpu/slices") if item["kernelspec"] == "jupyter vgpu run"]


def test_a_run_beside_a_server_is_admitted_listed_and_released(user_env, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    server = Server(tmp_path, user_env)
    try:
        held = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "12GiB"})["kernel"]["id"]

        refused = start_run(user_env, ledger, "8GiB", sys.executable, "-c", "pass")
        _, stderr = refused.communicate(timeout=120)
        assert refused.returncode == 1 and "4GiB is free" in stderr, stderr

        run = start_run(user_env, ledger, "4GiB", sys.executable, "-c", HOLD, "allocate")
        pid = command_pid(run)
        (listed,) = runs(server)
        assert listed["pid"] == pid and HOLD.splitlines()[1] in listed["command"]
        assert listed["limits"]["memory_bytes"] == 4 * GIB and listed["usage"]["memory_bytes"] == GIB
        status = vgpu_cli(user_env, "status")
        (row,) = [line for line in status.stdout.splitlines() if line.startswith(listed["kernel_id"][:8])]
        assert "allocate" in row and "1GiB / 4GiB" in row
        # The GPU is full, but the server's 12 GiB kernel never used the GPU: a start of the server
        # takes its room (lent); the run's slice, not the server's kernel, is never touched.
        started = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "1GiB"})["slice"]
        assert started["state"] == "unused"
        assert server.api("GET", f"api/vgpu/slices/{held}")["state"] == "lent"
        assert runs(server)[0]["state"] == "running"

        run.stdin.close()  # the command exits, and so does the run, releasing its slice
        assert run.wait(60) == 0
        assert runs(server) == []
    finally:
        server.stop()


def test_a_killed_run_is_released_once_its_command_ends(user_env, tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    server = Server(tmp_path, user_env)
    try:
        run = start_run(user_env, ledger, "4GiB", sys.executable, "-c", HOLD)
        pid = command_pid(run)
        run.kill()  # the run, not its command: the slice stays while the command holds it
        run.wait()
        (listed,) = runs(server)
        assert listed["pid"] == pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: runs(server) == [], 30, "the server to release the slice of the killed run")
    finally:
        server.stop()


def test_a_run_without_sizes_beside_a_default_notebook_takes_a_notebooks_default_size(user_env, tmp_path):
    # A whole GPU at a 100 % hard share (a run's size when it is alone) never fits beside a kernel.
    server = Server(tmp_path, user_env)
    try:
        server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME})  # the server's default size
        run = subprocess.Popen(
            [JUPYTER, "vgpu", "run", "--simulate", f"--ledger={tmp_path / 'ledger.sqlite'}", "--"]
            + [sys.executable, "-c", HOLD],
            env=user_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        command_pid(run)
        (listed,) = runs(server)
        assert listed["limits"]["memory_bytes"] == 4 * GIB
        assert (listed["limits"]["cores"], listed["limits"]["policy"]) == (20, "burst")
        run.stdin.close()
        assert run.wait(60) == 0
        assert "what --memory, --cores and --policy left out is a notebook's default size" in run.stderr.read()
    finally:
        server.stop()
