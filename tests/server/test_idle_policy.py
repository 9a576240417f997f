"""Idle kernels of a real server (jupyter_vgpu/server/idle.py) with real kernels on the simulated
GPU: an idle kernel's SM share is lowered to the floor and given back when it runs again (or kept
at the floor, saying why, when its share no longer fits), a kernel idle for longer is stopped and
GET /api/vgpu/notices says why, and a server without idle settings touches no kernel.

The server runs in the test's event loop, so waiting is polling with ``await`` (the async form
of support.wait_for), which lets the server's periodic checks run meanwhile."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import timedelta

import pytest
from traitlets import TraitError

from jupyter_vgpu.holders.region import Region
from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.provisioning.base import MANAGER_SETTING
from jupyter_vgpu.server.app import VGPUApp
from jupyter_vgpu.server.idle import IDLE_KEY, IDLE_SETTING, IdleKernels, format_duration

GIB = 1 << 30
LOWERED = "lowered to 5% of the SMs after 1 s idle; restored when it runs again"


@pytest.fixture
def idle_settings() -> dict:
    """The VGPUApp idle settings of the test's server (a test parametrizes it to change them)."""
    return {"idle_lower_after": 1.0}


@pytest.fixture
def jp_server_config(jp_server_config, idle_settings):
    return {
        **jp_server_config,
        "VGPUApp": {**jp_server_config["VGPUApp"], **idle_settings, "watch_interval": 0.2},
    }


async def eventually(condition, timeout: float, message: str, interval: float = 0.05):
    """Awaits ``condition()`` until it returns a truthy value, which it returns, or fails the test
    with the last value seen after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = await condition()
    while not value:
        if time.monotonic() > deadline:
            pytest.fail(f"{message} not met within {timeout} s (last: {value!r})")
        await asyncio.sleep(interval)
        value = await condition()
    return value


async def fetch_json(jp_fetch, *path):
    return json.loads((await jp_fetch("api", "vgpu", *path)).body)


async def start_sliced(jp_fetch, kernelspec, **fields) -> str:
    body = json.dumps({"name": kernelspec, **fields})
    response = await jp_fetch("api", "vgpu", "kernels", method="POST", body=body)
    return json.loads(response.body)["kernel"]["id"]


def region_share(tmp_path, kernel_id: str) -> int:
    """The SM share in force in the kernel's region (what its processes obey)."""
    with Region.open(tmp_path / "regions" / f"{kernel_id}.region") as region:
        return region.limits.sm_share


def slice_with(jp_fetch, tmp_path, kernel_id: str, cores: int):
    """A condition: the kernel's slice once its share is ``cores`` in the ledger and its region."""

    async def condition():
        model = await fetch_json(jp_fetch, "slices", kernel_id)
        in_force = region_share(tmp_path, kernel_id)
        return model if model["limits"]["cores"] == cores and in_force == cores else None

    return condition


async def test_an_idle_kernel_is_lowered_to_the_floor_and_restored_when_it_runs_again(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, tmp_path
):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, cores=50, device=1)
    assert (await run_in_kernel(kernel_id, "print('ready')")).strip() == "ready"
    assert (await fetch_json(jp_fetch, "slices", kernel_id))["notice"] is None

    lowered = await eventually(slice_with(jp_fetch, tmp_path, kernel_id, 5), 20, "the idle kernel lowered to 5%")
    assert lowered["notice"] == LOWERED
    (listed,) = await fetch_json(jp_fetch, "slices")
    assert listed["notice"] == LOWERED
    # What it had is kept with the slice in the ledger (a restarted server still knows it).
    manager = jp_serverapp.web_app.settings[MANAGER_SETTING]
    assert manager.get(kernel_id).metadata[IDLE_KEY]["share"] == 50

    assert (await run_in_kernel(kernel_id, "print(6 * 7)")).strip() == "42"
    restored = await eventually(slice_with(jp_fetch, tmp_path, kernel_id, 50), 20, "the share given back")
    assert restored["notice"] is None and restored["limits"]["memory_bytes"] == GIB


async def test_a_restore_that_no_longer_fits_keeps_the_floor_and_says_why(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, tmp_path
):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, cores=60, device=1)
    await run_in_kernel(kernel_id, "print('ready')")
    await eventually(slice_with(jp_fetch, tmp_path, kernel_id, 5), 20, "the idle kernel lowered to 5%")
    # Meanwhile another slice (another user's, on the node's ledger) takes the room it had.
    manager = jp_serverapp.web_app.settings[MANAGER_SETTING]
    manager.admit("someone-else", SliceLimits(GIB, 90, "hard"), device=1)
    try:
        await run_in_kernel(kernel_id, "print('again')")

        async def refused():
            model = await fetch_json(jp_fetch, "slices", kernel_id)
            return model if model["notice"] != LOWERED else None

        model = await eventually(refused, 20, "the restore refused")
        assert model["limits"]["cores"] == 5 and region_share(tmp_path, kernel_id) == 5
        assert model["notice"].startswith("kept at 5% of the SMs: its 60% did not fit when it ran again (")
        # The notebook says why: %vgpu prints the notice.
        shown = await run_in_kernel(kernel_id, "%vgpu")
        assert f"  idle    {model['notice']}" in shown.splitlines(), shown
    finally:
        manager.release("someone-else")
    # Once there is room again, its next execution gets the share back.
    await run_in_kernel(kernel_id, "print('and again')")
    restored = await eventually(slice_with(jp_fetch, tmp_path, kernel_id, 60), 20, "the share given back")
    assert restored["notice"] is None


@pytest.mark.parametrize("idle_settings", [{"idle_lower_after": 1.0, "idle_cull_after": 4.0}])
async def test_a_kernel_idle_past_cull_after_is_stopped_and_notices_say_why(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, tmp_path
):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", cores=50, device=1)
    await run_in_kernel(kernel_id, "print('ready')")
    assert await fetch_json(jp_fetch, "notices") == {}
    await eventually(slice_with(jp_fetch, tmp_path, kernel_id, 5), 20, "the idle kernel lowered first")

    async def stopped():
        kernels = json.loads((await jp_fetch("api", "kernels")).body)
        slices = await fetch_json(jp_fetch, "slices")
        return not kernels and not slices

    await eventually(stopped, 30, "the idle kernel stopped and its slice released")
    assert kernel_id not in jp_serverapp.kernel_manager
    assert await fetch_json(jp_fetch, "notices") == {
        kernel_id: "stopped after 4 s idle to free its 1GiB of GPU memory; start it again from the Kernel menu"
    }
    large = (await fetch_json(jp_fetch, "devices"))[1]
    assert large["memory_allocated_bytes"] == 0 and large["sm_share_allocated"] == 0


@pytest.mark.parametrize("idle_settings", [{"idle_lower_after": 1.0, "idle_cull_after": 2.0}])
async def test_a_kernel_running_a_long_cell_is_not_idle(jp_fetch, vgpu_kernelspec, run_in_kernel, tmp_path):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, cores=50, device=1)
    # Busy for longer than both times (the server's checks run meanwhile: the wait is awaited).
    assert (await run_in_kernel(kernel_id, "import time; time.sleep(3.5); print('done')")).strip() == "done"
    model = await fetch_json(jp_fetch, "slices", kernel_id)
    assert model["limits"]["cores"] == 50 and model["notice"] is None


@pytest.mark.parametrize(
    "idle_settings, lowered",
    [({}, False), ({"idle_lower_after": 3600.0, "idle_cull_after": 0.0}, True)],
    ids=["no idle settings", "lower after 1 h"],
)
async def test_a_server_without_idle_settings_never_touches_a_kernel(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, lowered
):
    kernel_id = await start_sliced(jp_fetch, vgpu_kernelspec, cores=50, device=1)
    await run_in_kernel(kernel_id, "print('ready')")
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    # The server sets last_activity at every message it relays: wait for the kernel's last one
    # (its idle status), else it lands after the backdating below and undoes it (seen under load).
    for _ in range(600):
        if kernel.execution_state == "idle":
            break
        await asyncio.sleep(0.05)
    kernel.last_activity -= timedelta(days=2)  # as if left idle for two days
    idle: IdleKernels = jp_serverapp.web_app.settings[IDLE_SETTING]
    assert idle.enabled is lowered
    await idle.check()
    model = await fetch_json(jp_fetch, "slices", kernel_id)
    assert model["limits"]["cores"] == (5 if lowered else 50)
    assert (model["notice"] is not None) is lowered
    assert kernel_id in jp_serverapp.kernel_manager and await fetch_json(jp_fetch, "notices") == {}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"idle_lower_after": -1.0}, "VGPUApp.idle_lower_after must be a number of seconds, 0 (never) or more"),
        ({"idle_cull_after": float("inf")}, "VGPUApp.idle_cull_after must be a number of seconds"),
        ({"idle_cull_after": float("nan")}, "VGPUApp.idle_cull_after must be a number of seconds"),
        ({"idle_floor_cores": 0}, "VGPUApp.idle_floor_cores: SM share '0' is not a whole percentage from 1 to 100"),
        ({"idle_floor_cores": 101}, "VGPUApp.idle_floor_cores: SM share '101' is not a whole percentage from 1 to 100"),
    ],
)
def test_idle_settings_are_checked(settings, message):
    with pytest.raises(TraitError, match=re.escape(message)):
        VGPUApp(**settings)


def test_idle_settings_from_a_hub_s_environment(monkeypatch):
    monkeypatch.setenv("JUPYTER_VGPU_IDLE_LOWER_AFTER", "1200.0")
    monkeypatch.setenv("JUPYTER_VGPU_IDLE_FLOOR_CORES", "3")
    monkeypatch.setenv("JUPYTER_VGPU_IDLE_CULL_AFTER", "7200")
    app = VGPUApp()
    app._take_environment()
    assert (app.idle_lower_after, app.idle_floor_cores, app.idle_cull_after) == (1200.0, 3, 7200.0)
    monkeypatch.setenv("JUPYTER_VGPU_IDLE_CULL_AFTER", "-5")
    with pytest.raises(SystemExit, match=r"\$JUPYTER_VGPU_IDLE_CULL_AFTER='-5': VGPUApp.idle_cull_after must be"):
        VGPUApp()._take_environment()


def test_notices_of_stopped_kernels_are_kept_a_bounded_time_and_count():
    now = [1000.0]
    idle = IdleKernels(None, None, cull_after=60, clock=lambda: now[0], keep_notices_for=100, max_notices=3)
    for number in range(5):
        idle._remember(f"k{number}", f"notice {number}")
    assert idle.notices() == {"k2": "notice 2", "k3": "notice 3", "k4": "notice 4"}
    now[0] += 50
    idle._remember("k5", "notice 5")
    now[0] += 60  # the first three are 110 s old, k5 50 s
    assert idle.notices() == {"k5": "notice 5"}


@pytest.mark.parametrize(
    "seconds, text", [(1, "1 s"), (45.25, "45.2 s"), (90, "1.5 min"), (1200, "20 min"), (7200, "2 h"), (86400, "1 d")]
)
def test_durations_in_notices(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "idle_settings, said",
    [
        ({"idle_lower_after": 1.0}, "idle kernels: lowered to 5% of the SMs after 1 s, never suspended, never stopped"),
        (
            {"idle_suspend_after": 1800.0, "idle_cull_after": 7200.0},
            "idle kernels: never lowered, suspended to host memory after 30 min, stopped after 2 h",
        ),
    ],
)
async def test_the_start_up_log_says_the_idle_policy_plainly(jp_serverapp, idle_settings, said):
    """What the server logs at start (VGPUApp._start_idle_policy logs describe()): not "lowered
    ... after never, stopped after never" (issue 27 #18)."""
    idle: IdleKernels = jp_serverapp.web_app.settings[IDLE_SETTING]
    assert idle.describe() == said
