"""A restarted server learns what its adopted kernels are doing (issue 34 item 2): killed with
SIGKILL while one kernel runs a long cell, the next server adopts it and reads it `busy`, never
`starting` (Jupyter's word for a kernel it knows nothing about yet, which room making took for
idle), and so never suspends it to make room for a new kernel; an idle adopted kernel reads
`idle`. Once the long cell ends, the server sees it and the kernel is idle like any other. A
real server process, real kernels, one simulated 16 GiB GPU."""

from __future__ import annotations

import os
import signal

from jupyter_client import BlockingKernelClient
from support import wait_for
from test_orphans import reaper, running
from test_server_process import KERNEL_NAME, Server, run_code, user_env, vgpu_kernelspec_dir
from test_suspend_restart import connection_file

GIB = 1 << 30
# The fixtures this module takes from elsewhere.
__all__ = ["reaper", "user_env", "vgpu_kernelspec_dir"]


def start_kernel(server: Server, memory: str) -> str:
    return server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": memory})["kernel"]["id"]


def start_long_cell(env: dict[str, str], kernel_id: str, code: str) -> None:
    """Sends ``code`` as a cell through the kernel's connection file and returns once the kernel
    says it runs it (its execute_input); the cell goes on after the client is gone."""
    client = BlockingKernelClient(connection_file=str(connection_file(env, kernel_id)))
    client.load_connection_file()
    client.start_channels()
    try:
        sent = client.execute(code)
        while not (
            (message := client.get_iopub_msg(timeout=60))["msg_type"] == "execute_input"
            and message["parent_header"]["msg_id"] == sent
        ):
            pass
    finally:
        client.stop_channels()


def execution_states(server: Server) -> dict[str, str]:
    """Kernel id -> execution_state, as GET /api/kernels (what JupyterLab lists) says it."""
    return {kernel["id"]: kernel["execution_state"] for kernel in server.api("GET", "api/kernels")}


def slice_states(server: Server) -> dict[str, tuple[str, str | None]]:
    """Kernel id -> (the slice's state, its kernel's execution_state), as GET /api/vgpu/slices says them."""
    return {
        item["kernel_id"]: (item["state"], item["execution_state"]) for item in server.api("GET", "api/vgpu/slices")
    }


def test_a_restarted_server_reads_an_adopted_kernel_running_a_cell_busy_and_never_suspends_it_to_make_room(
    user_env, tmp_path, cuda_prelude, reaper
):
    server = Server(tmp_path, user_env)
    restarted = None
    pids: list[int] = []
    try:
        # An 8 GiB kernel holding 1 GiB on the GPU, running a cell that waits for a file when
        # the server dies; a 4 GiB one holding 1 GiB, idle. 4 GiB of the 16 stay free.
        busy = start_kernel(server, "8GiB")
        run_code(user_env, busy, cuda_prelude + "assert allocate(1 << 30) == 0")
        idle = start_kernel(server, "4GiB")
        run_code(user_env, idle, cuda_prelude + "assert allocate(1 << 30) == 0")
        pids = [server.api("GET", f"api/vgpu/slices/{kernel_id}")["pid"] for kernel_id in (busy, idle)]
        flag = tmp_path / "go"
        start_long_cell(
            user_env, busy, f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\ndone = True"
        )
        server.kill()

        restarted = Server(tmp_path, user_env)
        # From its first answer on, the kernel running a cell reads busy, never starting; the
        # idle one reads idle once it has said so (it answers at once, the busy one only after
        # its cell).
        assert execution_states(restarted)[busy] == "busy"
        wait_for(lambda: execution_states(restarted)[idle] == "idle", 30, "the idle adopted kernel to read idle")
        assert execution_states(restarted) == {busy: "busy", idle: "idle"}
        assert slice_states(restarted) == {busy: ("running", "busy"), idle: ("running", "idle")}

        # A 12 GiB kernel needs 8 GiB more than is free: only suspending the kernel running a
        # cell could make that room, so nothing is suspended and the start waits in line.
        queued = start_kernel(restarted, "12GiB")
        wait_for(
            lambda: (restarted.api("GET", f"api/vgpu/slices/{queued}")["queue"] or {}).get("waiting_for"),
            60,
            "the start to say what it waits for",
        )
        states = slice_states(restarted)
        assert (states[busy], states[idle], states[queued][0]) == (("running", "busy"), ("running", "idle"), "queued")

        # The cell ends: the server sees the kernel idle, and both idle kernels now make the
        # room (suspended), so the waiting kernel starts; the cell had carried on to its end.
        flag.touch()
        wait_for(lambda: slice_states(restarted).get(queued, ("",))[0] == "unused", 120, "the waiting kernel to start")
        states = slice_states(restarted)
        assert (states[busy], states[idle]) == (("suspended", "idle"), ("suspended", "idle"))
        assert run_code(user_env, busy, "print(done)").strip().splitlines()[-1] == "True"

        for kernel_id in (busy, idle, queued):
            restarted.api("DELETE", f"api/kernels/{kernel_id}")
        wait_for(lambda: reaper(pids), 30, "the adopted kernels' processes reaped")
    finally:
        for pid in pids:  # kernels outlive their server: none of this test's may outlive it
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()
        if restarted is not None:
            restarted.stop()


def test_an_adopted_kernel_that_dies_before_its_cell_ended_reads_idle_once_restarted(
    user_env, tmp_path, cuda_prelude, reaper
):
    """An adopted kernel running a cell dies (here SIGKILL; the OOM killer, a crash) and the
    server's restarter starts it again: the question asked of the dead process is lost with it,
    and the new one is asked again (it would otherwise read busy, as unknown, until its first
    cell: never suspended or stopped when idle)."""
    server = Server(tmp_path, user_env)
    restarted = None
    pids: list[int] = []
    try:
        kernel_id = start_kernel(server, "2GiB")
        pids = [server.api("GET", f"api/vgpu/slices/{kernel_id}")["pid"]]
        start_long_cell(user_env, kernel_id, "import threading; threading.Event().wait()")
        server.kill()

        restarted = Server(tmp_path, user_env)
        assert execution_states(restarted) == {kernel_id: "busy"}
        os.kill(pids[0], signal.SIGKILL)
        wait_for(lambda: reaper(pids), 30, "the adopted kernel's process ended and reaped")
        new_pid = wait_for(
            lambda: (
                restarted.api("GET", f"api/vgpu/slices/{kernel_id}")["pid"] not in (None, pids[0])
                and restarted.api("GET", f"api/vgpu/slices/{kernel_id}")["pid"]
            ),
            60,
            "the restarter to start the kernel again",
        )
        pids.append(new_pid)
        wait_for(lambda: execution_states(restarted) == {kernel_id: "idle"}, 60, "the restarted kernel to read idle")
        assert slice_states(restarted) == {kernel_id: ("unused", "idle")}

        restarted.api("DELETE", f"api/kernels/{kernel_id}")
        wait_for(lambda: reaper(pids), 30, "the kernels' processes reaped")
    finally:
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()
        if restarted is not None:
            restarted.stop()
