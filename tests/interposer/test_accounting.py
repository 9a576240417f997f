"""Accounting is exact under contention and across processes: 64 threads x 8 processes
allocating and freeing at random end with the slice holding exactly what they still hold, the
driver never holds more than the cap, a SIGKILLed process stops counting within 2 s, and a
forked child counts separately from zero."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from slice_helpers import CUDA_SUCCESS, MIB, live_slots, slot_usage, wait_for

THREADS = 64
PROCESSES = 8
CAP = 512 * MIB
MAX_CHUNKS = 8  # each request is 1..8 x 2 MiB

# Samples the device's used memory as the driver itself reports it (run without the
# interposer): what the slice's processes really hold, request by request.
DRIVER_SAMPLER = r"""
import select, sys
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
peak = samples = 0
while not (samples % 64 == 0 and select.select([sys.stdin], [], [], 0)[0]):
    peak, samples = max(peak, pynvml.nvmlDeviceGetMemoryInfo(handle).used), samples + 1
print(peak, samples)
"""


class DriverSampler:
    def __init__(self, env: dict[str, str]):
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER_SAMPLER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def stop(self) -> tuple[int, int]:
        out, _ = self.process.communicate("stop\n", timeout=30)
        peak, samples = map(int, out.split())
        return peak, samples


class SlotSampler(threading.Thread):
    """Samples the slice's usage as the interposer's cap check sums it, from Python."""

    def __init__(self, region):
        super().__init__(daemon=True)
        self.region = region
        self.samples: list[int] = []
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            self.samples.append(slot_usage(self.region))

    def stop(self) -> list[int]:
        self.stopping.set()
        self.join()
        return self.samples


def start_storm(interactive, compile_c, env, iterations: int, seed: int):
    return interactive([compile_c("storm"), THREADS, iterations, seed, MAX_CHUNKS], env)


def read_held(program) -> tuple[int, int, int]:
    lines = program.read_until("ready", timeout=150)
    held, refusals, grants = (int(value) for value in lines[-2][1:])
    return held, refusals, grants


def test_64_threads_by_8_processes_end_with_exact_usage_and_never_over_the_cap(
    compile_c, sim_env, make_slice, interactive
):
    env, region = make_slice(sim_env, memory_limit=CAP)
    driver = DriverSampler(sim_env)
    slots = SlotSampler(region)
    slots.start()
    storms = [start_storm(interactive, compile_c, env, iterations=1000, seed=seed) for seed in range(PROCESSES)]
    results = {storm.process.pid: read_held(storm) for storm in storms}
    slot_samples = slots.stop()
    peak, samples = driver.stop()

    held_total = sum(held for held, _, _ in results.values())
    assert sum(refusals for _, refusals, _ in results.values()) > 0, "the storm never reached the cap"
    assert held_total <= CAP
    by_pid = {slot.pid: slot for slot in live_slots(region)}
    assert set(by_pid) == set(results)
    for pid, (held, _, _) in results.items():
        assert by_pid[pid].allocated == held, pid
    assert wait_for(lambda: slot_usage(region) == held_total, timeout=5, message="usage equals what is held")
    assert region.used_bytes() == held_total
    # What the driver really held never exceeded the cap. (The slots' own sum may, for the
    # instant between adding a request and taking a refused one back.)
    assert samples > 10 and peak <= CAP, (peak, samples)
    assert len(slot_samples) > 10 and max(slot_samples) <= CAP + PROCESSES * THREADS * MAX_CHUNKS * 2 * MIB
    for storm in storms:
        storm.send()
        assert storm.finish() == 0


def test_sigkill_mid_storm_stops_counting_within_2_seconds(compile_c, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=CAP)
    survivors = [start_storm(interactive, compile_c, env, iterations=150, seed=seed) for seed in range(3)]
    victim = start_storm(interactive, compile_c, env, iterations=10**9, seed=99)
    wait_for(
        lambda: any(slot.pid == victim.process.pid and slot.allocated > 0 for slot in live_slots(region)),
        timeout=60,
        message="the victim holds memory",
    )
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait()  # no zombie left: the pid is gone for good
    killed_at = time.monotonic()
    wait_for(
        lambda: all(slot.pid != victim.process.pid for slot in live_slots(region)),
        timeout=2,
        interval=0.01,
        message="a living process of the slice reaped the killed one's slot",
    )
    assert time.monotonic() - killed_at <= 2
    held_total = sum(read_held(storm)[0] for storm in survivors)
    assert wait_for(lambda: slot_usage(region) == held_total, timeout=2, message="usage equals what survivors hold")
    for storm in survivors:
        storm.send()
        assert storm.finish() == 0


def test_forked_child_counts_separately_from_zero(compile_c, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=CAP)
    program = interactive([compile_c("fork_probe"), 64 * MIB, 32 * MIB], env)
    lines = program.read_until("ready")
    parent_pid, parent_rc = (int(value) for value in lines[0][1:])
    child_pid, child_rc, _ = (int(value) for value in lines[1][1:])
    assert (parent_rc, child_rc) == (CUDA_SUCCESS, CUDA_SUCCESS)
    by_pid = {slot.pid: slot.allocated for slot in live_slots(region)}
    assert by_pid == {parent_pid: 64 * MIB, child_pid: 32 * MIB}
    program.send()
    assert program.finish() == 0


def test_exec_gives_back_what_the_previous_image_held(probe, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=CAP)
    program = interactive(
        [probe.executable, "init", "alloc:64M", "wait", "exec", "wait", "init", "alloc:16M", "wait"], env
    )
    program.read_until("wait")
    assert [(slot.pid, slot.allocated) for slot in live_slots(region)] == [(program.process.pid, 64 * MIB)]
    program.send()
    program.read_until("wait")  # the new image runs, and has not used the GPU yet
    assert live_slots(region) == []
    program.send()
    lines = program.read_until("wait")
    assert lines[1][:2] == ["alloc", "0"]
    assert [(slot.pid, slot.allocated) for slot in live_slots(region)] == [(program.process.pid, 16 * MIB)]
    program.send()
    assert program.finish() == 0
