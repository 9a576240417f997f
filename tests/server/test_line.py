"""The fair line through a real server, with real kernels on the simulated 16 GiB GPU (device 1
of the server tests' machine), default settings: a start that does not fit waits in line and goes
ahead by itself when room comes; a kernel that has not used the GPU lends its room and takes it
back at its first CUDA call, waiting in line (saying so in the cell's own output) where it must;
Kernel > Interrupt takes a waiting cell out of the line and loses nothing.

The server runs in the test's event loop: waiting is polling with ``await`` on a condition."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from support import written_with_a_pattern
from test_idle_policy import eventually
from test_suspend import LARGE, Cell, running_a_long_cell, slice_of, start_sliced
from tornado.httpclient import HTTPClientError

GIB = 1 << 30


@pytest.fixture
def jp_server_config(jp_server_config):
    return {**jp_server_config, "VGPUApp": {**jp_server_config["VGPUApp"], "watch_interval": 0.2}}


def forward_low_level_output() -> None:
    """ipykernel forwards what a kernel's libraries write to fd 2 (libvgpu.so's waiting lines)
    into the cell's output, except under pytest (it looks for PYTEST_CURRENT_TEST, which kernels
    started by a test inherit, and which pytest sets again for each phase of a test): kernels
    started after this call start without it, as a user's do."""
    os.environ.pop("PYTEST_CURRENT_TEST", None)


async def holding_8gib_in_a_long_cell(jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude):
    """(kernel id, its running Cell) of a 12 GiB kernel on the large GPU that holds 8 GiB and runs
    a long cell: never suspended while it does, so its room stays taken."""
    busy = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(busy, cuda_prelude + "print(allocate(8 << 30))")).strip() == "0"
    return busy, await running_a_long_cell(jp_serverapp, busy)


async def test_a_start_waits_behind_a_busy_kernel_and_goes_ahead_by_itself_when_it_idles(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    busy, cell = await holding_8gib_in_a_long_cell(jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude)

    # 12 of 16 GiB are held by a kernel running a cell, which is never suspended: the start waits.
    waiting = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    queued = await slice_of(jp_fetch, waiting)
    assert queued["state"] == "queued"
    assert queued["queue"] == {"position": 1, "eta_seconds": None, "waiting_for": "4GiB more GPU memory (4GiB free)"}
    assert jp_serverapp.kernel_manager.get_kernel(waiting).execution_state == "starting"

    # Its cell ends: idle now, the busy kernel is suspended (nothing lost) and the start goes ahead.
    await jp_fetch("api", "kernels", busy, "interrupt", method="POST", body="")
    assert (await asyncio.wait_for(cell.reply, 30))["content"]["ename"] == "KeyboardInterrupt"
    await eventually(lambda: _slice_state_is(jp_fetch, waiting, "unused"), 60, "the waiting kernel started")
    await jp_serverapp.kernel_manager.get_kernel(waiting).ready
    started, made_room = await slice_of(jp_fetch, waiting), await slice_of(jp_fetch, busy)
    assert (started["state"], started["queue"]) == ("unused", None)
    assert (made_room["state"], made_room["host_memory_bytes"]) == ("suspended", 8 * GIB)
    assert made_room["notice"].startswith("suspended to make room for a new kernel: 8GiB moved to host memory")


async def test_a_kernel_that_never_used_the_gpu_lends_its_room_and_its_first_cuda_call_takes_it_back(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    forward_low_level_output()
    untouched = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    await run_in_kernel(untouched, "x = 42")  # runs a cell, no CUDA: it holds nothing on the GPU

    # A 12 GiB start does not fit beside it: its room is lent (nothing to move) to the start.
    other = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    lent = await slice_of(jp_fetch, untouched)
    assert (lent["state"], lent["host_memory_bytes"]) == ("lent", 0)
    assert lent["notice"] == (
        "lent to make room for a new kernel: it had not used the GPU, so nothing moved; its first CUDA call "
        "takes its room back"
    )
    assert (await slice_of(jp_fetch, other))["state"] == "unused"

    # The other kernel runs a cell holding 12 GiB: the lent kernel's first CUDA call waits in line,
    # and its cell says so; the call goes on by itself once the room is back.
    assert (await run_in_kernel(other, cuda_prelude + "print(allocate(12 << 30))")).strip() == "0"
    other_cell = await running_a_long_cell(jp_serverapp, other)
    first_call = Cell(jp_serverapp, untouched, cuda_prelude + "print('allocated', allocate(1 << 30), x)")
    said = await eventually(first_call.said("waiting for room on GPU 1 (1st in line"), 60, "the cell saying it waits")
    assert "Kernel > Interrupt stops waiting, nothing is lost" in said
    waiting = await slice_of(jp_fetch, untouched)
    assert waiting["state"] == "lent" and waiting["queue"]["position"] == 1

    await jp_fetch("api", "kernels", other, method="DELETE")
    other_cell.cancel()
    reply = await asyncio.wait_for(first_call.reply, 60)
    assert reply["content"]["status"] == "ok"
    assert "allocated 0 42" in "".join(first_call.output)
    back = await slice_of(jp_fetch, untouched)
    assert (back["state"], back["queue"]) == ("running", None)


async def test_interrupting_a_cell_that_waits_for_room_leaves_the_line_and_loses_nothing(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    forward_low_level_output()
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(4 << 30)); kept = 'state'")).strip() == "0"
    await jp_fetch("api", "vgpu", "slices", kernel, "suspend", method="POST", body="")
    holder = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(holder, cuda_prelude + "print(allocate(12 << 30))")).strip() == "0"
    holder_cell = await running_a_long_cell(jp_serverapp, holder)

    waiting = Cell(jp_serverapp, kernel, "print(allocate(1 << 20))")
    await eventually(waiting.said("waiting for room on GPU 1"), 60, "the cell saying it waits")
    await eventually(lambda: _queued(jp_fetch, kernel), 30, "the kernel's resume in line")

    # Kernel > Interrupt: the waiting call fails at once, the cell stops, the kernel stays suspended.
    await jp_fetch("api", "kernels", kernel, "interrupt", method="POST", body="")
    reply = await asyncio.wait_for(waiting.reply, 30)
    assert reply["content"]["status"] == "error"
    output = "".join(waiting.output)
    assert "interrupted: left the line for GPU 1; the kernel stays suspended, nothing is lost" in output
    after = await slice_of(jp_fetch, kernel)
    assert (after["state"], after["queue"], after["host_memory_bytes"]) == ("suspended", None, 4 * GIB)
    assert not jp_serverapp.web_app.settings["vgpu_slice_manager"].line.requests()

    # Room comes back: resumed, its state and its memory are intact.
    await jp_fetch("api", "kernels", holder, method="DELETE")
    holder_cell.cancel()
    await jp_fetch("api", "vgpu", "slices", kernel, "resume", method="POST", body="")
    assert (await run_in_kernel(kernel, "print(kept, allocate(1 << 20))")).strip() == "state 0"


async def test_a_cell_that_reads_a_result_back_while_suspended_waits_is_interrupted_and_reads_it_intact_after(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    """Issue 34 item 1: the most natural cell after a pause reads a result back (cuMemcpyDtoH, no
    hook of libvgpu.so's). It waits in libvgpu.so's gate as an allocation does, not silently in the
    driver's checkpoint lock: the cell says so, the kernel joins the line, Kernel > Interrupt ends
    the cell, and once resumed the same read gives the bytes written before the suspend."""
    forward_low_level_output()
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    written = (
        cuda_prelude
        + "pointer = ctypes.c_uint64()\n"
        + "assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(4 << 30)) == 0\n"
        + written_with_a_pattern("pointer", 1 << 20)
        + "print(intact())"
    )
    assert (await run_in_kernel(kernel, written)).strip() == "True"
    await jp_fetch("api", "vgpu", "slices", kernel, "suspend", method="POST", body="")
    holder = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(holder, cuda_prelude + "print(allocate(12 << 30))")).strip() == "0"
    holder_cell = await running_a_long_cell(jp_serverapp, holder)

    reading = Cell(jp_serverapp, kernel, "print(intact())")  # its first CUDA call: the read-back
    await eventually(reading.said("waiting for room on GPU 1"), 60, "the read-back saying it waits")
    await eventually(lambda: _queued(jp_fetch, kernel), 30, "the kernel's resume in line")

    await jp_fetch("api", "kernels", kernel, "interrupt", method="POST", body="")
    reply = await asyncio.wait_for(reading.reply, 30)
    assert reply["content"]["status"] == "error"
    assert "interrupted: left the line for GPU 1; the kernel stays suspended, nothing is lost" in "".join(
        reading.output
    )
    after = await slice_of(jp_fetch, kernel)
    assert (after["state"], after["host_memory_bytes"]) == ("suspended", 4 * GIB)

    await jp_fetch("api", "kernels", holder, method="DELETE")
    holder_cell.cancel()
    await jp_fetch("api", "vgpu", "slices", kernel, "resume", method="POST", body="")
    assert (await run_in_kernel(kernel, "print(intact())")).strip() == "True"


async def _slice_state_is(jp_fetch, kernel_id: str, state: str) -> bool:
    return (await slice_of(jp_fetch, kernel_id))["state"] == state


async def _queued(jp_fetch, kernel_id: str):
    queue = (await slice_of(jp_fetch, kernel_id))["queue"]
    return queue if queue and queue["position"] == 1 else None


async def test_the_line_in_the_rest_api_lists_waiting_starts_in_order(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel
):
    holder = await start_sliced(jp_fetch, vgpu_kernelspec, memory="16GiB", device=LARGE)
    # The holder is starting or idle and has not used the GPU: make it busy so it is not lent.
    holder_cell = await running_a_long_cell(jp_serverapp, holder)
    first = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    second = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    listed = json.loads((await jp_fetch("api", "vgpu", "slices")).body)
    places = {item["kernel_id"]: item["queue"]["position"] for item in listed if item["state"] == "queued"}
    assert places == {first: 1, second: 2}
    await jp_fetch("api", "kernels", first, method="DELETE")  # it leaves the line; the second moves up
    assert (await slice_of(jp_fetch, second))["queue"]["position"] == 1
    await jp_fetch("api", "kernels", holder, method="DELETE")
    holder_cell.cancel()


async def test_a_wake_resumes_a_suspended_kernel_ahead_of_its_next_cell(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="4GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(2 << 30)); kept = 7")).strip() == "0"
    await jp_fetch("api", "vgpu", "slices", kernel, "suspend", method="POST", body="")

    # The user opens the notebook: the lab's sign (any client's) resumes it with no cell run.
    woken = await jp_fetch("api", "vgpu", "slices", kernel, "wake", method="POST", body="")
    assert woken.code == 202
    await eventually(lambda: _slice_state_is(jp_fetch, kernel, "running"), 60, "the kernel resumed")
    assert jp_serverapp.kernel_manager.get_kernel(kernel).execution_state != "busy"  # no cell ran for it
    # Its next cell finds it resumed: it runs at once, its memory and variables intact.
    assert (await run_in_kernel(kernel, "print(kept, memory()[0] < memory()[1])")).strip() == "7 True"

    # A running kernel: nothing to do. An unknown one: 404.
    assert (await jp_fetch("api", "vgpu", "slices", kernel, "wake", method="POST", body="")).code == 200
    with pytest.raises(HTTPClientError) as unknown:
        await jp_fetch("api", "vgpu", "slices", "no-such-kernel", "wake", method="POST", body="")
    assert unknown.value.code == 404
