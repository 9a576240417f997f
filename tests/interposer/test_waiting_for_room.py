"""A CUDA call of a suspended slice waits for the slice's room in libvgpu.so, not in the driver:
a process that never used the GPU (its slice lent to others) creates no context, and so holds no
device memory, until the publisher clears the page's flag. The wait says so on the process's
stderr, which ipykernel forwards into the running cell, and the user's interrupt (the publisher's
leave_line) ends it with CUDA_ERROR_OUT_OF_MEMORY. Real processes under libvgpu.so on the
simulated driver (tests/programs/room_probe.c); the checkpointed side is in
tests/holders/test_checkpoint.py."""

from __future__ import annotations

import time

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MIB, wait_for
from support import LineProgram, RoomProbe, nvml_reading

# A context holds driver memory from its first moment: a process that created one would show.
DEVICE = "name=room GPU,memory=16GiB,sms=100,context_memory=300MiB"
HINT = "; Kernel > Interrupt stops waiting, nothing is lost"
WAITING = "jupyter-vgpu: waiting for room on GPU 0"
BACK = "jupyter-vgpu: room on GPU 0 is back; carrying on"
INTERRUPTED = (
    "jupyter-vgpu: interrupted: left the line for GPU 0; the kernel stays suspended, nothing is lost; "
    "its next CUDA call asks for room again"
)
LEFT_LINE_SECONDS = 2.0  # waiting.c's VGPU_LEFT_LINE_NS


@pytest.fixture
def env(sim_env) -> dict[str, str]:
    return {**sim_env, "VGPU_SIM_DEVICES": DEVICE}


@pytest.fixture
def room_probe(compile_c):
    """room_probe(env) -> a running support.RoomProbe; any still running at the end is killed."""
    program = compile_c("room_probe")
    started: list[RoomProbe] = []

    def start(env: dict[str, str]) -> RoomProbe:
        started.append(RoomProbe(program, env))
        return started[-1]

    yield start
    for probe in started:
        probe.kill()


def requests_reach(region, count: int) -> None:
    wait_for(lambda: region.resume_requests() == count, timeout=30, message=f"{count} resume requests in the region")


def test_a_process_without_a_context_waits_for_room_at_its_first_context_holding_nothing(env, make_slice, room_probe):
    slice_env, region = make_slice(env)
    probe = room_probe(slice_env)
    region.set_suspended(True)  # lent: the process has not touched the GPU (cuInit holds nothing)

    probe.send("ctx first")
    assert probe.said() == WAITING + HINT
    requests_reach(region, 1)  # the call asks once, however long it waits
    # Symbol resolution answers from the driver's table: it asks, but does not wait.
    assert probe.ask("resolve lookup", "lookup") == str(CUDA_SUCCESS)
    requests_reach(region, 2)
    assert probe.ask("ping", "pong") == "0"
    assert "first" not in probe.lines
    # No context, so nothing on the device; and NVML hooks never wait (a reader in the slice).
    assert nvml_reading(env) == {"used": 0, "processes": {}}
    assert nvml_reading(slice_env)["processes"] == {}

    region.set_suspended(False)
    assert probe.wait_for("first") == str(CUDA_SUCCESS)
    assert probe.said() == BACK
    assert nvml_reading(env)["processes"] == {str(probe.pid): 300 * MIB}
    assert probe.ask(f"alloc grown {MIB}", "grown") == str(CUDA_SUCCESS)
    assert region.resume_requests() == 2  # calls of a running slice ask nothing
    assert probe.finish() == ""


def test_the_wait_says_its_place_in_line_once_per_process_and_again_when_it_changes(env, make_slice, room_probe):
    slice_env, region = make_slice(env)
    probe = room_probe(slice_env)
    region.set_suspended(True)
    region.set_queue(2, 40)

    probe.send("ctx first")
    assert probe.said() == f"{WAITING} (2nd in line, about 40 s){HINT}"
    probe.send("ctx second")  # a second waiting thread of the process says nothing of its own
    requests_reach(region, 2)
    region.set_queue(1, 100)
    assert probe.said() == f"{WAITING} (1st in line, about 2 min){HINT}"
    region.set_queue(3, None)
    assert probe.said() == f"{WAITING} (3rd in line){HINT}"
    region.set_queue(0, None)
    assert probe.said() == WAITING + HINT

    region.set_suspended(False)
    assert (probe.wait_for("first"), probe.wait_for("second")) == (str(CUDA_SUCCESS), str(CUDA_SUCCESS))
    assert probe.said() == BACK
    assert probe.finish() == ""  # one line for the two threads' end of waiting too


def test_leaving_the_line_fails_the_wait_and_the_frameworks_retry_with_out_of_memory(env, make_slice, room_probe):
    slice_env, region = make_slice(env)
    probe = room_probe(slice_env)
    region.set_suspended(True)
    probe.send("ctx waiting")
    assert probe.said() == WAITING + HINT
    requests_reach(region, 1)

    region.leave_line()  # the user's Kernel > Interrupt
    assert probe.wait_for("waiting") == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert probe.said() == INTERRUPTED
    left = time.monotonic()  # the process saw the bump before it said so
    # The framework's retry within the same operation fails at once, asking nothing, although
    # the slice is still suspended and nobody cleared the flag.
    assert probe.ask("ctx retry", "retry") == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert region.resume_requests() == 1
    assert region.suspended
    assert nvml_reading(env)["processes"] == {}

    # Past that window, a call asks for room again and waits as the first did.
    time.sleep(max(0.0, left + LEFT_LINE_SECONDS - time.monotonic()))
    probe.send("ctx later")
    assert probe.said() == WAITING + HINT
    requests_reach(region, 2)
    region.set_suspended(False)
    assert probe.wait_for("later") == str(CUDA_SUCCESS)
    assert probe.said() == BACK
    assert probe.finish() == ""


@pytest.mark.parametrize("path", ["direct", "dlsym", "procaddr"])
def test_an_entry_point_libvgpu_does_not_hook_waits_for_room_too_on_every_path(machine, env, make_slice, path):
    """Issue 34 item 1: every entry point of the driver goes through libvgpu.so's gate (a
    generated trampoline, assembly of each architecture), not only the hooked ones: while the
    slice is suspended an unhooked call (cuDeviceGetCount) asks for room, waits saying so and
    gives up when the user leaves the line, however the program obtained it; while the slice
    runs it goes straight through."""
    slice_env, region = make_slice(env)
    program = machine.compile("room_probe")
    probe = LineProgram(machine.command(program, f"--path={path}"), machine.environment(slice_env))
    try:
        assert probe.ask("count running", "running") == str(CUDA_SUCCESS)
        region.set_suspended(True)
        probe.send("count first")
        assert probe.said() == WAITING + HINT
        # qemu-user rewrites the start time in /proc/self/stat, so the region cannot tell an
        # emulated process's slot from a reused pid's and counts none of it: host only.
        emulated = machine.name != "host"
        if not emulated:
            requests_reach(region, 1)
        assert probe.ask("ping", "pong") == "0"
        assert "first" not in probe.lines
        region.set_suspended(False)
        assert probe.wait_for("first") == str(CUDA_SUCCESS)
        assert probe.said() == BACK

        region.set_suspended(True)
        probe.send("count interrupted")
        assert probe.said() == WAITING + HINT
        region.leave_line()
        assert probe.wait_for("interrupted") == str(CUDA_ERROR_OUT_OF_MEMORY)
        assert probe.said() == INTERRUPTED
        region.set_suspended(False)
        assert emulated or region.resume_requests() == 2
        assert probe.finish() == ""
    finally:
        if probe.process.poll() is None:
            probe.kill()


TAKEN_BACK = (
    "jupyter-vgpu: paused: room on GPU 0 was taken back for a student within their guarantee; carries on when "
    "room frees"
)


def test_a_running_slice_whose_borrowed_room_is_taken_back_waits_saying_why_with_an_estimate_only_where_known(
    env, make_slice, room_probe
):
    slice_env, region = make_slice(env)
    probe = room_probe(slice_env)
    assert probe.ask("ctx first", "first") == str(CUDA_SUCCESS)  # running, mid-cell

    region.page.set_taken_back(True)  # the broker, ahead of the suspend its server carries out
    probe.send(f"alloc grown {MIB}")
    assert probe.said() == TAKEN_BACK
    requests_reach(region, 1)
    region.set_queue(1, 40)
    assert probe.said() == f"{TAKEN_BACK}, about 40 s"

    region.set_suspended(False)  # the room is back: the reason goes with the flag
    assert probe.wait_for("grown") == str(CUDA_SUCCESS)
    assert probe.said() == BACK
    assert not region.page.taken_back
    assert probe.finish() == ""
