"""Helpers of the simulated GPU's tests: running its probe programs (alone or under a foreign
interposer), NVML snapshots taken by pynvml in a child process (NVML must be found through
LD_LIBRARY_PATH from the first instruction), and the kernel-duration formula the simulator documents."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from support import run_checked

MIB = 1 << 20
GIB = 1 << 30

# What every kernel costs on the simulated device (native/sim/common/sim.h):
#   blocks_per_sm = max(1, min(32, 2048 // threads_per_block))
#   waves         = ceil(blocks / (sms * blocks_per_sm))
#   duration      = waves * block_ns * ceil(threads_per_block / 256)
#   weight        = min(1, blocks / (sms * blocks_per_sm))


def kernel_duration_ns(sms: int, block_ns: int, blocks: int, threads_per_block: int) -> int:
    blocks_per_sm = max(1, min(32, 2048 // threads_per_block))
    waves = -(-blocks // (sms * blocks_per_sm))
    return waves * block_ns * -(-threads_per_block // 256)


def full_wave(sms: int, threads_per_block: int) -> int:
    """Blocks that occupy every SM once: occupancy weight 1, one wave."""
    return sms * max(1, min(32, 2048 // threads_per_block))


def parse_lines(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value
    return values


@dataclass
class Programs:
    probe: Path
    workload: Path
    entry_points: Path


def with_devices(env: dict[str, str], devices: str) -> dict[str, str]:
    changed = dict(env)
    changed["VGPU_SIM_DEVICES"] = devices
    return changed


def run_program(program: Path, env: dict[str, str], *args: str) -> dict[str, str]:
    """Runs a program that prints "key value" lines; its stderr is kept in the result under 'stderr'."""
    result = subprocess.run([str(program), *args], check=False, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{program.name} {' '.join(args)} failed ({result.returncode}): {result.stderr}"
    values = parse_lines(result.stdout)
    values["stderr"] = result.stderr
    return values


def probe(programs: Programs, env: dict[str, str], *args: str) -> dict[str, str]:
    """Runs sim_probe."""
    return run_program(programs.probe, env, *args)


def with_interposer(env: dict[str, str], interposer: Path, log: Path) -> dict[str, str]:
    """`env` with tests/programs/foreign_interposer.c preloaded, reporting into `log`."""
    changed = dict(env)
    changed["LD_PRELOAD"] = str(interposer)
    changed["FOREIGN_INTERPOSER_LOG"] = str(log)
    return changed


@dataclass
class InterposerReport:
    nested: list[tuple[str, str]]  # (outer, inner): a wrapper entered while another ran
    calls: dict[str, int]  # per wrapper, summed over every process that reported
    missing: list[str]  # entry points the driver lacked


def interposer_report(log: Path) -> InterposerReport:
    report = InterposerReport([], {}, [])
    for line in log.read_text().splitlines():
        kind, *fields = line.split()
        if kind == "nested":
            report.nested.append((fields[0], fields[1]))
        elif kind == "calls":
            report.calls[fields[0]] = report.calls.get(fields[0], 0) + int(fields[1])
        elif kind == "missing":
            report.missing.append(fields[0])
    return report


class Workload:
    """A sim_workload process whose output lines a test can wait for."""

    def __init__(self, programs: Programs, env: dict[str, str], *args: str):
        self.process = subprocess.Popen(
            [str(programs.workload), *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: dict[str, str] = {}  # the first line of each key
        self.output: list[tuple[str, str]] = []  # every line, in order

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for(self, key: str, timeout: float = 30) -> str:
        """Reads output until a line starting with `key`; returns the rest of that line."""
        deadline = time.monotonic() + timeout
        while key not in self.lines:
            assert time.monotonic() < deadline, f"no '{key}' line from sim_workload"
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"sim_workload ended before '{key}': {self.process.stderr.read()}")
            self._record(line)
        return self.lines[key]

    def _record(self, line: str) -> None:
        name, _, value = line.strip().partition(" ")
        self.lines.setdefault(name, value)
        self.output.append((name, value))

    def finish(self, timeout: float = 60) -> dict[str, str]:
        """Closes stdin (a holding workload then exits), waits, returns every line it printed."""
        out, err = self.process.communicate(timeout=timeout)
        assert self.process.returncode == 0, err
        for line in out.splitlines():
            self._record(line)
        return self.lines

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


NVML_SNAPSHOT = r"""
import json, sys, time
import pynvml
at, index = float(sys.argv[1]), int(sys.argv[2])
while time.monotonic() < at:
    time.sleep(min(0.05, at - time.monotonic()))
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(index)
memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
try:
    samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
except pynvml.NVMLError_NotFound:
    samples = []
snapshot = {
    "name": pynvml.nvmlDeviceGetName(handle),
    "uuid": pynvml.nvmlDeviceGetUUID(handle),
    "total": memory.total, "used": memory.used, "free": memory.free,
    "processes": {str(p.pid): p.usedGpuMemory for p in processes},
    "sm_util": {str(s.pid): s.smUtil for s in samples},
    "sample_times": [s.timeStamp for s in samples],
    "gpu_util": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
}
pynvml.nvmlShutdown()
print(json.dumps(snapshot))
"""


def nvml_snapshot(env: dict[str, str], at_monotonic: float = 0.0, index: int = 0) -> dict:
    """What pynvml reports for a device, read in a child process; `at_monotonic` (the
    CLOCK_MONOTONIC time, in seconds, the reading is taken at) lets utilisation windows fill."""
    result = run_checked([sys.executable, "-c", NVML_SNAPSHOT, str(at_monotonic), str(index)], env=env, timeout=60)
    return json.loads(result.stdout)


def wait_until(condition, timeout: float, interval: float = 0.05):
    """Polls `condition` until it returns something true; returns that and the time it took."""
    start = time.monotonic()
    while True:
        value = condition()
        if value:
            return value, time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def python_json(env: dict[str, str], code: str):
    """Runs Python code in a child with `env` (NVML must be on LD_LIBRARY_PATH from the start);
    the code prints one JSON document, which is returned."""
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
