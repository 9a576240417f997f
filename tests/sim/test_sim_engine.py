"""The simulated GPU's execution engine: what a kernel costs, one timeline for every process,
the push buffer, launch validation, graphs, and the utilisation NVML derives from it."""

from __future__ import annotations

import time

import pytest
from sim_helpers import full_wave, kernel_duration_ns, nvml_snapshot, probe, with_devices

SMS, BLOCK_NS = 100, 10_000


@pytest.mark.parametrize(
    "grid, block",
    [
        ((1, 1, 1), (32, 1, 1)),  # 32 blocks fit per SM: one wave of one block
        ((800, 1, 1), (256, 1, 1)),  # exactly one full wave
        ((801, 1, 1), (256, 1, 1)),  # one block more: a second wave
        ((100, 2, 3), (16, 16, 4)),  # 1024 threads: 2 blocks per SM, 3 waves, 4 units of 256
        ((1000, 1, 1), (257, 1, 1)),  # 7 blocks per SM, 2 waves, 2 units
        ((5000, 1, 1), (1, 1, 1)),  # tiny blocks: capped at 32 per SM
        ((131070, 1, 1), (512, 1, 1)),  # many waves
    ],
)
def test_kernel_duration_follows_the_documented_formula(programs, env, grid, block):
    env = with_devices(env, f"sms={SMS},block_ns={BLOCK_NS}")
    seen = probe(programs, env, "duration", *map(str, grid), *map(str, block))
    assert seen["stream_was_busy"] == "1"
    blocks, threads = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
    expected = kernel_duration_ns(SMS, BLOCK_NS, blocks, threads)
    # Events on a busy stream read the virtual timeline exactly; float milliseconds round a little.
    assert abs(float(seen["elapsed_ns"]) - expected) <= max(50, expected * 1e-6)


def test_events_are_not_ready_until_the_virtual_kernel_ends(programs, env):
    seen = probe(programs, with_devices(env, "block_ns=50000000"), "duration", "1", "1", "1", "1", "1", "1")
    assert seen["query_before"] == "600"  # CUDA_ERROR_NOT_READY
    assert seen["elapsed_before"] == "600"
    assert seen["query_after"] == "0"
    assert float(seen["elapsed_ns"]) == pytest.approx(50e6, abs=50)


def test_two_processes_kernels_serialise_on_the_device_timeline(programs, env, workloads):
    kernel_ns, count = 10_000_000, 10
    env = with_devices(env, f"sms={SMS},block_ns={kernel_ns}")
    start_at = time.monotonic_ns() + 500_000_000
    wave = str(full_wave(SMS, 256))
    pair = [workloads(env, "serial", str(count), str(start_at), wave, "256") for _ in range(2)]
    results = [worker.finish() for worker in pair]
    alone = count * kernel_ns
    span = max(int(r["end_ns"]) for r in results) - min(int(r["begin_ns"]) for r in results)
    elapsed = sorted(float(r["elapsed_ns"]) for r in results)
    # Launched at the same instant, neither process's kernels overlap the other's: the pair takes
    # twice as long as one alone, and whoever queued second waited for the first.
    assert span >= 2 * alone * 0.97
    assert elapsed[0] >= alone * 0.99
    assert elapsed[1] >= 2 * alone * 0.97


def test_a_launch_loop_blocks_once_1024_launches_are_queued(programs, env):
    kernel_ns, launches = 200_000, 1124
    seen = probe(programs, with_devices(env, f"block_ns={kernel_ns}"), "push-buffer", str(launches))
    loop, total = int(seen["loop_ns"]), int(seen["total_ns"])
    # The 100 launches beyond the push buffer each waited for the oldest queued kernel to end...
    assert loop >= (launches - 1024) * kernel_ns * 0.95
    # ...and when the loop returned, a full push buffer of kernels was still queued.
    assert total - loop >= 1000 * kernel_ns


def test_launches_are_validated_as_the_driver_does(programs, env):
    seen = probe(programs, env, "launches")
    for key in (
        "zero_grid",
        "zero_block",
        "block_1025",
        "block_2d_too_many",
        "block_z_65",
        "grid_y_65536",
        "params_and_extra",
        "launch_ex_invalid",
    ):
        assert seen[key] == "1", key  # CUDA_ERROR_INVALID_VALUE
    assert seen["null_function"] == "400"  # CUDA_ERROR_INVALID_HANDLE
    assert seen["block_1024"] == "0"
    assert seen["launch_ex"] == "0"


def test_a_cooperative_grid_must_fit_in_one_wave(programs, env):
    seen = probe(programs, env, "launches")
    assert seen["cooperative_fits"] == "0"
    assert seen["cooperative_too_large"] == "720"  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE


def test_a_captured_graph_runs_every_kernel_at_each_launch(programs, env):
    seen = probe(programs, with_devices(env, f"sms={SMS},block_ns={BLOCK_NS}"), "launches")
    assert seen["capture_null_stream"] == "900"  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert seen["capture_ran"] == "0"  # capturing records, it does not execute
    assert seen["graph_nodes"] == "5"
    assert seen["graph_query"] == "600"
    assert seen["graph_stream_was_busy"] == "1"
    assert float(seen["graph_elapsed_ns"]) == pytest.approx(5 * kernel_duration_ns(SMS, BLOCK_NS, 1, 256), abs=50)
    assert seen["graph_destroy_twice"] == "1"


def test_cuda_11_and_12_instantiations_validate_and_report_like_the_driver(programs, env):
    seen = probe(programs, env, "graph-update")
    for key in ("params_null_exec", "params_null_graph", "params_null_params", "v2_null_exec", "v2_null_graph"):
        assert seen[key] == "1", key  # CUDA_ERROR_INVALID_VALUE
    assert seen["params_null_exec_result"] == "1"  # CUDA_GRAPH_INSTANTIATE_ERROR
    assert (seen["params"], seen["params_result"], seen["params_error_node_null"]) == ("0", "0", "1")
    assert (seen["v2"], seen["v2_error_node_null"], seen["v2_log_empty"]) == ("0", "1", "1")
    assert seen["v2_without_outputs"] == "0"  # the error node and the log are optional


def test_a_graph_exec_update_takes_the_new_kernels_and_refuses_a_changed_topology(programs, env):
    seen = probe(programs, with_devices(env, f"sms={SMS},block_ns={BLOCK_NS}"), "graph-update")
    small, large = (3 * kernel_duration_ns(SMS, BLOCK_NS, blocks, 256) for blocks in (1, 2400))
    for launch in ("small", "updated", "refused", "update_v1"):
        assert seen[f"{launch}_busy"] == "1", launch  # the events read the device's timeline only
    assert float(seen["small_elapsed_ns"]) == pytest.approx(small, abs=50)
    # An update of the same topology: the next launch runs the new graph's kernels.
    assert (seen["update"], seen["update_result"]) == ("0", "0")  # CU_GRAPH_EXEC_UPDATE_SUCCESS
    assert float(seen["updated_elapsed_ns"]) == pytest.approx(large, abs=50)
    # A fourth node changes the topology: refused, in both forms, and the executable is unchanged.
    assert seen["update_topology"] == "910"  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
    assert seen["update_topology_result"] == "2"  # CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
    assert seen["update_topology_nodes_null"] == "1"
    assert float(seen["refused_elapsed_ns"]) == pytest.approx(large, abs=50)
    assert (seen["update_v1_topology"], seen["update_v1_topology_result"]) == ("910", "2")
    assert seen["update_v1_error_node_null"] == "1"
    assert (seen["update_v1"], seen["update_v1_result"]) == ("0", "0")
    assert float(seen["update_v1_elapsed_ns"]) == pytest.approx(small, abs=50)
    for key in (
        "update_null_info",
        "update_v1_null_result",
        "update_null_exec",
        "update_null_graph",
        "update_destroyed",
    ):
        assert seen[key] == "1", key  # CUDA_ERROR_INVALID_VALUE


def utilisation_while(workloads, env, *args, after: float = 1.3):
    """Starts a workload and reads NVML `after` seconds into it, once a full sample period of
    its activity lies behind; returns the snapshot and the workload's pid."""
    worker = workloads(env, *args)
    started = int(worker.wait_for("started")) / 1e9
    snapshot = nvml_snapshot(env, at_monotonic=started + after)
    worker.finish()
    return snapshot, str(worker.pid)


def test_nvml_process_utilisation_of_back_to_back_kernels_is_100_percent(programs, env, workloads):
    env = with_devices(env, f"sms={SMS},block_ns=100000")
    snapshot, pid = utilisation_while(workloads, env, "busy", "2.0", str(full_wave(SMS, 256)), "256")
    assert snapshot["sm_util"][pid] >= 97
    assert snapshot["gpu_util"] >= 97
    assert abs(snapshot["sample_times"][0] - time.time() * 1e6) < 30e6  # CLOCK_REALTIME microseconds


def test_nvml_process_utilisation_with_50_percent_idle_gaps_is_50_percent(programs, env, workloads):
    period = 10_000_000
    env = with_devices(env, f"sms={SMS},block_ns={period // 2}")
    snapshot, pid = utilisation_while(workloads, env, "duty", "2.0", str(period), str(full_wave(SMS, 256)), "256")
    assert abs(snapshot["sm_util"][pid] - 50) <= 3
    assert abs(snapshot["gpu_util"] - 50) <= 3


def test_a_kernel_filling_half_the_sms_counts_half_in_sm_utilisation(programs, env, workloads):
    env = with_devices(env, f"sms={SMS},block_ns=100000")
    snapshot, pid = utilisation_while(workloads, env, "busy", "2.0", str(full_wave(SMS, 256) // 2), "256")
    assert abs(snapshot["sm_util"][pid] - 50) <= 3
    assert snapshot["gpu_util"] >= 97  # the device itself is never idle
