"""Resizes in the line (issue 25) and shrinks below what a kernel holds (issue 27 defect #2),
through a real server with real kernels on the simulated 16 GiB GPU (device 1): a growth that does
not fit waits in the device's line (202, its place in ``queue``) and happens by itself when room
comes; a later resize replaces it, a shrink or a shutdown takes it out; ``%vgpu resize`` returns
at once saying where it stands; a cap below what the kernel holds, running or suspended, is
refused with what it holds."""

from __future__ import annotations

import asyncio
import json

from test_idle_policy import eventually
from test_suspend import LARGE, patch, running_a_long_cell, slice_of, start_sliced
from tornado.httpclient import HTTPClientError

GIB = 1 << 30


async def patched(jp_fetch, kernel_id: str, **changes) -> tuple[int, dict]:
    """(status, body) of PATCH /api/vgpu/slices/{kernel_id}, an error's too."""
    try:
        response = await jp_fetch("api", "vgpu", "slices", kernel_id, method="PATCH", body=json.dumps(changes))
    except HTTPClientError as error:
        return error.code, json.loads(error.response.body)
    return response.code, json.loads(response.body)


def line_of(jp_serverapp):
    return jp_serverapp.web_app.settings["vgpu_slice_manager"].line


async def a_busy_kernel_holding_12_gib(jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude):
    """12 of the 16 GiB held by a kernel running a cell: never suspended while it runs."""
    busy = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(busy, cuda_prelude + "print(allocate(8 << 30))")).strip() == "0"
    return busy, await running_a_long_cell(jp_serverapp, busy)


async def test_a_growth_that_does_not_fit_waits_in_line_and_happens_by_itself_when_room_comes(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    busy, busy_cell = await a_busy_kernel_holding_12_gib(
        jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
    )
    grower = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    assert (await run_in_kernel(grower, cuda_prelude + "print(allocate(1 << 30)); kept = 'state'")).strip() == "0"

    code, waiting = await patched(jp_fetch, grower, memory="8GiB")
    assert code == 202
    assert (waiting["state"], waiting["limits"]["memory_bytes"]) == ("running", 2 * GIB)
    assert waiting["queue"] == {"position": 1, "eta_seconds": None, "waiting_for": "4GiB more GPU memory (2GiB free)"}
    assert (await slice_of(jp_fetch, grower))["queue"] == waiting["queue"]

    # %vgpu resize from the kernel replaces the waiting resize, returns at once and says where it stands.
    said = (await run_in_kernel(grower, "%vgpu resize --memory 6GiB")).strip()
    assert said.startswith(
        "resize waits in line: 1st in line for GPU 1 · waiting for 2GiB more GPU memory (2GiB free). It happens by "
        "itself when room comes; until then the slice keeps 2GiB and 50 percent of the SMs."
    ), said
    shown = (await run_in_kernel(grower, "%vgpu")).splitlines()
    assert "  queue   1st in line for GPU 1 · waiting for 2GiB more GPU memory (2GiB free)" in shown, shown
    (request,) = line_of(jp_serverapp).requests()
    assert (request.kernel_id, request.kind, request.memory) == (grower, "resize", 4 * GIB)
    assert (await run_in_kernel(grower, "print(memory()[1])")).strip() == str(2 * GIB)

    # The busy kernel's cell ends: it is suspended (nothing lost) and the resize goes ahead by itself.
    await jp_fetch("api", "kernels", busy, "interrupt", method="POST", body="")
    assert (await asyncio.wait_for(busy_cell.reply, 30))["content"]["ename"] == "KeyboardInterrupt"

    async def grown():
        model = await slice_of(jp_fetch, grower)
        return model if model["limits"]["memory_bytes"] == 6 * GIB else None

    resized = await eventually(grown, 60, "the resize done by itself")
    assert (resized["state"], resized["queue"]) == ("running", None)
    assert (await slice_of(jp_fetch, busy))["state"] == "suspended"
    assert (await run_in_kernel(grower, "print(memory()[1], allocate(4 << 30), kept)")).strip() == f"{6 * GIB} 0 state"
    assert not line_of(jp_serverapp).requests()


async def test_a_shrink_or_a_shutdown_takes_a_waiting_resize_out_of_the_line(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    # 20 percent of the SMs each: the busy kernel's 50 fit beside them, nobody is suspended for it.
    shrinks, ends = [
        await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", cores=20, device=LARGE) for _ in range(2)
    ]
    for kernel in (shrinks, ends):
        assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(512 << 20))")).strip() == "0"
    busy, busy_cell = await a_busy_kernel_holding_12_gib(
        jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
    )
    for kernel in (shrinks, ends):
        assert (await patched(jp_fetch, kernel, memory="6GiB"))[0] == 202
    assert [(request.kernel_id, request.kind) for request in line_of(jp_serverapp).requests()] == [
        (shrinks, "resize"),
        (ends, "resize"),
    ]

    code, shrunk = await patched(jp_fetch, shrinks, memory="768MiB")
    assert (code, shrunk["limits"]["memory_bytes"], shrunk["queue"]) == (200, 768 << 20, None)
    assert (await slice_of(jp_fetch, ends))["queue"]["position"] == 1  # moved up

    await jp_fetch("api", "kernels", ends, method="DELETE")
    assert not line_of(jp_serverapp).requests()
    await jp_fetch("api", "kernels", busy, method="DELETE")
    busy_cell.cancel()


async def test_a_growth_that_can_never_fit_on_its_device_is_refused_at_once(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    code, refused = await patched(jp_fetch, kernel, memory="20GiB")
    assert code == 409
    assert refused["message"] == "Its 20GiB GPU slice can never fit: GPU 1 has 16GiB in all. Ask for 16GiB or less."
    assert not line_of(jp_serverapp).requests()


async def test_a_shrink_below_what_the_kernel_holds_is_refused_running_or_suspended(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="4GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(3 << 30)); kept = 7")).strip() == "0"
    held = (await slice_of(jp_fetch, kernel))["usage"]["memory_bytes"]
    assert held >= 3 * GIB

    code, refused = await patched(jp_fetch, kernel, memory="2GiB")
    assert code == 409
    message = refused["message"]
    assert message.startswith(f"kernel {kernel!r} cannot shrink to 2GiB: its processes hold "), message
    assert "on the GPU, which a smaller cap would not free; ask for " in message
    assert (await slice_of(jp_fetch, kernel))["limits"]["memory_bytes"] == 4 * GIB
    # Down to what it holds (and a little room) is a cap like any other.
    room = -(-held // (1 << 20)) + 64
    assert (await patch(jp_fetch, kernel, memory=f"{room}MiB"))["limits"]["memory_bytes"] == room << 20

    await jp_fetch("api", "vgpu", "slices", kernel, "suspend", method="POST", body="")
    suspended = await slice_of(jp_fetch, kernel)
    assert suspended["state"] == "suspended"
    code, refused = await patched(jp_fetch, kernel, memory="1GiB")
    assert code == 409
    assert refused["message"].startswith(f"kernel {kernel!r} cannot shrink to 1GiB: suspended, it holds "), refused
    assert "in host memory, all of which its resume puts back on the GPU" in refused["message"]

    # It resumes as it was: the refusal kept the cap its memory fits under.
    assert (await run_in_kernel(kernel, "print(kept, allocate(1 << 20))")).strip() == "7 0"
    assert (await slice_of(jp_fetch, kernel))["state"] == "running"
