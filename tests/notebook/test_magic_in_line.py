"""%vgpu in a real kernel of a real server (tests/support.py's VGPUServer, the shipped defaults)
whose cell waits in the line for its room: it says where it stands, in the same words as
`jupyter vgpu status` and JupyterLab."""

from __future__ import annotations

from support import VGPUServer, hold_outside, printed_by_cell, wait_for

GIB = 1 << 30

# Waits (on the condition, through the kernel's own credential) until the server lists this
# kernel's request for room with what it waits for, then shows the slice.
WAIT_IN_LINE_THEN_SHOW = """
import time
from jupyter_vgpu.client import ServerClient
client = ServerClient.for_kernel()
deadline = time.monotonic() + 60
while not (client.slice()["queue"] or {}).get("waiting_for"):
    assert time.monotonic() < deadline, "this kernel was never put in line"
    time.sleep(0.05)
%vgpu
"""


def run_cell(server: VGPUServer, kernel_id: str, code: str) -> str:
    """Run ``code`` in the kernel over its own channels; its printed output."""
    return printed_by_cell(server.kernel_client(kernel_id), code, timeout=90)


def test_vgpu_in_a_lent_kernel_whose_cell_waits_for_its_room_says_where_it_stands(sim_env, tmp_path):
    server = VGPUServer(tmp_path / "server", sim_env)
    outside = None
    try:
        kernel_id = server.api("POST", "api/kernels", {"name": server.kernel_name})["id"]
        run_cell(server, kernel_id, "print('ready')")
        # It has not used the GPU: suspending it lends its room; then a program outside any slice
        # takes the whole GPU, so the kernel's next cell must wait in line to take its room back.
        assert server.api("POST", f"api/vgpu/slices/{kernel_id}/suspend", {})["state"] == "lent"
        outside = hold_outside(sim_env, 16 * GIB)

        shown = run_cell(server, kernel_id, WAIT_IN_LINE_THEN_SHOW).splitlines()

        assert shown[0] == f"GPU slice of kernel {kernel_id[:8]} ({kernel_id}), lent"
        assert shown[2] == "  memory  none on the GPU: its room is lent to others until its first GPU call; 1GiB cap"
        assert shown[5] == (
            "  queue   1st in line for GPU 0 · waiting for 1GiB on GPU 0, held by running kernels (1GiB in all); "
            "this kernel resumes when it is free"
        ), shown
        # The same words as every view: the server's queue, through the one wording function.
        listed = server.slice_of(kernel_id)
        assert (listed["queue"]["position"], listed["queue"]["eta_seconds"]) == (1, None)

        # Room comes: the kernel takes its room back by itself, and %vgpu puts it in line no more.
        outside.stdin.close()
        outside.wait(30)
        wait_for(lambda: server.slice_of(kernel_id)["queue"] is None, 60, "the kernel to get its room", interval=0.2)
        after = run_cell(server, kernel_id, "%vgpu")
        assert "queue" not in after and after.splitlines()[0].endswith(", unused"), after
    finally:
        if outside is not None and outside.poll() is None:
            outside.stdin.close()
            outside.wait(30)
        server.stop()
