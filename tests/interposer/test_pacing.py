"""The SM-share limiter (native/interposer/pacing.c) on the simulated GPU.

Each test runs tests/programs/pacing_load.c (a launch loop that keeps the device fed) inside a
slice and measures what an operator would: SM utilisation per process from NVML's
nvmlDeviceGetProcessUtilization, read by tests/programs/pacing_monitor.c outside any slice.
The simulated NVML computes a process's utilisation exactly over [since, now] (one second at
most), so a window is chosen by its start time.
"""

from __future__ import annotations

import os
import queue
import signal
import statistics
import subprocess
import threading
import time

import pytest
from slice_helpers import in_pid_namespace, live_slots

# 100 SMs; a block of <= 256 threads occupies an SM for 50 us. The load's kernels (16 blocks
# of 256 threads per SM: two full waves) run 100 us each and occupy the whole device.
DEVICE = "name=jupyter-vgpu pacing GPU,memory=16GiB,sms=100,context_memory=0,block_ns=50000"
TOLERANCE_PP = 3
WARM_UP_S = 0.5


class Load:
    """A running pacing_load: its pid, when it began launching, and its output so far."""

    def __init__(self, program, env: dict[str, str], args: tuple[str, ...], prefix: tuple[str, ...] = ()):
        self.process = subprocess.Popen(
            [*prefix, str(program), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # Reader threads: a pipe nobody drains would stall the program, and select() on a
        # buffered text stream misses lines already read into the buffer.
        self._stdout: queue.Queue[str] = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._drain, args=(self.process.stdout, self._stdout.put), daemon=True),
            threading.Thread(target=self._drain, args=(self.process.stderr, self._stderr.append), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.lines: list[str] = []
        self.pid = int(self._expect("pid "))
        self.start_us = int(self._expect("start_us "))

    @staticmethod
    def _drain(stream, sink) -> None:
        for line in iter(stream.readline, ""):
            sink(line)

    def _expect(self, prefix: str, timeout: float = 10.0) -> str:
        try:
            line = self._stdout.get(timeout=timeout)
        except queue.Empty:
            self.process.kill()
            raise AssertionError(f"pacing_load printed no {prefix!r} line in time: {self.stderr}") from None
        self.lines.append(line)
        assert line.startswith(prefix), self.lines
        return line[len(prefix) :].strip()

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def finish(self, timeout: float = 15.0) -> str:
        """Waits for the program to end; returns its whole stdout."""
        returncode = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        while not self._stdout.empty():
            self.lines.append(self._stdout.get())
        assert returncode == 0, f"pacing_load failed ({returncode}): {self.stderr}"
        return "".join(self.lines)


def start_load(program, env: dict[str, str], *args: str, seconds: float, prefix: tuple[str, ...] = ()) -> Load:
    """Starts the launch loop (behind `prefix`, a command that runs it) and returns once it is
    about to launch its first kernel."""
    return Load(program, env, ("--seconds", str(seconds), *args), prefix)


def realtime_us() -> int:
    return time.time_ns() // 1000


def wait_until_us(moment_us: int) -> None:
    """Waits for the end of a measurement window (a schedule, not a race)."""
    remaining = moment_us / 1e6 - time.time()
    if remaining > 0:
        time.sleep(remaining)


def utilisation_since(monitor, env: dict[str, str], since_us: int) -> dict[int, int]:
    """SM utilisation (percent) of each process over [since_us, now], from NVML."""
    result = subprocess.run(
        [str(monitor), "since", str(since_us)], env=env, capture_output=True, text=True, timeout=10, check=True
    )
    return {
        int(words[1]): int(words[2])
        for words in (line.split() for line in result.stdout.splitlines())
        if words and words[0] == "s"
    }


def window(monitor, env, load: Load, start_s: float, end_s: float) -> dict[int, int]:
    """Utilisation of every process over [start_s, end_s] seconds after `load` started."""
    wait_until_us(load.start_us + int(end_s * 1e6))
    return utilisation_since(monitor, env, load.start_us + int(start_s * 1e6))


def watch(monitor, env: dict[str, str], interval_ms: int, duration_ms: int, window_ms: int) -> subprocess.Popen:
    return subprocess.Popen(
        [str(monitor), "watch", str(interval_ms), str(duration_ms), str(window_ms)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def watched_series(process: subprocess.Popen, pid: int) -> list[tuple[int, int]]:
    """(query time in us, utilisation of pid) for every query of a finished watch."""
    out, err = process.communicate(timeout=15)
    assert process.returncode == 0, err
    series: list[tuple[int, int]] = []
    for words in (line.split() for line in out.splitlines()):
        if words[0] == "q":
            series.append((int(words[1]), 0))
        elif words[0] == "s" and int(words[1]) == pid:
            series[-1] = (series[-1][0], int(words[2]))
    return series


@pytest.fixture
def programs(compile_c):
    return compile_c("pacing_load"), compile_c("pacing_monitor")


@pytest.fixture
def device_env(sim_env):
    env = dict(sim_env)
    env["VGPU_SIM_DEVICES"] = DEVICE
    return env


def wait_for(condition, timeout: float):
    """Polls `condition` until it returns something true (returned) or the deadline (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    return None


# ---- accuracy ---------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [10, 30, 50, 90])
def test_hard_share_is_met_within_3pp_and_reported_in_the_region(programs, device_env, make_slice, share):
    load_program, monitor = programs
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, seconds=3.3)

    # What the controller publishes for the server (one reading per control period) over the
    # same second that NVML is asked about afterwards.
    wait_until_us(load.start_us + 2_000_000)
    slice_readings, process_readings = [], []
    while realtime_us() < load.start_us + 2_950_000:
        slice_readings.append(region.raw.sm_util_permille)
        process = next(p for p in region.processes() if p.pid == load.pid)
        process_readings.append(process.sm_util_permille)
        time.sleep(0.05)
    measured = window(monitor, device_env, load, 2.0, 3.0)[load.pid]
    load.finish()

    assert abs(measured - share) <= TOLERANCE_PP, f"share {share}%: NVML measured {measured}%"
    assert abs(statistics.mean(slice_readings) / 10 - share) <= TOLERANCE_PP, slice_readings
    assert abs(statistics.mean(process_readings) / 10 - share) <= TOLERANCE_PP, process_readings
    assert process.launches > 0
    assert process.throttled_ns > 0  # the loop wants the whole device, so it was held back


@pytest.mark.parametrize(
    ("sms", "shape"),
    [
        (16, ("--grid-per-sm", "16", "--block", "256")),
        (264, ("--grid-per-sm", "2", "--block", "1024")),
        (100, ("--grid-per-sm", "4", "--block", "256")),
    ],
    ids=["16-SMs", "264-SMs-1024-threads", "half-occupancy"],
)
def test_share_holds_whatever_the_device_size_and_kernel_shape(programs, device_env, make_slice, sms, shape):
    """The rate comes from a measured cost per token, so nothing needs tuning per device: the
    same share holds on a small and a large device and for kernels that fill half of it."""
    load_program, monitor = programs
    share = 30
    env = dict(device_env, VGPU_SIM_DEVICES=DEVICE.replace("sms=100", f"sms={sms}"))
    slice_env, _region = make_slice(env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, *shape, seconds=3.2)

    measured = window(monitor, env, load, 2.0, 3.0)[load.pid]
    load.finish()

    assert abs(measured - share) <= TOLERANCE_PP, f"{sms} SMs, {shape}: NVML measured {measured}%"


@pytest.mark.parametrize(
    "pattern",
    [("--threads", "1"), ("--threads", "2"), ("--busy-ms", "300", "--idle-ms", "200")],
    ids=["steady", "two-threads", "on-off"],
)
def test_hard_never_exceeds_share_in_any_second_after_warm_up(programs, device_env, make_slice, pattern):
    """Steady, two-thread and on/off loads: idle time must not be banked as credit."""
    load_program, monitor = programs
    share = 30
    slice_env, _region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, *pattern, seconds=3.6)
    watcher = watch(monitor, device_env, interval_ms=100, duration_ms=3400, window_ms=1000)
    series = watched_series(watcher, load.pid)
    load.finish()

    after_warm_up = [util for t_us, util in series if t_us - 1_000_000 >= load.start_us + WARM_UP_S * 1e6]
    assert len(after_warm_up) >= 10
    assert max(after_warm_up) <= share + TOLERANCE_PP, after_warm_up
    if pattern[0] == "--threads":
        assert min(after_warm_up) >= share - TOLERANCE_PP, after_warm_up


def busy_phase_windows(series: list[tuple[int, int]], start_us: int, busy_ms: int, idle_ms: int, window_ms: int):
    """{busy phase: [utilisation of each window that lies wholly inside it]} from a watch's
    series, phases counted from the load's first launch and the first one (which learns what a
    token costs) left out. A phase that began late or a window misplaced by a slow query only
    takes idle time in, which reads lower: misplacing can hide an excess, never make one."""
    cycle_us = (busy_ms + idle_ms) * 1000
    phases: dict[int, list[int]] = {}
    for t_us, util in series:
        phase, into_us = divmod(t_us - start_us, cycle_us)
        if phase >= 1 and window_ms * 1000 <= into_us <= busy_ms * 1000:
            phases.setdefault(phase, []).append(util)
    return phases


def test_hard_share_holds_on_every_100ms_window_of_an_on_off_load(programs, device_env, make_slice):
    """A notebook's load: 200 ms of launches, 300 ms idle, over and over. From the first launch
    after each pause, no 100 ms window of a busy phase is more than 2 points over the share: the
    pause banks nothing (tokens saved in the pool, an integral wound up by the window in which
    the load stopped, a cost estimate skewed by it) that the next phase could spend above it.
    Each window is exact on the simulated device's clock (NVML's since-timestamp), so a query
    that runs late on a busy machine moves its window, and never blurs it."""
    load_program, monitor = programs
    share, busy_ms, idle_ms, window_ms = 60, 200, 300, 100
    slice_env, _region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, "--busy-ms", str(busy_ms), "--idle-ms", str(idle_ms), seconds=2.5)
    watcher = watch(monitor, device_env, interval_ms=10, duration_ms=2500, window_ms=window_ms)
    series = watched_series(watcher, load.pid)
    load.finish()

    phases = busy_phase_windows(series, load.start_us, busy_ms, idle_ms, window_ms)
    windows = [util for utils in phases.values() for util in utils]
    assert len(phases) >= 3 and len(windows) >= 10, f"too few windows inside busy phases: {phases}"
    assert statistics.median(windows) >= share - 10, f"the load hardly ran in its busy phases: {phases}"
    assert max(windows) <= share + 2, f"100 ms windows of busy phases at a {share}% hard share: {phases}"


@pytest.mark.parametrize("second_pattern", [(), ("--threads", "3")], ids=["alike", "one-thread-against-three"])
def test_processes_of_one_slice_split_its_share_evenly(programs, device_env, make_slice, second_pattern):
    """Two saturating processes of one slice: the slice gets its share, and each process half of
    it, however many threads each launches from (the split is between processes)."""
    load_program, monitor = programs
    share = 40
    slice_env, _region = make_slice(device_env, sm_share=share, policy="hard")
    first = start_load(load_program, slice_env, seconds=3.3)
    second = start_load(load_program, slice_env, *second_pattern, seconds=3.3 - (realtime_us() - first.start_us) / 1e6)

    measured = window(monitor, device_env, first, 2.0, 3.0)
    first.finish()
    second.finish()

    together = measured.get(first.pid, 0) + measured.get(second.pid, 0)
    assert abs(together - share) <= TOLERANCE_PP, measured
    for load in (first, second):
        assert abs(measured.get(load.pid, 0) - share / 2) <= TOLERANCE_PP, measured


def test_unlimited_share_does_not_throttle_and_is_still_measured(programs, device_env, make_slice):
    """With the limiter off the slice still gets a controller, which measures its utilisation
    for reports (started by the process's monitor rather than by its first launch)."""
    load_program, monitor = programs
    slice_env, region = make_slice(device_env, sm_share=100, policy="hard")
    load = start_load(load_program, slice_env, seconds=2.2)

    measured = window(monitor, device_env, load, 1.0, 2.0)[load.pid]
    process = next(p for p in region.processes() if p.pid == load.pid)
    controller, reported = region.raw.controller_pid, region.raw.sm_util_permille
    load.finish()

    assert measured >= 90
    assert process.throttled_ns == 0
    assert process.launches > 0
    assert controller == load.pid
    assert abs(reported / 10 - measured) <= TOLERANCE_PP, (reported, measured)


def test_share_holds_in_a_pid_namespace_where_nvml_shows_host_pids(programs, device_env, make_slice, tmp_path):
    """As in a container: the load's getpid() is 1, NVML knows it by its host pid. The interposer
    finds that pid from the load's first allocation (its buffer, as a framework's weights), and
    the controller then measures and holds the share."""
    load_program, monitor = programs
    share = 30
    host_proc = tmp_path / "host-proc"
    host_proc.mkdir()
    env = dict(device_env, VGPU_SIM_PROC=str(host_proc))
    slice_env, region = make_slice(env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, "--buffer-mib", "64", seconds=3.3, prefix=in_pid_namespace(host_proc))
    (slot,) = live_slots(region)
    host_pid = wait_for(lambda: slot.nvml_pid, 2.0)

    measured = window(monitor, device_env, load, 2.0, 3.0)  # the monitor runs on the host
    load.finish()

    assert load.pid == 1 and host_pid, "the interposer did not find the load's NVML pid within 2 s"
    assert abs(measured.get(host_pid, 0) - share) <= TOLERANCE_PP, f"in a PID namespace: {measured}"


# ---- burst ------------------------------------------------------------------------------------


def test_burst_uses_an_idle_device_and_yields_within_200ms(programs, device_env, make_slice):
    load_program, monitor = programs
    share = 30
    burst_env, _ = make_slice(device_env, sm_share=share, policy="burst")
    other_env, _ = make_slice(device_env, sm_share=50, policy="hard")
    bursting = start_load(load_program, burst_env, seconds=3.4)

    alone = window(monitor, device_env, bursting, 0.5, 1.2)[bursting.pid]
    other = start_load(load_program, other_env, seconds=2.0)
    other_started_us = other.start_us
    wait_until_us(other_started_us + 700_000)
    shared = utilisation_since(monitor, device_env, other_started_us + 200_000)
    bursting.finish()
    other.finish()

    assert alone >= 90, f"alone on the device a burst slice got {alone}%"
    assert abs(shared[bursting.pid] - share) <= TOLERANCE_PP, (
        f"200-700 ms after another slice started, the burst slice had {shared[bursting.pid]}%"
    )
    assert shared[other.pid] >= 40


# ---- resize, graphs, fail-over -------------------------------------------------------------------


def test_live_resize_changes_measured_utilisation(programs, device_env, make_slice):
    load_program, monitor = programs
    slice_env, region = make_slice(device_env, sm_share=20, policy="hard")
    load = start_load(load_program, slice_env, seconds=3.4)

    before = window(monitor, device_env, load, 0.8, 1.6)[load.pid]
    region.set_limits(sm_share=60)
    resized_us = realtime_us()
    wait_until_us(resized_us + 1_300_000)
    after = utilisation_since(monitor, device_env, resized_us + 300_000)[load.pid]
    load.finish()

    assert abs(before - 20) <= TOLERANCE_PP
    assert abs(after - 60) <= TOLERANCE_PP, f"0.3-1.3 s after resizing to 60% the slice had {after}%"


# The entry points that make a graph's executable: CUDA 12's two and the one CUDA 11 runtimes call.
INSTANTIATE_ENTRY_POINTS = pytest.mark.parametrize("instantiate", ["flags", "params", "v2"])


@INSTANTIATE_ENTRY_POINTS
def test_graph_launches_are_paced(programs, device_env, make_slice, instantiate):
    load_program, monitor = programs
    share = 30
    slice_env, _region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, "--graph", "--instantiate", instantiate, "--batch", "8", seconds=3.3)

    measured = window(monitor, device_env, load, 2.0, 3.0)[load.pid]
    load.finish()

    assert abs(measured - share) <= TOLERANCE_PP, f"graph launches ({instantiate}) under {share}%: {measured}%"


def refill_rates_and_utilisation(monitor, env, region, load: Load) -> tuple[list[int], int]:
    """The controller's refill rate (tokens per second) every 40 ms from 1 s to 3 s into `load`,
    and the load's utilisation over 2.2-3.2 s."""
    wait_until_us(load.start_us + 1_000_000)
    rates = []
    while realtime_us() < load.start_us + 3_000_000:
        rates.append(region.raw.tokens_per_second)
        time.sleep(0.04)
    return rates, window(monitor, env, load, 2.2, 3.2)[load.pid]


@INSTANTIATE_ENTRY_POINTS
def test_graph_launches_are_priced_like_their_kernels(programs, device_env, make_slice, instantiate):
    """A graph is charged what its kernels cost launched one by one, whichever entry point made
    its executable. The program switches between launching a graph of 8 kernels and launching
    those 8 kernels every 400 ms: the controller's refill rate (tokens per second) stays put,
    where a graph priced at anything else (the nominal price of one never priced, say) would
    swing it by the mispricing at every switch."""
    load_program, monitor = programs
    share = 30
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(
        load_program, slice_env, "--mixed-ms", "400", "--instantiate", instantiate, "--batch", "8", seconds=3.4
    )
    rates, measured = refill_rates_and_utilisation(monitor, device_env, region, load)
    load.finish()

    assert min(rates) > 0 and max(rates) <= 1.25 * min(rates), rates
    assert abs(measured - share) <= TOLERANCE_PP, f"mixed graph and kernel launches under {share}%: {measured}%"


def test_an_updated_graph_is_priced_like_its_new_kernels(programs, device_env, make_slice):
    """cuGraphExecUpdate_v2 gives an executable other kernels, and its price follows them. Every
    400 ms the program updates its graph of 8 kernels between grids of 16 and 8 blocks per SM
    (two waves, then one): the controller's refill rate stays put, where an executable still
    charged its first graph's price would be charged twice its work every other phase and swing
    the rate twofold."""
    load_program, monitor = programs
    share = 30
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    load = start_load(load_program, slice_env, "--update-ms", "400", "--batch", "8", seconds=3.4)
    rates, measured = refill_rates_and_utilisation(monitor, device_env, region, load)
    load.finish()

    assert min(rates) > 0 and max(rates) <= 1.25 * min(rates), rates
    assert abs(measured - share) <= TOLERANCE_PP, f"a graph updated every 400 ms under {share}%: {measured}%"


def two_loads_and_the_lease(load_program, slice_env, region, seconds: float) -> tuple[Load, Load, int, Load]:
    """Starts two saturating loads in one slice and waits until one holds the controller lease:
    (first, second, the holder's pid, the other load)."""
    first = start_load(load_program, slice_env, seconds=seconds)
    second = start_load(load_program, slice_env, seconds=seconds)
    loads = {first.pid: first, second.pid: second}
    holder = wait_for(lambda: region.raw.controller_pid if region.raw.controller_pid in loads else 0, 3)
    assert holder, "no process of the slice took the controller lease"
    return first, second, holder, loads[next(pid for pid in loads if pid != holder)]


def test_controller_fails_over_when_its_process_is_killed(programs, device_env, make_slice):
    load_program, monitor = programs
    share = 40
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    first, second, holder, survivor = two_loads_and_the_lease(load_program, slice_env, region, 4.0)
    wait_until_us(first.start_us + 1_000_000)
    os.kill(holder, signal.SIGKILL)
    killed_us = realtime_us()
    (first if first.pid == holder else second).process.wait(timeout=5)

    took_over = wait_for(lambda: region.raw.controller_pid == survivor.pid, 1.0)
    wait_until_us(killed_us + 1_500_000)
    measured = utilisation_since(monitor, device_env, killed_us + 500_000)[survivor.pid]
    survivor.finish()

    assert took_over, f"the survivor did not take the controller lease within 1 s: {survivor.stderr}"
    assert abs(measured - share) <= TOLERANCE_PP, f"after fail-over the slice had {measured}%: {survivor.stderr}"


def test_a_stopped_process_does_not_hold_back_the_rest_of_its_slice(programs, device_env, make_slice):
    """A process of the slice stopped while it waits for launch tokens (a debugger, SIGSTOP, a
    swapped-out worker) keeps being granted its part of every refill; what it does not draw goes
    back to the slice, so the process that still runs gets the whole share, and the stopped one
    has hoarded nothing to burst with when it resumes."""
    load_program, monitor = programs
    share = 40
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    first, second, holder, stopped = two_loads_and_the_lease(load_program, slice_env, region, 4.0)
    wait_until_us(first.start_us + 1_000_000)
    os.kill(stopped.pid, signal.SIGSTOP)
    stopped_us = realtime_us()
    wait_until_us(stopped_us + 1_400_000)
    measured = utilisation_since(monitor, device_env, stopped_us + 400_000)
    os.kill(stopped.pid, signal.SIGCONT)
    resumed_us = realtime_us()
    wait_until_us(resumed_us + 600_000)
    after = utilisation_since(monitor, device_env, resumed_us)
    first.finish()
    second.finish()

    assert measured.get(stopped.pid, 0) == 0, measured
    assert abs(measured[holder] - share) <= TOLERANCE_PP, f"while the other process was stopped: {measured}"
    assert after[first.pid] + after[second.pid] <= share + TOLERANCE_PP, f"in the 600 ms after it resumed: {after}"


def test_a_stalled_controller_is_replaced_and_stands_down_when_it_resumes(programs, device_env, make_slice):
    load_program, monitor = programs
    share = 40
    slice_env, region = make_slice(device_env, sm_share=share, policy="hard")
    first, second, holder, survivor = two_loads_and_the_lease(load_program, slice_env, region, 4.2)
    wait_until_us(first.start_us + 1_000_000)
    os.kill(holder, signal.SIGSTOP)
    stopped_us = realtime_us()
    took_over = wait_for(lambda: region.raw.controller_pid == survivor.pid, 1.0)
    wait_until_us(stopped_us + 1_200_000)
    alone = utilisation_since(monitor, device_env, stopped_us + 400_000).get(survivor.pid)

    os.kill(holder, signal.SIGCONT)
    resumed_us = realtime_us()
    wait_until_us(resumed_us + 1_000_000)
    together = utilisation_since(monitor, device_env, resumed_us + 300_000)
    lease_after_resume = region.raw.controller_pid
    first.finish()
    second.finish()

    assert took_over, "the lease of a stopped controller was not taken over within 1 s"
    assert alone is not None and abs(alone - share) <= TOLERANCE_PP, f"while the holder was stopped: {alone}%"
    assert lease_after_resume == survivor.pid, "the resumed process took its lease back"
    assert abs(together[first.pid] + together[second.pid] - share) <= TOLERANCE_PP, together
