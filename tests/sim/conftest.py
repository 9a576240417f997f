"""Fixtures of the simulated GPU's tests (helpers live in sim_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_helpers import Programs, Workload


@pytest.fixture(scope="session")
def programs(compile_c) -> Programs:
    return Programs(
        probe=compile_c("sim_probe"), workload=compile_c("sim_workload"), entry_points=compile_c("sim_entry_points")
    )


@pytest.fixture(scope="session")
def foreign_interposer(host_machine) -> Path:
    """tests/programs/foreign_interposer.c: an interposer that is not ours, to preload
    (sim_helpers.with_interposer)."""
    return host_machine.build_shared("foreign_interposer", "libforeign_interposer.so")


@pytest.fixture
def env(sim_env) -> dict[str, str]:
    """The shared sim_env: a private state file, a 16 GiB 100-SM device, no context memory."""
    return dict(sim_env)


@pytest.fixture
def workloads(programs):
    """start(env, *args) -> a running sim_workload; any still running at the end is killed."""
    started: list[Workload] = []

    def start(env: dict[str, str], *args: str) -> Workload:
        workload = Workload(programs, env, *args)
        started.append(workload)
        return workload

    yield start
    for workload in started:
        workload.kill()
