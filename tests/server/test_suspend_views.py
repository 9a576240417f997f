"""What a notebook's own views say of a suspended kernel (issue 18 item 6), in real kernels of a
real server on the simulated 16 GiB GPU: ``%vgpu`` and the ``%vgpu panel`` rows say its memory
is in host memory (none on the GPU: the server's ``usage.memory_bytes`` still counts what its
processes allocated) and show the notice that says what it waits for."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from support import dashboard_misreads
from test_suspend import LARGE, post, running_a_long_cell, slice_of, start_sliced, suspended_beside_a_kernel_in_its_room

from jupyter_vgpu.client import gpu_memory_used, in_host_memory

# Kernel code: wait (polling the server with the kernel's own credential, within a deadline) until
# the server says this suspended kernel waits for room, then show %vgpu and the panel's own row.
SHOW_WHILE_WAITING = """
import time
from jupyter_vgpu.client import ServerClient
from jupyter_vgpu.notebook.panel import SlicePanel
client = ServerClient.for_kernel()
deadline = time.monotonic() + 30
while not (client.slice().get("notice") or "").startswith("waiting"):
    assert time.monotonic() < deadline, client.slice()
    time.sleep(0.05)
get_ipython().run_line_magic("vgpu", "")
panel = SlicePanel(client)
panel.refresh()
row = panel.rows[client.kernel_id]
print("PANEL", row.memory_bar.value, row.memory_label.value)
print("NOTES", row.warnings.value)
panel.close()
"""


async def test_vgpu_and_its_panel_say_a_waiting_suspended_kernels_memory_is_in_host_memory(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    a, b = await suspended_beside_a_kernel_in_its_room(jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude)
    # B runs a cell (never suspended to make room): A's next cell cannot resume it.
    b_cell = await running_a_long_cell(jp_serverapp, b)

    # A's cell runs Python only (no CUDA call, which would wait for the resume): it shows its slice.
    shown = (await asyncio.wait_for(run_in_kernel(a, SHOW_WHILE_WAITING), 60)).splitlines()

    waiting = "waiting for 8GiB on GPU 1, held by running kernels (12GiB in all); this kernel resumes when it is free"
    assert shown[:6] == [
        f"GPU slice of kernel {a[:8]} ({a}), suspended",
        "  device  1 · Sim Large",
        "  memory  12GiB in host memory (suspended), none on the GPU; 12GiB cap",
        "  SM      0.0% measured of 50% share",
        "  policy  hard",
        # Its place in line and what it waits for (the notice says the same: not said twice).
        f"  queue   1st in line for GPU 1 · {waiting}",
    ], shown
    # The panel's bar holds nothing on the GPU; its label says where the memory is; the line shows.
    assert shown[6] == "PANEL 0.0 12GiB in host memory (suspended)"
    assert (
        shown[7]
        == f'NOTES <span style="color: var(--jp-info-color1, #0288d1)">1st in line for GPU 1 · {waiting}</span>'
    )

    model = await slice_of(jp_fetch, a)
    assert model["usage"]["memory_bytes"] == 12 << 30  # what the views must not draw on the GPU
    assert (gpu_memory_used(model), in_host_memory(model)) == (0, "12GiB in host memory (suspended)")

    await jp_fetch("api", "kernels", b, method="DELETE")
    b_cell.cancel()
    assert (await asyncio.wait_for(run_in_kernel(a, "print(intact())"), 60)).strip() == "True"
    resumed = await slice_of(jp_fetch, a)
    assert (gpu_memory_used(resumed), in_host_memory(resumed)) == (12 << 30, None)


async def test_the_server_grafana_dashboard_reads_only_metrics_and_labels_the_server_exports(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    """docs/grafana/jupyter-vgpu-server.json against GET /api/vgpu/metrics with a kernel suspended,
    resumed and suspended again (so every suspend series is there), and its panels for suspended
    kernels, their host memory and the suspend and resume seconds."""
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana" / "jupyter-vgpu-server.json").read_text())
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(1 << 30))")).strip() == "0"
    for action in ("suspend", "resume", "suspend"):
        await post(jp_fetch, kernel, action)
    metrics = (await jp_fetch("api", "vgpu", "metrics")).body.decode()

    assert not dashboard_misreads(dashboard, metrics)
    asked = {
        metric
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for metric in re.findall(r"\b(vgpu_\w+)", target["expr"])
    }
    assert {
        "vgpu_device_suspended_slices",
        "vgpu_device_suspended_host_memory_bytes",
        "vgpu_slice_last_suspend_seconds",
        "vgpu_slice_last_resume_seconds",
    } <= asked
