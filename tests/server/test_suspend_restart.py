"""A server killed with SIGKILL while a kernel is suspended (issues 18 and 26): the restarted
server finds the slice suspended (the ledger and the pids persisted) and adopts the kernel, which
holds nothing on the GPU and has its user's state in its host memory: Jupyter lists it again, and
it resumes when asked, or on a cell (its room first, then its memory). One nobody can reach (its
connection file gone) is stopped as any orphan; one that cannot be adopted (its kernelspec gone)
is kept suspended, reached through its connection file, and stopped after ``idle_cull_after``
if nobody resumes it. A real server process, real kernels, on one simulated 16 GiB GPU."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
from pathlib import Path

from support import hold_outside, wait_for
from test_orphans import reaper, running
from test_server_process import (
    KERNEL_NAME,
    Server,
    run_code,
    user_env,
    vgpu_cli,
    vgpu_kernelspec_dir,
)
from test_suspend_cli import PATTERN

from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.manager import IN_LINE_KEY

GIB = 1 << 30
# The fixtures this module takes from elsewhere.
__all__ = ["reaper", "user_env", "vgpu_kernelspec_dir"]


def suspended_kernel(server: Server, env: dict[str, str], cuda_prelude: str) -> tuple[str, int]:
    """A 2 GiB kernel holding 1 GiB with a pattern, suspended; its id and pid."""
    started = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "2GiB"})
    kernel_id = started["kernel"]["id"]
    run_code(env, kernel_id, cuda_prelude + PATTERN)
    suspended = server.api("POST", f"api/vgpu/slices/{kernel_id}/suspend", {})
    assert (suspended["state"], suspended["host_memory_bytes"]) == ("suspended", GIB)
    return kernel_id, suspended["pid"]


# What a kernel that outlived its server prints once a restarted server adopts it
# (notebook/survive.py): its poller looks every second, so the line lands in whichever cell runs
# at that moment, or in none.
ADOPTED_NOTICE = "jupyter-vgpu: a restarted server adopted this kernel"


def printed(output: str) -> str:
    """A cell's output, less the adoption notice."""
    return "\n".join(line for line in output.splitlines() if line != ADOPTED_NOTICE).strip()


def connection_file(env: dict[str, str], kernel_id: str) -> Path:
    return Path(env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"


def all_free(server: Server) -> bool:
    (device,) = server.api("GET", "api/vgpu/devices")
    return device["memory_free_bytes"] == device["memory_capacity_bytes"] == 16 * GIB


def test_a_kernel_suspended_when_its_server_is_killed_is_adopted_and_resumed_after_the_restart_with_its_memory_intact(
    user_env, tmp_path, cuda_prelude, reaper
):
    server = Server(tmp_path, user_env)
    kept, pid = suspended_kernel(server, user_env, cuda_prelude)
    # One resumed by a cell run through its connection file, not by a request to the server.
    by_cell, by_cell_pid = suspended_kernel(server, user_env, cuda_prelude)
    # One whose connection file is gone: nobody can reach it any more.
    unreachable, unreachable_pid = suspended_kernel(server, user_env, cuda_prelude)
    server.kill()
    connection_file(user_env, unreachable).unlink()

    with Server(tmp_path, user_env) as restarted:
        # Found suspended and adopted, their processes kept; the unreachable one stopped and
        # released as any orphan.
        listed = {item["kernel_id"]: item for item in restarted.api("GET", "api/vgpu/slices")}
        assert sorted(listed) == sorted([kept, by_cell])
        assert {(item["state"], item["host_memory_bytes"]) for item in listed.values()} == {("suspended", GIB)}
        assert running(pid) and running(by_cell_pid) and not running(unreachable_pid)
        assert sorted(kernel["id"] for kernel in restarted.api("GET", "api/kernels")) == sorted([kept, by_cell])
        assert all_free(restarted)  # they hold nothing on the GPU: their room is lent

        resumed = vgpu_cli(user_env, "resume", kept[:8])
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == f"resumed {kept[:8]}: its 2GiB slice runs again"
        (listed,) = [item for item in restarted.api("GET", "api/vgpu/slices") if item["kernel_id"] == kept]
        assert (listed["state"], listed["host_memory_bytes"]) == ("running", 0)
        assert [process["pid"] for process in listed["usage"]["processes"]] == [pid]
        (device,) = restarted.api("GET", "api/vgpu/devices")
        assert device["memory_free_bytes"] == 14 * GIB  # its 2 GiB promised again

        # Its user reaches it (here through its connection file): the pattern is intact.
        assert printed(run_code(user_env, kept, "print(intact())")) == "True"
        # The other one's cell waits in the driver until the server resumes it (the hooked
        # cuMemGetInfo of memory() asks for the resume).
        assert printed(run_code(user_env, by_cell, "memory(); print(intact())")) == "True"
        (listed,) = [item for item in restarted.api("GET", "api/vgpu/slices") if item["kernel_id"] == by_cell]
        assert (listed["state"], listed["host_memory_bytes"]) == ("running", 0)

        # They are this server's kernels: shut down as any, their slices released.
        restarted.api("DELETE", f"api/kernels/{kept}")
        restarted.api("DELETE", f"api/kernels/{by_cell}")
        assert restarted.api("GET", "api/vgpu/slices") == []
        assert all_free(restarted)
        wait_for(lambda: reaper([pid, by_cell_pid, unreachable_pid]), 10, "the kernels' processes reaped")


def test_a_suspended_kernel_that_cannot_be_adopted_is_kept_and_stopped_after_idle_cull_after(
    user_env, tmp_path, cuda_prelude, reaper, vgpu_kernelspec_dir
):
    server = Server(tmp_path, user_env)
    kernel_id, pid = suspended_kernel(server, user_env, cuda_prelude)
    server.kill()
    shutil.rmtree(vgpu_kernelspec_dir / "kernels" / KERNEL_NAME)  # its kernelspec is gone: no adoption

    with Server(tmp_path, user_env, "--VGPUApp.idle_cull_after=2") as restarted:
        assert restarted.api("GET", "api/kernels") == []
        assert restarted.api("GET", f"api/vgpu/slices/{kernel_id}")["notice"] == (
            f"suspended when its server stopped; Jupyter does not list it again: its 1GiB stay in host memory "
            f"until it is resumed (`jupyter vgpu resume {kernel_id}`, or a CUDA call of its own) and reached with "
            f"`jupyter console --existing {connection_file(user_env, kernel_id)}`, where `exit` stops it"
        )
        notices = wait_for(lambda: restarted.api("GET", "api/vgpu/notices"), 30, "the orphan stopped")
        assert notices == {
            kernel_id: "stopped after 2 s suspended, not resumed since its server restarted, to free 1GiB of host "
            "memory"
        }
        assert restarted.api("GET", "api/vgpu/slices") == []
        assert not running(pid)
        wait_for(lambda: reaper([pid]), 10, "the kernel's process reaped")
        assert not os.listdir(tmp_path / "regions")


def test_a_resume_waiting_in_line_keeps_its_place_across_a_server_sigkill(
    user_env, sim_env, tmp_path, cuda_prelude, reaper
):
    server = Server(tmp_path, user_env)
    kernel_id, pid = suspended_kernel(server, user_env, cuda_prelude)
    outside = hold_outside(sim_env, 15 * GIB)  # 1 GiB free: its 2 GiB slice cannot come back yet
    restarted = None
    try:
        # A cell through its connection file: its CUDA call waits in libvgpu.so, asking to resume,
        # and the server puts it in line.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            seen: list[str] = []  # what the cell has printed so far
            cell = pool.submit(run_code, user_env, kernel_id, "memory(); print(intact())", seen)
            queue = wait_for(lambda: waiting_for_room(server, kernel_id), 60, "in line, waiting for room")
            assert queue["position"] == 1 and queue["waiting_for"].startswith(
                "waiting for 1GiB more GPU memory (1GiB free) on GPU 0"
            )
            since = in_line_since(tmp_path, kernel_id)
            server.kill()

            restarted = Server(tmp_path, user_env)
            # The kept kernel's call still waits; the restarted server puts it back in line, in the
            # place it had (the time it first asked, from the ledger).
            queue = wait_for(lambda: restarted.api("GET", f"api/vgpu/slices/{kernel_id}")["queue"], 60, "in line")
            assert queue["position"] == 1 and in_line_since(tmp_path, kernel_id) == since
            assert not cell.done() and running(pid)

            # The kernel's poller (it looks every second) tells the waiting cell of the adoption.
            wait_for(lambda: ADOPTED_NOTICE in "".join(seen), 60, "the kernel to say it was adopted")
            outside.kill()  # room comes: it resumes, and the cell goes on with its memory intact
            output = cell.result(timeout=120)
            # The kernel told the cell why it stayed when its server died, and that the restarted
            # server adopted it (notebook/survive.py).
            assert output.strip().endswith("True") and "it stays 600 s for the next server to adopt it" in output
            assert "a restarted server adopted this kernel" in output
        listed = restarted.api("GET", f"api/vgpu/slices/{kernel_id}")
        assert (listed["state"], listed["queue"]) == ("running", None)
        restarted.api("DELETE", f"api/kernels/{kernel_id}")
        wait_for(lambda: reaper([pid]), 30, "the kernel's process reaped")
    finally:
        outside.kill()
        if restarted is not None:
            restarted.stop()


def waiting_for_room(server: Server, kernel_id: str) -> dict | None:
    """The slice's place in line once its first attempt said what it waits for."""
    queue = server.api("GET", f"api/vgpu/slices/{kernel_id}")["queue"]
    return queue if queue and queue["waiting_for"] else None


def in_line_since(tmp_path: Path, kernel_id: str) -> float:
    """When the slice first asked for its room, as the ledger keeps it."""
    with EmbeddedLedger(tmp_path / "ledger.sqlite", []) as ledger:
        return ledger.get(kernel_id).metadata[IN_LINE_KEY]["since"]
