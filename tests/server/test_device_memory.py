"""Promises checked against what the device really holds: memory NVML shows in use that the
ledger never admitted (a program outside any slice, a kernel over its cap) is shown as such by
GET /api/vgpu/devices and is never promised to a new slice. A real server process, real kernels
and a real program on one simulated 16 GiB GPU."""

from __future__ import annotations

import json
from pathlib import Path

import test_server_process
from support import CUDA_PRELUDE, hold_outside, wait_for
from test_server_process import KERNEL_NAME, Server, run_code

GIB = 1 << 30
# The user's environment and kernelspec of the server-process tests.
user_env = test_server_process.user_env
vgpu_kernelspec_dir = test_server_process.vgpu_kernelspec_dir


# run_code's client, patient with a kernel's heartbeat on a busy machine.


def the_device(server: Server) -> dict:
    (device,) = server.api("GET", "api/vgpu/devices")
    return device


def test_memory_held_outside_any_slice_is_shown_and_never_promised(user_env, sim_env, tmp_path):
    server = Server(tmp_path, user_env)
    outside = hold_outside(sim_env, 2 * GIB)
    try:
        device = the_device(server)
        assert device["memory_outside_bytes"] == 2 * GIB and device["memory_over_cap_bytes"] == 0
        assert device["memory_allocated_bytes"] == 0 and device["memory_free_bytes"] == 14 * GIB

        # 15 GiB may fit once the program outside ends: it waits in line, counting 14 GiB free.
        waiting = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "15GiB"})
        assert waiting["slice"]["state"] == "queued", waiting["slice"]
        assert waiting["slice"]["queue"]["waiting_for"] == "1GiB more GPU memory (14GiB free)"
        server.api("DELETE", f"api/kernels/{waiting['kernel']['id']}")  # shut down: it leaves the line
        assert server.api("GET", "api/vgpu/slices") == []
        server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "14GiB"})
        assert the_device(server)["memory_free_bytes"] == 0

        outside.stdin.close()  # the program ends, and its memory is free for promises again
        outside.wait(30)
        device = the_device(server)
        assert device["memory_outside_bytes"] == 0 and device["memory_free_bytes"] == 2 * GIB
    finally:
        outside.kill()
        server.stop()


def server_configured(user_env: dict[str, str], tmp_path: Path, settings: dict) -> Server:
    """A server started with ``settings`` as its jupyter_server_config.json."""
    config = Path(user_env["JUPYTER_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(json.dumps(settings))
    return Server(tmp_path, user_env)


def kernel_over_its_cap(server: Server, user_env: dict[str, str], raise_cap_and_allocate: str) -> str:
    """The id of a 3 GiB kernel that has run ``raise_cap_and_allocate`` (kernel code with
    CUDA_PRELUDE's allocate(), os and LimitsPage at hand) to hold more than its cap."""
    started = server.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME, "memory": "3GiB"})
    kernel_id = started["kernel"]["id"]
    run_code(
        user_env,
        kernel_id,
        CUDA_PRELUDE + "import os\nfrom jupyter_vgpu.holders.region import LimitsPage\n" + raise_cap_and_allocate,
    )
    return kernel_id


def test_a_kernel_over_its_cap_is_shown_and_its_excess_never_promised(user_env, tmp_path):
    # Limits put back only when a client reads the slices, so the kernel's allocation is not raced.
    server = server_configured(user_env, tmp_path, {"VGPUApp": {"watch_interval": 3600}})
    try:
        kernel_id = kernel_over_its_cap(
            server,
            user_env,
            "LimitsPage.open(os.environ['VGPU_LIMITS']).set_limits(memory_limit=16 << 30)\n"
            + "assert allocate(12 << 30) == 0\n",
        )
        device = the_device(server)
        assert device["memory_over_cap_bytes"] == 9 * GIB and device["memory_outside_bytes"] == 0
        assert device["memory_allocated_bytes"] == 3 * GIB and device["memory_free_bytes"] == 4 * GIB

        # (A start that does not fit in those 4 GiB would now suspend this idle kernel, whose 12 GiB
        # then really are free: tests/server/test_line.py shows that path.)

        # Reading the slice puts the cap back and flags it once, saying what stays held.
        (warning,) = server.api("GET", f"api/vgpu/slices/{kernel_id}")["warnings"]
        assert "memory cap 16GiB" in warning and "the server restored them" in warning
        assert "12GiB, 9GiB over the 3GiB cap" in warning and "until the kernel frees it" in warning
        run_code(user_env, kernel_id, "LimitsPage.open(os.environ['VGPU_LIMITS']).set_limits(memory_limit=15 << 30)")
        (again,) = server.api("GET", f"api/vgpu/slices/{kernel_id}")["warnings"]
        assert "memory cap 15GiB" in again and "(2 times)" in again and "9GiB over the 3GiB cap" in again
    finally:
        server.stop()


def test_a_kernel_over_its_cap_is_stopped_after_the_grace_when_configured_so(user_env, tmp_path):
    settings = {"VGPUApp": {"over_cap_action": "stop", "over_cap_grace": 1}}
    server = server_configured(user_env, tmp_path, settings)
    try:
        # Raised again until the allocation gets in: the server may put the cap back in between.
        kernel_id = kernel_over_its_cap(
            server,
            user_env,
            "page = LimitsPage.open(os.environ['VGPU_LIMITS'])\n"
            + "while page.set_limits(memory_limit=16 << 30) and allocate(12 << 30) != 0: pass\n",
        )

        def stopped() -> bool:
            return all(kernel["id"] != kernel_id for kernel in server.api("GET", "api/kernels"))

        wait_for(stopped, 60, "the kernel over its cap to be stopped")
        assert server.api("GET", "api/vgpu/slices") == []
        wait_for(lambda: the_device(server)["memory_free_bytes"] == 16 * GIB, 30, "its 12 GiB to be free")
        assert "over_cap_action = stop" in server.log.read_text()
    finally:
        server.stop()
