"""Device memory of the simulated GPU: what each allocation family charges, stream-ordered pools,
copies, contexts, and capacity shared by every process of the machine, including processes that die."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from sim_helpers import GIB, MIB, nvml_snapshot, parse_lines, probe, run_program, wait_until, with_devices

CUDA_SUCCESS = "0"
CUDA_ERROR_INVALID_VALUE = "1"
CUDA_ERROR_OUT_OF_MEMORY = "2"
CUDA_ERROR_NOT_INITIALIZED = "3"
CUDA_ERROR_INVALID_DEVICE = "101"
CUDA_ERROR_INVALID_CONTEXT = "201"
CUDA_ERROR_INVALID_HANDLE = "400"
POOL_FIGURES = ("used", "used_high", "reserved", "reserved_high")


def test_plain_managed_and_stream_ordered_allocations_charge_what_they_ask(programs, env):
    seen = probe(programs, env, "sizes")
    assert seen["alloc_charged"] == "12345"
    assert seen["managed_charged"] == str(MIB)
    assert seen["async_charged"] == str(3 * MIB)
    assert seen["async_freed"] == str(3 * MIB)  # kept by the default pool until a synchronisation
    assert seen["async_synchronised"] == "0"
    assert seen["pool_charged"] == str(5 * MIB)
    assert seen["pool_freed"] == "0"  # freed after its pool was destroyed: still valid until then
    assert seen["default_pool_destroy"] == CUDA_ERROR_INVALID_VALUE
    assert seen["final_charged"] == "0"


def test_a_pool_reports_what_the_process_holds_from_it(programs, env):
    seen = run_program(programs.entry_points, env, "pools")
    assert [seen[f"fresh_{figure}"] for figure in POOL_FIGURES] == ["0", "0", "0", "0"]
    assert [seen[f"two_allocations_{figure}"] for figure in POOL_FIGURES] == [str(4 * MIB)] * 4
    # The pool keeps what was freed into it: reserved stays at 4 MiB while 1 MiB is used.
    assert [seen[f"one_freed_{figure}"] for figure in POOL_FIGURES] == [
        str(MIB),
        str(4 * MIB),
        str(4 * MIB),
        str(4 * MIB),
    ]
    # A reset high-water mark starts again from the current figure; the other one keeps its own.
    assert [seen[f"used_high_reset_{figure}"] for figure in POOL_FIGURES] == [
        str(MIB),
        str(MIB),
        str(4 * MIB),
        str(4 * MIB),
    ]
    assert seen["trim"] == CUDA_SUCCESS
    assert seen["trimmed_reserved"] == str(MIB)
    assert seen["device_used"] == str(MIB)  # after the trim: only what is in use
    # The last free and a synchronisation: the pool's release threshold (64 MiB, set above) keeps it.
    assert [seen[f"all_freed_{figure}"] for figure in POOL_FIGURES] == ["0", str(MIB), str(MIB), str(4 * MIB)]
    assert seen["device_used_at_end"] == str(MIB)


def test_a_pool_keeps_freed_memory_until_a_synchronisation_or_a_trim_gives_it_back(programs, env):
    """As the driver's stream-ordered allocator: cuMemFreeAsync returns memory to its pool, which
    keeps it reserved (the device and NVML count it for the process); the next allocation takes
    it first; a stream, event or context synchronisation gives back what is beyond the release
    threshold (0 by default), and cuMemPoolTrimTo what is beyond what it is asked to keep."""
    process = subprocess.Popen(
        [str(programs.entry_points), "pool_reserve"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("ready"):
                break
        seen = parse_lines("".join(lines))
        # Kept past a synchronisation under a threshold that keeps it all: NVML lists it for the process.
        assert nvml_snapshot(env)["processes"][str(process.pid)] == 96 * MIB
        out, _ = process.communicate("go\n", timeout=60)
        seen.update(parse_lines(out))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert seen["freed_device"] == str(64 * MIB)
    assert [seen[f"freed_{figure}"] for figure in POOL_FIGURES] == ["0", str(64 * MIB), str(64 * MIB), str(64 * MIB)]
    assert seen["reused_device"] == str(64 * MIB)  # nothing new charged
    assert [seen[f"reused_{figure}"] for figure in POOL_FIGURES[::2]] == [str(16 * MIB), str(64 * MIB)]
    assert seen["stream_synchronised_device"] == "0"
    assert seen["stream_synchronised_reserved"] == "0"
    assert seen["event_synchronised_device"] == "0"
    assert seen["kept_device"] == str(96 * MIB)
    assert [seen[f"kept_{figure}"] for figure in POOL_FIGURES[::2]] == [str(32 * MIB), str(96 * MIB)]
    assert seen["trimmed_to_48_reserved"] == str(48 * MIB)  # it keeps what it was asked to
    assert seen["trimmed_reserved"] == str(32 * MIB)  # never below what is in use
    assert seen["trimmed_device"] == str(32 * MIB)
    assert seen["end_device"] == "0"


def test_pool_settings_read_back_and_the_read_only_figures_refuse_writes(programs, env):
    seen = run_program(programs.entry_points, env, "pools")
    assert seen["reuse_defaults"] == "111"
    assert seen["release_threshold_default"] == "0"
    assert seen["release_threshold_set"] == str(64 * MIB)
    assert seen["opportunistic_set"] == "0"
    for key in (
        "set_used_current",
        "set_high_nonzero",
        "get_unknown_attribute",
        "set_unknown_attribute",
        "get_without_value",
        "get_unknown_pool",
    ):
        assert seen[key] == CUDA_ERROR_INVALID_VALUE, key


def test_a_device_allocates_from_its_current_pool_until_that_pool_is_destroyed(programs, env):
    seen = run_program(programs.entry_points, with_devices(env, "memory=4GiB;memory=4GiB"), "pools")
    assert seen["get_pool_before_init"] == CUDA_ERROR_NOT_INITIALIZED
    assert seen["current_is_default"] == "1"
    assert (seen["set_current"], seen["current_is_created"]) == (CUDA_SUCCESS, "1")
    assert seen["created_used"] == str(2 * MIB)
    assert seen["default_used_meanwhile"] == str(MIB)
    assert (seen["destroy_current"], seen["current_after_destroy_is_default"]) == (CUDA_SUCCESS, "1")
    assert seen["free_from_destroyed"] == CUDA_SUCCESS
    for key in ("set_destroyed", "set_unknown", "set_other_devices_pool"):
        assert seen[key] == CUDA_ERROR_INVALID_VALUE, key
    assert seen["set_invalid_device"] == CUDA_ERROR_INVALID_DEVICE


def test_pitched_allocation_rounds_the_pitch_up_to_512_bytes(programs, env):
    seen = probe(programs, env, "sizes")
    assert seen["pitch"] == "1024"  # 1000-byte rows
    assert seen["pitch_charged"] == str(1024 * 3)


def test_vmm_charges_whole_granules_and_maps_them_like_the_driver(programs, env):
    seen = probe(programs, env, "sizes")
    assert seen["vmm_granularity"] == str(2 * MIB)
    assert seen["vmm_unaligned"] == CUDA_ERROR_INVALID_VALUE
    assert seen["vmm_charged"] == str(4 * MIB)
    assert seen["vmm_copy_before_access"] == CUDA_ERROR_INVALID_VALUE
    assert seen["vmm_roundtrip"] == "vmmdata"
    assert seen["vmm_copy_outside"] == CUDA_ERROR_INVALID_VALUE
    assert seen["vmm_released_mapped"] == str(4 * MIB)  # released but mapped: still held
    assert seen["vmm_unmapped"] == "0"
    assert seen["vmm_release_again"] == CUDA_ERROR_INVALID_VALUE


def test_arrays_charge_width_height_depth_channels_and_format_bytes(programs, env):
    seen = probe(programs, env, "sizes")
    assert seen["array2d_charged"] == str(100 * 10 * 4 * 4)  # float4
    assert seen["array1d_charged"] == str(1000 * 1 * 2 * 2)  # half2, height 0
    assert seen["array3d_charged"] == str(64 * 32 * 16)  # uchar
    assert seen["array_destroy_twice"] == CUDA_ERROR_INVALID_HANDLE
    assert seen["mipmap_charged"] == str((64 * 32 + 32 * 16 + 16 * 8) * 2)  # three levels of ushort
    assert seen["mipmap_too_many_levels"] == CUDA_ERROR_INVALID_VALUE


def test_copies_round_trip_through_a_10_gib_allocation_and_stay_inside_it(programs, env):
    seen = probe(programs, env, "memory")
    assert seen["roundtrip"] == "ok"
    assert seen["copy_past_end"] == CUDA_ERROR_INVALID_VALUE
    assert seen["copy_unknown"] == CUDA_ERROR_INVALID_VALUE
    assert seen["alloc_zero"] == CUDA_ERROR_INVALID_VALUE
    assert seen["alloc_too_big"] == CUDA_ERROR_OUT_OF_MEMORY


def test_frees_of_unknown_pointers_return_invalid_value(programs, env):
    seen = probe(programs, env, "memory")
    for key in ("free_unknown", "free_interior", "free_zero", "free_twice", "free_async_unknown"):
        assert seen[key] == CUDA_ERROR_INVALID_VALUE, key
    assert seen["free_ok"] == CUDA_SUCCESS


def test_each_context_charges_context_memory_once(programs, env):
    seen = probe(programs, with_devices(env, "memory=4GiB,context_memory=256MiB"), "contexts")
    assert seen["no_context"] == CUDA_ERROR_INVALID_CONTEXT
    assert seen["after_primary"] == str(256 * MIB)
    assert seen["primary_same"] == "1"
    assert seen["after_second_retain"] == str(256 * MIB)  # one primary context, however often retained
    assert seen["after_create"] == str(512 * MIB)
    assert seen["after_alloc_in_created"] == str(512 * MIB + MIB)
    assert seen["after_destroy"] == str(256 * MIB)  # the context and what it allocated
    assert seen["popped_to_primary"] == "1"
    assert seen["destroy_twice"] == CUDA_ERROR_INVALID_CONTEXT
    assert seen["use_destroyed"] == CUDA_ERROR_INVALID_CONTEXT
    assert seen["active_after_one_release"] == "1"
    assert seen["active_after_last_release"] == "0"
    assert seen["release_unretained"] == CUDA_ERROR_INVALID_CONTEXT
    assert seen["alloc_in_released"] == CUDA_ERROR_INVALID_CONTEXT
    assert seen["before_reset"] == str(256 * MIB + MIB)
    assert seen["after_reset"] == str(256 * MIB)


def test_a_forked_child_starts_afresh_and_its_memory_is_its_own(programs, env):
    seen = probe(programs, env, "fork")
    assert seen["child_before_init"] == "3"  # CUDA_ERROR_NOT_INITIALIZED: the parent's state is not the child's
    assert seen["child_sees"] == str(96 * MIB)  # the parent's 64 MiB and its own 32 MiB
    assert seen["child_status"] == "0"
    assert seen["parent_after_child"] == str(64 * MIB)


def test_memory_held_before_an_exec_is_gone_after_it(programs, env):
    seen = probe(programs, env, "exec")
    assert seen["before_exec"] == str(100 * MIB)
    assert seen["after_exec"] == "0"


def test_capacity_is_enforced_across_processes(programs, env, workloads):
    env = with_devices(env, "memory=1GiB")
    first = workloads(env, "hold", str(700 * MIB))
    first.wait_for("ready")
    assert first.lines["alloc"] == f"{700 * MIB} {CUDA_SUCCESS}"
    second = workloads(env, "hold", str(400 * MIB), str(324 * MIB), str(1))
    second.wait_for("ready")
    snapshot = nvml_snapshot(env)
    lines = second.finish()
    first.finish()
    # The second process sees the first one's memory: 400 MiB does not fit, the exact rest does.
    assert lines["alloc"] == f"{400 * MIB} {CUDA_ERROR_OUT_OF_MEMORY}"
    assert snapshot["used"] == 1 * GIB
    assert snapshot["processes"] == {str(first.pid): 700 * MIB, str(second.pid): 324 * MIB}
    assert nvml_snapshot(env)["used"] == 0  # both exited: their memory went with them


def test_capacity_holds_when_processes_race_for_the_last_bytes(programs, env, workloads):
    env = with_devices(env, "memory=1GiB")
    for _ in range(3):
        start_at = time.monotonic_ns() + 300_000_000  # the same instant for all of them
        racers = [workloads(env, "race", str(start_at), str(4 * MIB), "128") for _ in range(4)]
        granted = sum(int(racer.wait_for("granted")) for racer in racers)
        snapshot = nvml_snapshot(env)
        for racer in racers:
            racer.finish()
        # 512 requests of 4 MiB race for room for 256: exactly 256 are granted, never more or fewer.
        assert granted == 256
        assert snapshot["used"] == 1 * GIB


def test_memory_of_a_sigkilled_process_returns_within_two_seconds(programs, env, workloads):
    env = with_devices(env, "memory=1GiB")
    holder = workloads(env, "hold", str(600 * MIB))
    holder.wait_for("ready")
    assert nvml_snapshot(env)["used"] == 600 * MIB
    holder.process.send_signal(signal.SIGKILL)
    holder.process.wait()  # reaped: the pid is gone for good
    _, took = wait_until(lambda: nvml_snapshot(env)["used"] == 0, timeout=2.0)
    assert took < 2.0
    taker = workloads(env, "hold", str(1 * GIB))
    taker.wait_for("ready")
    assert taker.lines["alloc"] == f"{GIB} {CUDA_SUCCESS}"


def test_a_killed_process_nobody_has_reaped_yet_holds_no_memory(programs, env, workloads):
    # A process closes its files, the driver's among them, before it becomes a zombie: a real
    # driver frees its memory then, whether or when its parent reaps it (a kernel whose server
    # was killed is reparented to a PID 1 that may never reap it).
    env = with_devices(env, "memory=1GiB")
    holder = workloads(env, "hold", str(600 * MIB))
    holder.wait_for("ready")
    holder.process.send_signal(signal.SIGKILL)
    stat = Path(f"/proc/{holder.process.pid}/stat")
    wait_until(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", timeout=5.0)
    _, took = wait_until(lambda: nvml_snapshot(env)["used"] == 0, timeout=2.0)
    assert stat.read_text().rpartition(")")[2].split()[0] == "Z"  # still not reaped
    assert took < 2.0
    holder.process.wait()


def test_processes_killed_mid_call_never_wedge_the_others(programs, env, workloads):
    env = with_devices(env, "memory=2GiB,block_ns=1000")
    for _ in range(3):
        churners = [workloads(env, "churn") for _ in range(3)]
        for churner in churners:
            churner.wait_for("running")
        for churner in churners:
            churner.process.send_signal(signal.SIGKILL)
            churner.process.wait()
    # Every byte the killed processes held comes back, and nothing they left blocks a newcomer.
    taker = workloads(env, "hold", str(2 * GIB))
    taker.wait_for("ready", timeout=10)
    assert taker.lines["alloc"] == f"{2 * GIB} {CUDA_SUCCESS}"
    taker.finish()
    assert nvml_snapshot(env)["used"] == 0
