"""The kernel's side of a real server: %vgpu in sliced kernels, the kernel's own credential and
what it may do, and the out-of-memory line in a cell's output."""

from __future__ import annotations

import json
import re
import time
from queue import Empty

import pytest
import tornado.httpclient

from jupyter_vgpu.client import CREDENTIAL_HEADER, CREDENTIAL_VARIABLE

GIB = 1 << 30


async def start_sliced(jp_fetch, kernelspec, **fields) -> str:
    response = await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": kernelspec, **fields}))
    return json.loads(response.body)["kernel"]["id"]


async def slice_of(jp_fetch, kernel_id) -> dict:
    return json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)


@pytest.fixture
def stream_until(jp_serverapp):
    """stream_until(kernel_id, code, *patterns) -> the cell's stream output once it matches every
    pattern (stdout and stderr arrive in no fixed order).

    Output a C library writes to fd 2 reaches the notebook through ipykernel's pipe reader, which
    may forward it after the cell has finished: read on until it arrives or a deadline passes."""
    clients = []

    async def run(kernel_id: str, code: str, *patterns: str, deadline_s: float = 30.0) -> str:
        client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
        client.start_channels()
        clients.append(client)
        await client.wait_for_ready(timeout=60)
        msg_id = client.execute(code)
        output, deadline = "", time.monotonic() + deadline_s
        while not all(re.search(pattern, output) for pattern in patterns):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no output matching {patterns} within {deadline_s} s; got {output!r}"
            try:
                message = await client.get_iopub_msg(timeout=remaining)
            except Empty:
                continue
            if message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "stream":
                output += message["content"]["text"]
        return output

    yield run
    for client in clients:
        client.stop_channels()


async def test_vgpu_in_a_sliced_kernel_prints_its_slice(jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", cores=30, policy="burst", device=1)
    assert (await run_in_kernel(kernel_id, cuda_prelude + "print(allocate(512 << 20))")).strip() == "0"
    shown = (await run_in_kernel(kernel_id, "%vgpu")).splitlines()
    assert shown == [
        f"GPU slice of kernel {kernel_id[:8]} ({kernel_id}), running",
        "  device  1 · Sim Large",
        "  memory  512MiB used of 2GiB cap",
        shown[3],  # the measured utilisation of an idle kernel is whatever NVML last sampled
        "  policy  burst",
    ]
    assert re.fullmatch(r"  SM      \d+\.\d% measured of 30% share", shown[3])


async def test_vgpu_resize_reaches_the_kernels_next_cuda_call(jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", cores=50)
    assert (await run_in_kernel(kernel_id, cuda_prelude + "print(memory()[1])")).strip() == str(GIB)
    granted = await run_in_kernel(kernel_id, "%vgpu resize --memory 3GiB --cores 20 --policy burst")
    assert granted.strip() == "resize granted: memory cap 3GiB, SM share 20%, policy burst"
    assert (await run_in_kernel(kernel_id, "print(memory()[1])")).strip() == str(3 * GIB)
    assert (await slice_of(jp_fetch, kernel_id))["limits"] == {"memory_bytes": 3 * GIB, "cores": 20, "policy": "burst"}


async def test_vgpu_resize_the_ledger_refuses_prints_the_servers_reason(jp_fetch, vgpu_kernelspec, run_in_kernel):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", device=0)
    refused = (await run_in_kernel(kernel_id, "%vgpu resize --memory 12GiB")).strip()
    assert refused == "resize refused: Its 12GiB GPU slice can never fit: GPU 0 has 8GiB in all. Ask for 8GiB or less."
    assert (await slice_of(jp_fetch, kernel_id))["limits"]["memory_bytes"] == GIB


async def test_kernel_credential_reads_slices_and_resizes_only_its_own(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel
):
    own = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    other = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    credential = (await run_in_kernel(own, f"import os; print(os.environ[{CREDENTIAL_VARIABLE!r}])")).strip()
    http = tornado.httpclient.AsyncHTTPClient()

    async def status_of(path: str, method: str = "GET", body: dict | None = None, credential: str = credential) -> int:
        response = await http.fetch(
            jp_serverapp.connection_url + path,
            method=method,
            body=None if body is None else json.dumps(body),
            headers={CREDENTIAL_HEADER: credential},
            raise_error=False,
        )
        return response.code

    assert await status_of("api/vgpu/devices") == 200
    assert await status_of("api/vgpu/slices") == 200
    assert await status_of(f"api/vgpu/slices/{other}") == 200
    assert await status_of(f"api/vgpu/slices/{own}", "PATCH", {"cores": 40}) == 200
    assert await status_of(f"api/vgpu/slices/{other}", "PATCH", {"cores": 40}) == 403
    assert await status_of("api/vgpu/kernels", "POST", {"name": vgpu_kernelspec}) == 403
    assert await status_of("api/vgpu/metrics") == 403
    assert await status_of("api/kernels") == 403  # the server's own API is the user's, not the kernel's
    assert await status_of("api/vgpu/slices", credential="not-a-kernel-credential") == 403
    assert (await slice_of(jp_fetch, own))["limits"]["cores"] == 40
    assert (await slice_of(jp_fetch, other))["limits"]["cores"] == 50
    stored = jp_serverapp.web_app.settings["vgpu_slice_manager"].get(own).metadata
    assert "credential_sha256" in stored and credential not in json.dumps(stored)  # the ledger keeps a hash


async def test_a_restarted_kernel_gets_a_new_credential_that_works(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel
):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    manager = jp_serverapp.web_app.settings["vgpu_slice_manager"]
    before = manager.get(kernel_id).metadata["credential_sha256"]
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
    assert manager.get(kernel_id).metadata["credential_sha256"] != before  # the old process's credential is void
    assert "memory  0B used of 1GiB cap" in await run_in_kernel(kernel_id, "%vgpu")


async def test_out_of_memory_line_reaches_the_cell_output_with_a_resize_that_can_be_pasted(
    jp_fetch, vgpu_kernelspec, run_in_kernel, stream_until, cuda_prelude, monkeypatch
):
    # ipykernel forwards what C code writes to fd 2, except in a kernel that sees this variable
    # (it assumes pytest captures its output): start this one as a notebook server would.
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    await run_in_kernel(kernel_id, cuda_prelude)
    output = await stream_until(
        kernel_id, "print('result', allocate(3 * 2**30 // 2))", r"result \d+", r"`jupyter vgpu resize [^`]*`"
    )
    assert "result 2" in output  # CUDA_ERROR_OUT_OF_MEMORY
    assert "out of GPU memory in this slice" in output and "1.0 GiB cap" in output
    pasted = re.search(r"`(%vgpu resize [^`]*)`", output).group(1)
    assert pasted == "%vgpu resize --memory 2GiB"
    assert f"`jupyter vgpu resize {kernel_id[:8]} --memory 2GiB`" in output
    assert (await run_in_kernel(kernel_id, pasted)).startswith("resize granted: memory cap 2GiB")
    assert (await run_in_kernel(kernel_id, "print(allocate(3 * 2**30 // 2))")).strip() == "0"


async def test_vgpu_panel_in_a_kernel_refreshes_while_kernels_come_and_go(jp_fetch, vgpu_kernelspec, run_in_kernel):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    await run_in_kernel(kernel_id, "%vgpu panel")
    # The cell below polls from the kernel's main thread while the panel's own thread fetches.
    rows_once = (
        "import time\n"
        "panel = get_ipython().magics_manager.registry['VGPUMagics'].panel\n"
        "deadline = time.monotonic() + 20\n"
        "while len(panel.rows) != {count} and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(sorted(row.name.value for row in panel.rows.values()))\n"
    )
    assert (
        await run_in_kernel(kernel_id, rows_once.format(count=1))
    ).strip() == f"['kernel {kernel_id[:8]} (this kernel)']"
    other = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    shown = (await run_in_kernel(kernel_id, rows_once.format(count=2))).strip()
    assert shown == str(sorted([f"kernel {kernel_id[:8]} (this kernel)", f"kernel {other[:8]}"]))
    await jp_fetch("api", "kernels", other, method="DELETE")
    assert (
        await run_in_kernel(kernel_id, rows_once.format(count=1))
    ).strip() == f"['kernel {kernel_id[:8]} (this kernel)']"


async def test_vgpu_panel_offers_resize_controls_only_on_this_kernels_row(jp_fetch, vgpu_kernelspec, run_in_kernel):
    """The kernel's credential resizes its own slice only: the other kernel's row shows its
    numbers and no controls, and this kernel's controls really resize it through the server."""
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    other = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    await run_in_kernel(kernel_id, "%vgpu panel")
    shown = await run_in_kernel(
        kernel_id,
        "import time\n"
        "panel = get_ipython().magics_manager.registry['VGPUMagics'].panel\n"
        "deadline = time.monotonic() + 20\n"
        "while len(panel.rows) != 2 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "for kernel, row in sorted(panel.rows.items()):\n"
        "    print(kernel, hasattr(row, 'apply_button'), len(row.widget.children))\n"
        f"own = panel.rows[{kernel_id!r}]\n"
        "own.memory_input.value = '2GiB'\n"
        "own.apply_button.click()\n"
        "print(own.message.value)\n",
    )
    assert shown.splitlines() == [
        *sorted([f"{kernel_id} True 4", f"{other} False 2"]),
        "resized: memory cap 2GiB, SM share 50%, policy hard",
    ]
    assert (await slice_of(jp_fetch, kernel_id))["limits"]["memory_bytes"] == 2 * GIB
