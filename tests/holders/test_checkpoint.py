"""The checkpoint controller (jupyter_vgpu.holders.checkpoint) suspending and resuming real
processes on the simulated GPU. The controller runs in a child process of its own, as the server
would run it: it loads the simulated driver and calls cuInit once, and a test process can do that
only once for one simulated machine, while each test has a machine of its own."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import pytest
from support import checkpoint_controller as controller
from support import nvml_reading, wait_for

MIB, GIB = 1 << 20, 1 << 30
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY = 0, 2
WAITING = "jupyter-vgpu: waiting for room on GPU 0; Kernel > Interrupt stops waiting, nothing is lost"


@pytest.fixture
def env(sim_env) -> dict[str, str]:
    return dict(sim_env)


def moved_to_host_and_back(env: dict[str, str], kernel) -> list[tuple[int, int]]:
    """Suspends a target's process and resumes it, its pattern checked intact after; what the
    suspend moved to host memory, (pid, bytes) per process."""
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    controller(env, "resume", processes=suspension["processes"])
    assert kernel.ask("verify", "intact") == "1"
    return [(process["pid"], process["memory"]) for process in suspension["processes"]]


def test_suspend_frees_a_slices_memory_for_others_and_resume_brings_its_pattern_back(env, checkpoint_targets):
    kernel, worker = checkpoint_targets(env, "64M"), checkpoint_targets(env, "32M")
    suspension = controller(env, "suspend", pids=[kernel.pid, worker.pid], lock_timeout=5)
    assert {(p["pid"], p["memory"]) for p in suspension["processes"]} == {
        (kernel.pid, 64 * MIB),
        (worker.pid, 32 * MIB),
    }
    assert nvml_reading(env) == {"used": 0, "processes": {}}

    # All of the device but one MiB (which the other holds already) is another process's now.
    other = checkpoint_targets(env, "1M")
    assert other.ask(f"alloc {16 * GIB - MIB}", "alloc") == "0"
    other.kill()

    assert controller(env, "resume", processes=suspension["processes"])["seconds"] >= 0
    assert kernel.ask("verify", "intact") == "1"
    assert worker.ask("verify", "intact") == "1"
    assert nvml_reading(env)["processes"] == {str(kernel.pid): 64 * MIB, str(worker.pid): 32 * MIB}


def test_a_process_still_working_is_left_running_with_the_rest_of_its_slice(env, checkpoint_targets):
    idle, busy = checkpoint_targets(env, "1M"), checkpoint_targets(env, "1M")
    busy.ask("busy 20000", "queued")
    answer = controller(env, "suspend", pids=[idle.pid, busy.pid], lock_timeout=0.2)
    assert answer["busy"] == [busy.pid]
    assert f"process {busy.pid} did not finish its GPU work within 0.2 s" in answer["refused"]
    assert controller(env, "states", pids=[idle.pid, busy.pid]) == {str(idle.pid): "RUNNING", str(busy.pid): "RUNNING"}
    # The idle one was locked and is unlocked again: its calls go through.
    assert idle.ask("alloc 1M", "alloc") == "0"


def test_resume_without_room_restores_nothing(env, checkpoint_targets):
    # A restore refused for lack of memory would leave this target FAILED: it stays CHECKPOINTED
    # only if the controller never tried.
    kernel = checkpoint_targets({**env, "VGPU_SIM_RESTORE_OOM_FAILS": "1"}, "64M")
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    other = checkpoint_targets(env, "1M")
    assert other.ask(f"alloc {16 * GIB - 32 * MIB}", "alloc") == "0"

    answer = controller(env, "resume", processes=suspension["processes"])
    assert answer["needed"] == 64 * MIB and answer["free"] == 31 * MIB
    assert "not resumed" in answer["no_room"]
    assert controller(env, "states", pids=[kernel.pid]) == {str(kernel.pid): "CHECKPOINTED"}

    other.kill()
    controller(env, "resume", processes=suspension["processes"])
    assert kernel.ask("verify", "intact") == "1"


def test_a_cuda_call_from_a_background_thread_of_a_suspended_process_waits_for_the_resume(env, checkpoint_targets):
    kernel = checkpoint_targets(env, "1M")
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    syscall = Path(f"/proc/{kernel.pid}/task/{kernel.ask('call', 'call-thread')}/syscall")
    wait_for(lambda: syscall.read_text().split()[0] == str(FUTEX), timeout=30, message="the call waits in the driver")
    assert kernel.ask("ping", "pong") == ""
    assert "call-returned" not in kernel.lines
    controller(env, "resume", processes=suspension["processes"])
    assert kernel.wait_for("call-returned") == "0"


def test_the_probe_says_why_a_slice_cannot_be_suspended(env, checkpoint_targets):
    two_devices = {**env, "VGPU_SIM_DEVICES": "memory=1GiB,sms=10;memory=1GiB,sms=10"}
    first = checkpoint_targets({**two_devices, "CUDA_VISIBLE_DEVICES": "0"}, "1M")
    second = checkpoint_targets({**two_devices, "CUDA_VISIBLE_DEVICES": "1"}, "1M")
    assert controller(two_devices, "probe", pids=[first.pid], managed=False) == {"reasons": []}
    reasons = controller(two_devices, "probe", pids=[first.pid, second.pid], managed=True)["reasons"]
    assert reasons == [
        "the kernel uses managed (unified) memory, which the driver cannot suspend",
        "the kernel's processes use 2 GPUs; only single-GPU kernels are suspended",
    ]


def test_a_process_without_cuda_has_no_state_and_is_left_alone(env, checkpoint_targets):
    kernel = checkpoint_targets(env, "1M")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert controller(env, "states", pids=[sleeper.pid]) == {str(sleeper.pid): None}
        suspension = controller(env, "suspend", pids=[sleeper.pid, kernel.pid], lock_timeout=5)
        assert [p["pid"] for p in suspension["processes"]] == [kernel.pid]
        assert controller(env, "states", pids=[kernel.pid]) == {str(kernel.pid): "CHECKPOINTED"}
        controller(env, "resume", processes=suspension["processes"])
        assert controller(env, "states", pids=[kernel.pid]) == {str(kernel.pid): "RUNNING"}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_cuda_call_in_a_suspended_slice_asks_its_publisher_for_a_resume(env, make_slice, checkpoint_targets):
    slice_env, region = make_slice(env)
    kernel = checkpoint_targets(slice_env, "1M")
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    region.set_suspended(True)
    assert region.resume_requests() == 0

    kernel.ask("call", "call-thread")
    # What a server's watch loop waits for; the call itself waits in libvgpu.so meanwhile.
    wait_for(lambda: region.resume_requests() > 0, timeout=30, message="a resume request in the region")
    assert "call-returned" not in kernel.lines
    controller(env, "resume", processes=suspension["processes"])
    region.set_suspended(False)
    assert kernel.wait_for("call-returned") == "0"

    asked = region.resume_requests()
    assert kernel.ask("call", "call-returned") == "0"
    assert region.resume_requests() == asked  # a call of a running slice asks nothing


def test_memory_a_pool_keeps_is_released_on_request_and_not_carried_to_host_memory(env, make_slice, checkpoint_targets):
    """Issue 26 item 2: memory the program freed into a stream-ordered pool that keeps it is
    reserved by the process (charged, listed by NVML); on the page's release request libvgpu.so
    trims the pool and answers in the slot with what went back; the suspend then moves only what
    the program holds, which comes back intact."""
    slice_env, region = make_slice(env)
    kernel = checkpoint_targets(slice_env, "32M")
    assert kernel.ask("pooled 64M", "pooled") == str(CUDA_SUCCESS)
    assert nvml_reading(env)["processes"] == {str(kernel.pid): 96 * MIB}
    wait_for(lambda: region.used_bytes() == 96 * MIB, timeout=10, message="the pool's reserve charged")

    request = region.page.request_release()
    answer = wait_for(
        lambda: (found := region.release_answers().get(kernel.pid)) and found.answered(request) and found,
        timeout=10,
        message="libvgpu.so's answer",
    )
    assert answer.pools_released == 64 * MIB
    assert not answer.frameworks_watching  # no Python side in this process
    assert nvml_reading(env)["processes"] == {str(kernel.pid): 32 * MIB}
    assert region.used_bytes() == 32 * MIB

    assert moved_to_host_and_back(env, kernel) == [(kernel.pid, 32 * MIB)]


def test_without_a_release_request_the_pools_reserve_goes_to_host_memory(env, make_slice, checkpoint_targets):
    """What the test above avoids: the checkpoint copies what the pool keeps too."""
    slice_env, _ = make_slice(env)
    kernel = checkpoint_targets(slice_env, "32M")
    assert kernel.ask("pooled 64M", "pooled") == str(CUDA_SUCCESS)
    assert moved_to_host_and_back(env, kernel) == [(kernel.pid, 96 * MIB)]


def test_the_region_tells_a_slice_that_used_managed_memory(env, make_slice, checkpoint_targets):
    managed_env, managed_region = make_slice(env)
    plain_env, plain_region = make_slice(env)
    managed, plain = checkpoint_targets(managed_env, "1M"), checkpoint_targets(plain_env, "1M")
    assert managed.ask("managed 1M", "managed") == "0"
    assert plain.ask("alloc 1M", "alloc") == "0"
    assert managed_region.uses_managed_memory()
    assert not plain_region.uses_managed_memory()


def test_a_call_of_a_checkpointed_process_waits_in_libvgpu_and_the_process_comes_back_intact(
    env, make_slice, checkpoint_targets
):
    slice_env, region = make_slice(env)
    kernel = checkpoint_targets(slice_env, "64M")
    region.set_suspended(True)  # the server's order: the flag, then lock and checkpoint
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)

    kernel.ask("call", "call-thread")
    assert kernel.said() == WAITING  # in libvgpu.so: the driver would have said nothing
    wait_for(lambda: region.resume_requests() == 1, timeout=30, message="the call's resume request")
    controller(env, "resume", processes=suspension["processes"])
    region.set_suspended(False)
    assert kernel.wait_for("call-returned") == str(CUDA_SUCCESS)
    assert kernel.said() == "jupyter-vgpu: room on GPU 0 is back; carrying on"
    assert kernel.ask("verify", "intact") == "1"


def test_leaving_the_line_leaves_a_checkpointed_process_suspended_and_loses_nothing(
    env, make_slice, checkpoint_targets
):
    slice_env, region = make_slice(env)
    kernel = checkpoint_targets(slice_env, "64M")
    region.set_suspended(True)
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    kernel.ask("call", "call-thread")
    assert kernel.said() == WAITING

    region.leave_line()
    assert kernel.wait_for("call-returned") == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert kernel.said().startswith("jupyter-vgpu: interrupted: left the line for GPU 0")
    # The retry fails at once, without reaching the driver, which would block it while locked.
    assert kernel.ask("alloc 1M", "alloc") == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert controller(env, "states", pids=[kernel.pid]) == {str(kernel.pid): "CHECKPOINTED"}

    controller(env, "resume", processes=suspension["processes"])
    region.set_suspended(False)
    assert kernel.ask("verify", "intact") == "1"
    assert kernel.ask("alloc 1M", "alloc") == str(CUDA_SUCCESS)


def test_a_checkpointed_process_whose_first_call_is_an_unhooked_copy_waits_in_libvgpu_is_interruptible_and_intact(
    env, make_slice, checkpoint_targets
):
    """Issue 34 item 1: the most natural cell after a pause reads a result back. cuMemcpyDtoH is
    no hook of libvgpu.so's, and the driver blocks every call of a locked process, silently and
    past an interrupt; through libvgpu.so's gate it waits saying so, asks for the room, gives up
    when the user leaves the line (the process stays checkpointed, nothing lost), and once
    resumed reads the bytes back intact."""
    slice_env, region = make_slice(env)
    kernel = checkpoint_targets(slice_env, "64M")
    region.set_suspended(True)
    suspension = controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)

    kernel.send("verify")  # the main thread's first call since the suspend: cuMemcpyDtoH_v2
    assert kernel.said() == WAITING
    wait_for(lambda: region.resume_requests() == 1, timeout=30, message="the copy's resume request")
    region.leave_line()  # Kernel > Interrupt
    assert kernel.wait_for("intact") == "0"  # the copy failed (out of memory) without the driver
    assert kernel.said().startswith("jupyter-vgpu: interrupted: left the line for GPU 0")
    assert controller(env, "states", pids=[kernel.pid]) == {str(kernel.pid): "CHECKPOINTED"}

    controller(env, "resume", processes=suspension["processes"])
    region.set_suspended(False)
    assert kernel.ask("verify", "intact") == "1"
    assert region.resume_requests() == 1
