"""`jupyter vgpu status` against a real server (tests/support.py's VGPUServer, the shipped
defaults) on a full simulated GPU: kernel starts waiting in the line are listed with where each
stands and what it waits for, and once room comes they run and the lines go."""

from __future__ import annotations

from support import VGPUServer, hold_outside, wait_for

GIB = 1 << 30


def status_rows(output: str) -> list[str]:
    """The table's lines after its heading, each without its trailing spaces."""
    return [line.rstrip() for line in output.splitlines()[1:]]


def test_status_shows_where_each_waiting_start_stands_and_what_it_waits_for(vgpu, sim_env, tmp_path):
    server = VGPUServer(tmp_path / "server", sim_env)
    outside = hold_outside(sim_env, 16 * GIB)  # a program outside any slice holds the whole GPU
    try:
        # JupyterLab's path: a session per notebook; with no room, each start waits in the line.
        kernels = [
            server.api(
                "POST",
                "api/sessions",
                {"path": name, "type": "notebook", "kernel": {"name": server.kernel_name}},
            )["kernel"]["id"]
            for name in ("first.ipynb", "second.ipynb")
        ]
        assert [server.slice_of(kernel_id)["state"] for kernel_id in kernels] == ["queued", "queued"]

        waiting = vgpu("status", env=server.env)

        assert waiting.returncode == 0, waiting.stderr
        first, second = (kernel_id[:8] for kernel_id in kernels)
        assert status_rows(waiting.stdout) == [
            f"{first:<10}{'first.ipynb':<28}{'any':>4}{'0 / 1GiB':>22}{'0 / 20':>15}{'burst':>8}  queued",
            f"{'':<10}1st in line for any GPU · waiting for 1GiB more GPU memory (0B free)",
            f"{second:<10}{'second.ipynb':<28}{'any':>4}{'0 / 1GiB':>22}{'0 / 20':>15}{'burst':>8}  queued",
            f"{'':<10}2nd in line for any GPU · waiting for 1GiB more GPU memory (0B free)",
            "GPU 0: 16GiB in use outside any slice, 0 over its slice's cap; 0 free for slices",
        ], waiting.stdout

        # Room comes: both kernels start by themselves, and status no longer puts them in line.
        outside.stdin.close()
        outside.wait(30)
        wait_for(
            lambda: all(server.slice_of(kernel_id)["state"] != "queued" for kernel_id in kernels),
            120,
            "the waiting kernels to start",
            interval=0.2,
        )
        started = vgpu("status", env=server.env)

        assert started.returncode == 0, started.stderr
        *rows, explained = status_rows(started.stdout)
        assert explained.startswith("unused: the slice is held, but no process of the kernel uses the GPU"), explained
        assert [row[:10].strip() for row in rows] == [first, second], started.stdout
        assert all(f"{'0':>4}{'0 / 1GiB':>22}" in row and row.endswith("unused") for row in rows), started.stdout
        assert "in line" not in started.stdout
    finally:
        if outside.poll() is None:
            outside.stdin.close()
            outside.wait(30)
        server.stop()
