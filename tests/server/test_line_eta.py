"""The estimate of a place in line (issue 25) through a real server, with real kernels on the
simulated 16 GiB GPU (device 1 of the server tests' machine): a start waiting for room that an
idle timer frees is told about how long; one waiting for a kernel running a cell is told nothing,
since nobody knows when a cell ends.

The server runs in the test's event loop: waiting is polling with ``await`` on a condition."""

from __future__ import annotations

import time

import pytest
from test_idle_policy import eventually
from test_line import holding_8gib_in_a_long_cell
from test_suspend import LARGE, gpu_work_in_a_child, refusal, slice_of, start_sliced

from jupyter_vgpu.client import describe_queue
from jupyter_vgpu.ledger import SUSPEND_TIMINGS_KEY, CapacityError
from jupyter_vgpu.line import Request
from jupyter_vgpu.provisioning.base import MANAGER_SETTING
from jupyter_vgpu.server.suspend import SUSPEND_SETTING

GIB = 1 << 30

CULL_AFTER = 120.0


@pytest.fixture
def jp_server_config(jp_server_config):
    # Suspends give up at once on a process with GPU work queued; idle kernels are stopped after
    # CULL_AFTER, long enough that no kernel of a test is stopped while it runs.
    settings = {"watch_interval": 0.2, "suspend_lock_timeout": 0.3, "idle_cull_after": CULL_AFTER}
    return {**jp_server_config, "VGPUApp": {**jp_server_config["VGPUApp"], **settings}}


def stop_in(jp_serverapp, kernel_id: str) -> float:
    """Seconds until the idle timer stops the kernel, as the server counts them."""
    last_activity = jp_serverapp.kernel_manager.get_kernel(kernel_id).last_activity.timestamp()
    return last_activity + CULL_AFTER - time.time()


async def test_a_start_waiting_for_a_kernel_the_idle_timer_stops_is_told_the_timers_remaining_seconds(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, compile_c
):
    holder = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    # Idle (no cell runs), but a process of it has GPU work queued: it cannot be suspended to
    # make room, so only its idle timer frees its 12 GiB.
    assert (await run_in_kernel(holder, gpu_work_in_a_child(compile_c, 600_000))).split()[:2] == ["ready", "queued"]
    code, message = await refusal(jp_fetch, holder, "suspend")
    assert code == 409 and "did not finish its GPU work" in message

    waiting = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    before = stop_in(jp_serverapp, holder)
    model = await slice_of(jp_fetch, waiting)
    queue = model["queue"]
    after = stop_in(jp_serverapp, holder)
    assert (queue["position"], queue["waiting_for"]) == (1, "4GiB more GPU memory (4GiB free)")
    # Whole seconds: the timer's remaining seconds when the server answered, rounded.
    assert queue["eta_seconds"] is not None
    assert round(after) <= queue["eta_seconds"] <= round(before)
    # Every view words it the same way (the lab's describe.ts has its own cases).
    assert describe_queue(model).endswith(" · about 2 min · waiting for 4GiB more GPU memory (4GiB free)")

    # A second start behind it waits for the same timer, then for the first: its estimate adds up.
    behind = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    second = (await slice_of(jp_fetch, behind))["queue"]
    assert second["position"] == 2
    assert second["eta_seconds"] is not None and second["eta_seconds"] >= queue["eta_seconds"]

    await run_in_kernel(holder, "probe.kill(); probe.wait()")
    for kernel in (behind, waiting, holder):
        await jp_fetch("api", "kernels", kernel, method="DELETE")


async def test_a_start_waiting_for_a_kernel_running_a_cell_has_no_estimate(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    busy, cell = await holding_8gib_in_a_long_cell(jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude)

    waiting = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    queue = await eventually(lambda: _queue_of(jp_fetch, waiting), 30, "the start in line")
    # A cell's end is unknown, and a busy kernel's idle timer does not run.
    assert queue == {"position": 1, "eta_seconds": None, "waiting_for": "4GiB more GPU memory (4GiB free)"}

    cell.cancel()
    for kernel in (waiting, busy):
        await jp_fetch("api", "kernels", kernel, method="DELETE")


async def _queue_of(jp_fetch, kernel_id: str):
    return (await slice_of(jp_fetch, kernel_id))["queue"]


async def test_room_made_by_suspending_an_idle_kernel_is_estimated_by_this_servers_measured_suspends(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    settings = jp_serverapp.web_app.settings
    suspended, slices = settings[SUSPEND_SETTING], settings[MANAGER_SETTING]
    # Nothing measured yet: no estimate, rather than a guessed rate.
    assert suspended.suspend_seconds_per_byte is None
    busy, cell = await holding_8gib_in_a_long_cell(jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude)
    waiting = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    # Its cell ends: the room maker suspends it for the start, and times the suspend.
    await jp_fetch("api", "kernels", busy, "interrupt", method="POST", body="")
    await eventually(lambda: _state_is(jp_fetch, busy, "suspended"), 60, "the busy kernel suspended")
    timings = slices.get(busy).metadata[SUSPEND_TIMINGS_KEY]
    assert suspended.suspend_seconds_per_byte == timings["suspend"] / (8 * GIB)

    # The started kernel holds 2 GiB, idle: were a request to want its room, the room maker
    # would suspend it, in the time this server's last suspend took per byte.
    await eventually(lambda: _state_is(jp_fetch, waiting, "unused"), 60, "the waiting kernel started")
    await jp_serverapp.kernel_manager.get_kernel(waiting).ready
    assert (await run_in_kernel(waiting, cuda_prelude + "print(allocate(2 << 30))")).strip() == "0"
    kernel = jp_serverapp.kernel_manager.get_kernel(waiting)
    await eventually(lambda: _idle(kernel), 30, "the kernel idle after its cell")
    device = slices.get(waiting).device_uuid
    short = CapacityError("no room", resource="memory", requested=10 * GIB, available=8 * GIB)
    request = Request("someone", "start", 10 * GIB, 10, device, _never, short=short)
    assert suspended.estimate(request) == suspended.suspend_seconds_per_byte * 2 * GIB
    cell.cancel()


async def _idle(kernel) -> bool:
    return kernel.execution_state == "idle"


async def _never() -> bool:
    return False


async def _state_is(jp_fetch, kernel_id: str, state: str) -> bool:
    return (await slice_of(jp_fetch, kernel_id))["state"] == state
