"""Fixtures of the interposer's tests: the C probe of tests/programs run in a slice, small
shared libraries built for a test (preloaded wrappers, stand-in drivers), interactive programs.
Plain helpers live in slice_helpers.py."""

from __future__ import annotations

import subprocess

import pytest
from slice_helpers import Interactive, ProbeRun


@pytest.fixture(scope="session")
def probe(compile_c):
    """probe(env, *commands, path="direct") -> ProbeRun of tests/programs/slice_probe.c."""
    executable = compile_c("slice_probe")

    def run(env: dict[str, str], *commands: str, path: str = "direct", timeout: float = 60) -> ProbeRun:
        result = subprocess.run(
            [str(executable), f"--path={path}", *commands],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        lines = [line.split() for line in result.stdout.splitlines()]
        return ProbeRun(result.returncode, lines, result.stdout, result.stderr)

    run.executable = executable
    return run


@pytest.fixture(scope="session")
def build_shared(host_machine):
    """build_shared(name, filename) -> Path of tests/programs/<name>.c built as a shared library
    called `filename` (its soname too), in a directory of its own."""
    return host_machine.build_shared


@pytest.fixture
def interactive():
    """interactive(argv, env, stderr_path=None) -> Interactive; all are ended after the test."""
    started: list[Interactive] = []

    def start(argv, env, stderr_path=None) -> Interactive:
        program = Interactive([str(arg) for arg in argv], env, stderr_path)
        started.append(program)
        return program

    yield start
    for program in started:
        program.kill()
