"""Kernels outlive their server (issue 26): a real server process with sliced kernels in
different states, killed with SIGKILL and started again. The kernels live on (running ones too,
holding their variables and GPU memory), the restarted server adopts them before it answers its
first request: ``GET /api/kernels`` and ``/api/sessions`` list them as before (same session ids
and paths), a client through the server's websocket runs cells in them, ``%vgpu`` in them talks
to the new server, and a suspended one resumes on its next cell. A kernel nobody adopts within
``VGPUApp.kernel_survival`` ends, and the next server frees its slice. Real kernels on one
simulated 16 GiB GPU."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from urllib.parse import urlsplit

from jupyter_client import BlockingKernelClient
from support import wait_for
from test_orphans import reaper, running
from test_server_process import KERNEL_NAME, TOKEN, Server, run_code, user_env, vgpu_kernelspec_dir
from test_suspend_cli import PATTERN
from test_suspend_restart import connection_file
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

GIB = 1 << 30
# The fixtures this module takes from elsewhere.
__all__ = ["reaper", "user_env", "vgpu_kernelspec_dir"]


def open_notebook(server: Server, path: str) -> tuple[str, str]:
    """What JupyterLab does when it opens a notebook: a session with a kernel of the vGPU
    kernelspec; (session id, kernel id)."""
    session = server.api(
        "POST", "api/sessions", {"path": path, "name": path, "type": "notebook", "kernel": {"name": KERNEL_NAME}}
    )
    kernel_id = session["kernel"]["id"]
    # The session answers while its (pending) kernel starts; the kernel is reached once it has.
    wait_for(
        lambda: (
            server.api("GET", f"api/kernels/{kernel_id}")["execution_state"] != "starting" or started(server, kernel_id)
        ),
        60,
        "the kernel started",
    )
    return session["id"], kernel_id


def started(server: Server, kernel_id: str) -> bool:
    return any(item["kernel_id"] == kernel_id and item["pid"] for item in server.api("GET", "api/vgpu/slices"))


def sessions(server: Server) -> dict[str, tuple[str, str]]:
    """Session id -> (notebook path, kernel id), as GET /api/sessions lists them."""
    return {item["id"]: (item["path"], item["kernel"]["id"]) for item in server.api("GET", "api/sessions")}


def kernel_pid(server: Server, kernel_id: str) -> int:
    return server.api("GET", f"api/vgpu/slices/{kernel_id}")["pid"]


def running_a_cell_until(env: dict[str, str], kernel_id: str, flag, then: str = "") -> None:
    """Sends the kernel a cell that waits for the file ``flag``, then runs ``then``; returns once
    the kernel says it runs that cell."""
    cell = BlockingKernelClient(connection_file=str(connection_file(env, kernel_id)))
    cell.load_connection_file()
    cell.start_channels()
    try:
        sent = cell.execute(f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\n{then}")
        while not (
            (message := cell.get_iopub_msg(timeout=60))["msg_type"] == "execute_input"
            and message["parent_header"]["msg_id"] == sent
        ):
            pass  # until the kernel says it runs that cell
    finally:
        cell.stop_channels()


def execute_over_websocket(server: Server, kernel_id: str, code: str, timeout: float = 60) -> str:
    """Runs ``code`` in the kernel as JupyterLab does: through the server's websocket
    (``/api/kernels/{id}/channels``, jupyter_server's JSON messages); its stream output."""

    async def execute() -> str:
        parts = urlsplit(server.url)
        url = f"ws://{parts.netloc}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        connection = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {TOKEN}"}))
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "test",
            "session": uuid.uuid4().hex,
            "date": "",
            "version": "5.3",
        }
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
        await connection.write_message(json.dumps(message))
        output, reply, idle = [], None, False
        while reply is None or not idle:
            raw = await connection.read_message()
            assert raw is not None, "the websocket closed"
            received = json.loads(raw)
            if received.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = received["header"]["msg_type"]
            if kind == "stream":
                output.append(received["content"]["text"])
            elif kind == "error":
                output.append("\n".join(received["content"]["traceback"]))
            elif kind == "execute_reply":
                reply = received["content"]
            elif kind == "status" and received["content"]["execution_state"] == "idle":
                idle = True
        connection.close()
        assert reply["status"] == "ok", "".join(output)
        return "".join(output)

    return asyncio.run(asyncio.wait_for(execute(), timeout))


def test_kernels_outlive_their_servers_sigkill_and_the_restarted_server_adopts_them(
    user_env, tmp_path, cuda_prelude, reaper
):
    server = Server(tmp_path, user_env)
    restarted = None
    try:
        # A running kernel with a variable and 1 GiB on the GPU, one suspended with its pattern
        # in host memory, one running a cell (it never used the GPU).
        running_session, running_kernel = open_notebook(server, "running.ipynb")
        run_code(user_env, running_kernel, cuda_prelude + PATTERN + "x = 41")
        suspended_session, suspended_kernel = open_notebook(server, "suspended.ipynb")
        run_code(user_env, suspended_kernel, cuda_prelude + PATTERN)
        suspended = server.api("POST", f"api/vgpu/slices/{suspended_kernel}/suspend", {})
        assert (suspended["state"], suspended["host_memory_bytes"]) == ("suspended", GIB)
        busy_session, busy_kernel = open_notebook(server, "busy.ipynb")
        run_code(user_env, busy_kernel, "y = 'still here'")
        # Its next cell still runs when the server dies: it waits for a file, then sets z.
        flag = tmp_path / "go"
        running_a_cell_until(user_env, busy_kernel, flag, then="z = 1")
        # A notebook on a kernel that is not sliced (ipykernel's own kernelspec).
        plain = server.api(
            "POST",
            "api/sessions",
            {"path": "plain.ipynb", "name": "plain.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
        )
        wait_for(lambda: connection_file(user_env, plain["kernel"]["id"]).exists(), 60, "the plain kernel started")
        plain_pid = int(run_code(user_env, plain["kernel"]["id"], "import os; print(os.getpid())"))
        before = sessions(server)
        del before[plain["id"]]
        pids = {
            kernel_id: kernel_pid(server, kernel_id) for kernel_id in (running_kernel, suspended_kernel, busy_kernel)
        }

        server.kill()
        assert all(running(pid) for pid in pids.values())
        # The kernel that is not sliced ends with its server, as jupyter_server's kernels do.
        wait_for(lambda: not running(plain_pid), 30, "the plain kernel to end with its server")

        restarted = Server(tmp_path, user_env)
        # Adopted before the server answered its first request: listed at once, as before.
        listed = {kernel["id"]: kernel for kernel in restarted.api("GET", "api/kernels")}
        assert sorted(listed) == sorted(pids)
        assert sessions(restarted) == before
        assert before[running_session] == ("running.ipynb", running_kernel)
        slices = {item["kernel_id"]: item for item in restarted.api("GET", "api/vgpu/slices")}
        assert (slices[running_kernel]["state"], slices[running_kernel]["usage"]["memory_bytes"]) == ("running", GIB)
        assert slices[suspended_kernel]["state"] == "suspended"
        assert all(slices[kernel_id]["pid"] == pid for kernel_id, pid in pids.items())

        # The notebooks reach them through the new server's websocket: variables and GPU memory intact.
        assert execute_over_websocket(restarted, running_kernel, "print(x + 1, intact())").split() == ["42", "True"]
        # The cell that ran when the server died goes on (its output has nobody to go to); once
        # it ends, the next cell sees what it set.
        flag.touch()
        assert execute_over_websocket(restarted, busy_kernel, "print(y, z)").strip() == "still here 1"
        # %vgpu talks to the server that adopted the kernel (it listens on another port).
        described = execute_over_websocket(restarted, running_kernel, "%vgpu")
        assert f"({running_kernel}), running" in described and "1GiB used of 1GiB cap" in described, described
        # The suspended one resumes on its next cell, as it would have under its first server.
        # The kernel may say in this cell that a restarted server adopted it (notebook/survive.py,
        # on a loaded machine only once the cell runs): its own line, before the cell's.
        said = execute_over_websocket(restarted, suspended_kernel, "print(intact())").strip().splitlines()
        assert said[-1] == "True" and all(line.startswith("jupyter-vgpu: ") for line in said[:-1]), said
        assert restarted.api("GET", f"api/vgpu/slices/{suspended_kernel}")["state"] == "running"

        # They are this server's kernels now: closing a notebook's session stops its kernel and
        # frees its slice, as for any kernel.
        for session_id in (running_session, suspended_session, busy_session):
            restarted.api("DELETE", f"api/sessions/{session_id}")
        assert restarted.api("GET", "api/kernels") == [] and restarted.api("GET", "api/vgpu/slices") == []
        wait_for(lambda: reaper([*pids.values(), plain_pid]), 30, "the kernels' processes reaped")
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()


def test_a_kernel_nobody_adopts_within_kernel_survival_ends_and_the_next_server_frees_its_slice(
    user_env, tmp_path, cuda_prelude, reaper
):
    server = Server(tmp_path, user_env, "--VGPUApp.kernel_survival=2")
    _, kernel_id = open_notebook(server, "left.ipynb")
    run_code(user_env, kernel_id, cuda_prelude + "assert allocate(1 << 30) == 0")
    pid = kernel_pid(server, kernel_id)

    killed = time.monotonic()
    server.kill()
    wait_for(lambda: not running(pid), 30, "the kernel to end")
    # It outlived its server by its survival time (counted from when it noticed, within 1 s).
    assert time.monotonic() - killed >= 2
    wait_for(lambda: reaper([pid]), 10, "the kernel's process reaped")

    restarted = Server(tmp_path, user_env)
    try:
        assert restarted.api("GET", "api/kernels") == [] and restarted.api("GET", "api/sessions") == []
        assert restarted.api("GET", "api/vgpu/slices") == []
        (device,) = restarted.api("GET", "api/vgpu/devices")
        assert device["memory_free_bytes"] == device["memory_capacity_bytes"] == 16 * GIB
        assert not list((tmp_path / "regions").iterdir())
    finally:
        restarted.stop()


def test_an_adopted_kernel_is_interrupted_and_restarted_as_any(user_env, tmp_path, cuda_prelude, reaper):
    server = Server(tmp_path, user_env)
    session_id, kernel_id = open_notebook(server, "work.ipynb")
    run_code(user_env, kernel_id, cuda_prelude + "assert allocate(1 << 30) == 0")
    pid = kernel_pid(server, kernel_id)
    server.kill()

    restarted = Server(tmp_path, user_env)
    try:
        # Kernel > Interrupt (POST .../interrupt) reaches the adopted kernel's process.
        client = BlockingKernelClient(connection_file=str(connection_file(user_env, kernel_id)))
        client.load_connection_file()
        client.start_channels()
        try:
            sent = client.execute("import threading; threading.Event().wait()")
            while not (
                (message := client.get_iopub_msg(timeout=60))["msg_type"] == "execute_input"
                and message["parent_header"]["msg_id"] == sent
            ):
                pass
            restarted.api("POST", f"api/kernels/{kernel_id}/interrupt")
            reply = client.get_shell_msg(timeout=60)
            assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "KeyboardInterrupt")
        finally:
            client.stop_channels()

        # Kernel > Restart (POST .../restart): a new kernel process in the same slice, the old one gone.
        restarted.api("POST", f"api/kernels/{kernel_id}/restart")
        wait_for(lambda: reaper([pid]), 30, "the adopted kernel's process ended and reaped")
        new_pid = wait_for(
            lambda: kernel_pid(restarted, kernel_id) not in (None, pid) and kernel_pid(restarted, kernel_id),
            60,
            "the new kernel process",
        )
        assert running(new_pid)
        assert execute_over_websocket(restarted, kernel_id, "print('new')").strip() == "new"
        (listed,) = restarted.api("GET", "api/vgpu/slices")
        assert (listed["kernel_id"], listed["usage"]["memory_bytes"]) == (kernel_id, 0)
        assert sessions(restarted) == {session_id: ("work.ipynb", kernel_id)}

        restarted.api("DELETE", f"api/sessions/{session_id}")
        assert restarted.api("GET", "api/vgpu/slices") == []
        assert not connection_file(user_env, kernel_id).exists()
    finally:
        restarted.stop()


def test_a_second_server_on_the_same_ledger_neither_adopts_nor_stops_the_first_ones_kernels(user_env, tmp_path):
    first = Server(tmp_path, user_env)
    second = None
    try:
        _, kernel_id = open_notebook(first, "first.ipynb")
        run_code(user_env, kernel_id, "v = 'first'")
        pid = kernel_pid(first, kernel_id)

        second = Server(tmp_path, user_env)  # same ledger, same runtime folder, both running
        assert second.api("GET", "api/kernels") == []
        assert running(pid) and [kernel["id"] for kernel in first.api("GET", "api/kernels")] == [kernel_id]
        assert execute_over_websocket(first, kernel_id, "print(v)").strip() == "first"
        (listed,) = second.api("GET", "api/vgpu/slices")  # the second sees the slice, as any of the ledger's
        assert listed["kernel_id"] == kernel_id and listed["pid"] == pid
    finally:
        if second is not None:
            second.stop()
        first.stop()


def test_starts_waiting_in_line_outlive_their_server_sigkill_in_their_places(user_env, tmp_path, cuda_prelude, reaper):
    """Two notebooks' starts wait in line behind a kernel that runs a cell; the server is killed
    (SIGKILL). The restarted server starts them again before its first answer: the same kernel
    ids, their sessions kept, first and second in line as before, ahead of a start made after the
    restart; once the cell ends, they start by themselves and run cells through the websocket."""
    server = Server(tmp_path, user_env)
    restarted = None
    try:
        holder = server.api(
            "POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "12GiB", "path": "holder.ipynb"}
        )
        holder_kernel = holder["kernel"]["id"]
        wait_for(lambda: started(server, holder_kernel), 60, "the 12 GiB kernel started")
        run_code(user_env, holder_kernel, cuda_prelude + "assert allocate(8 << 30) == 0")
        # Its next cell runs while the server dies: it waits for a file (never suspended mid-cell).
        flag = tmp_path / "go"
        running_a_cell_until(user_env, holder_kernel, flag)
        # 4 GiB are free: two 8 GiB starts wait, in the order they asked.
        first = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "8GiB", "path": "first.ipynb"})
        second = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "8GiB", "path": "second.ipynb"})
        waiting = [first["kernel"]["id"], second["kernel"]["id"]]
        assert [(item["slice"]["state"], item["slice"]["queue"]["position"]) for item in (first, second)] == [
            ("queued", 1),
            ("queued", 2),
        ]
        before = sessions(server)

        server.kill()
        restarted = Server(tmp_path, user_env)
        # Before its first answer: every kernel back with its session, the starts in their places.
        assert sorted(kernel["id"] for kernel in restarted.api("GET", "api/kernels")) == sorted(
            [holder_kernel, *waiting]
        )
        assert sessions(restarted) == before
        later = restarted.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "8GiB"})
        places = {
            item["kernel_id"]: item["queue"]["position"]
            for item in restarted.api("GET", "api/vgpu/slices")
            if item["state"] == "queued"
        }
        assert places == {waiting[0]: 1, waiting[1]: 2, later["kernel"]["id"]: 3}
        assert "waited in line when the last server ended; it waits again in its place" in restarted.log.read_text()

        # The cell ends: the kernel that held the room idles, is suspended, and the first start
        # goes ahead by itself; its notebook's kernel runs cells as any.
        flag.touch()
        wait_for(lambda: started(restarted, waiting[0]), 120, "the first waiting start to start by itself")
        assert execute_over_websocket(restarted, waiting[0], "print(6 * 7)").strip() == "42"
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()
