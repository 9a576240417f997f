"""What the interposer's tests share besides fixtures (those live in conftest.py): constants,
the parsed output of slice_probe, polling, reading the region's slots, and interactive
programs."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import wait_for  # noqa: F401  (re-exported for the interposer tests)

from jupyter_vgpu.holders.region import process_start_time  # noqa: F401

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
MIB = 1 << 20
GIB = 1 << 30
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_FOUND = 500


@dataclass
class ProbeRun:
    """What slice_probe printed: one list of fields per command, in order."""

    returncode: int
    lines: list[list[str]]
    stdout: str
    stderr: str

    def line(self, index: int) -> list[str]:
        return self.lines[index]

    def rc(self, index: int) -> int:
        return int(self.lines[index][1])

    def values(self, index: int) -> list[int]:
        return [int(value) for value in self.lines[index][1:]]


def live_slots(region) -> list:
    """Slots the interposer counts (pid > 0), straight from the shared memory."""
    raw = region.raw
    return [raw.procs[index] for index in range(min(raw.procs_high_water, raw.max_procs)) if raw.procs[index].pid > 0]


def slot_usage(region) -> int:
    """The slice's usage as the interposer's cap check sums it."""
    return sum(slot.allocated + slot.driver_reserved for slot in live_slots(region))


class Interactive:
    """A program that prints lines and waits on stdin at points a test chooses."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr_path: Path | None = None):
        # closed in close(), after the program has ended
        self._stderr_file = open(stderr_path, "w") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr_file, text=True
        )

    def read_until(self, word: str, timeout: float = 60) -> list[list[str]]:
        """Lines up to and including the first whose first field is `word`."""
        lines = []
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                pytest.fail(f"{self.process.args[0]} did not print {word!r} (got {lines})")
            line = self.process.stdout.readline()
            if not line:
                pytest.fail(f"{self.process.args[0]} ended before printing {word!r} (got {lines})")
            fields = line.split()
            lines.append(fields)
            if fields and fields[0] == word:
                return lines

    def send(self, text: str = "go") -> None:
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = 30) -> int:
        try:
            if self.process.stdin and not self.process.stdin.closed:
                self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self._stderr_file is not subprocess.DEVNULL:
                self._stderr_file.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.finish()


def in_pid_namespace(host_proc: Path) -> list[str]:
    """The command prefix that runs a program as a container does: in a PID namespace of its own
    with a /proc of its own, the host's /proc bind-mounted at `host_proc` (an empty directory)
    for the simulated driver (VGPU_SIM_PROC), which then reports host pids as a real one does."""
    return [
        "unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount",
        "sh", "-c", 'mount --bind /proc "$0" && mount -t proc proc /proc && exec "$@"', str(host_proc),
    ]  # fmt: skip
