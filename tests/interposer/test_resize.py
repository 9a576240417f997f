"""A resize reaches a running program on its next call: growing shows the new total at once,
shrinking below usage refuses new allocations and frees nothing."""

from __future__ import annotations

from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GIB, MIB, live_slots


def test_running_program_sees_a_resize_on_its_next_call(probe, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=GIB)
    program = interactive(
        [
            probe.executable,
            "init",
            "info",
            "wait",
            "info",
            "alloc:600M",
            "wait",
            "info",
            "alloc:1M",
            "total",
            "wait",
            "free:0",
            "alloc:1M",
            "info",
        ],
        env,
    )
    lines = program.read_until("wait")
    assert lines[1] == ["info", "0", str(GIB), str(GIB)]

    region.set_limits(memory_limit=2 * GIB)  # grow
    program.send()
    lines = program.read_until("wait")
    assert lines[0] == ["info", "0", str(2 * GIB), str(2 * GIB)]
    assert lines[1][:2] == ["alloc", "0"]

    region.set_limits(memory_limit=512 * MIB)  # shrink below the 600 MiB in use
    program.send()
    lines = program.read_until("wait")
    assert lines[0] == ["info", "0", "0", str(512 * MIB)]  # free clamps at 0, no underflow
    assert lines[1][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]
    assert lines[2] == ["total", "0", str(512 * MIB)]
    (slot,) = live_slots(region)
    assert slot.allocated == 600 * MIB  # nothing in use was freed

    program.send()
    lines = program.read_until("info")
    assert lines[0] == ["free", str(CUDA_SUCCESS)]
    assert lines[1][:2] == ["alloc", "0"]
    assert lines[2] == ["info", "0", str(511 * MIB), str(512 * MIB)]
    assert program.finish() == 0


def test_lifting_the_cap_passes_the_driver_through_and_restoring_it_counts_what_is_held(
    probe, sim_env, make_slice, interactive
):
    env, region = make_slice(sim_env, memory_limit=GIB)
    program = interactive([probe.executable, "init", "wait", "alloc:3G", "info", "wait", "info", "alloc:1M"], env)
    program.read_until("wait")
    region.set_limits(memory_limit=0)
    program.send()
    lines = program.read_until("wait")
    assert lines[0][:2] == ["alloc", "0"]
    assert lines[1][3] == str(16 * GIB)  # the driver's own total
    region.set_limits(memory_limit=2 * GIB)
    program.send()
    lines = program.read_until("alloc")
    assert lines[0] == ["info", "0", "0", str(2 * GIB)]
    assert lines[1][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]
    assert program.finish() == 0
