"""The simulated driver's checkpoint API, driven as a real driver's is: a target process holding
device memory, and controllers (other processes) that lock, checkpoint, restore and unlock it by
pid (tests/programs/checkpoint_probe.c plays both sides)."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

import pytest
from sim_helpers import GIB, MIB, nvml_snapshot, parse_lines, python_json, wait_until
from support import CheckpointTarget

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED, ILLEGAL_STATE, NOT_SUPPORTED, TIMEOUT = (
    0,
    1,
    2,
    3,
    401,
    801,
    909,
)
RUNNING, LOCKED, CHECKPOINTED, FAILED = "0", "1", "2", "3"
FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]


@pytest.fixture(scope="session")
def checkpoint_probe(compile_c) -> Path:
    return compile_c("checkpoint_probe")


def control(probe: Path, env: dict[str, str], operation: str, pid: int, *extra: str, init: bool = True) -> dict:
    """One checkpoint call from a fresh controller process: its "result" and the "state" after."""
    command = [str(probe), *([] if init else ["--no-init"]), "control", operation, str(pid), *extra]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert finished.returncode == 0, finished.stderr
    values = parse_lines(finished.stdout)
    answer = {"result": int(values["result"]), "state": values["state"]}
    return {**answer, "tid": values["tid"]} if "tid" in values else answer


def suspend(probe: Path, env: dict[str, str], pid: int) -> None:
    assert control(probe, env, "lock", pid, "10000")["result"] == SUCCESS
    assert control(probe, env, "checkpoint", pid) == {"result": SUCCESS, "state": CHECKPOINTED}


def resume(probe: Path, env: dict[str, str], pid: int) -> None:
    assert control(probe, env, "restore", pid) == {"result": SUCCESS, "state": LOCKED}
    assert control(probe, env, "unlock", pid) == {"result": SUCCESS, "state": RUNNING}


def test_checkpoint_frees_the_device_and_restore_brings_the_pattern_back(
    env, checkpoint_targets, workloads, checkpoint_probe
):
    target = checkpoint_targets(env, "64M")
    held = nvml_snapshot(env)
    assert held["processes"] == {str(target.pid): 64 * MIB}

    assert control(checkpoint_probe, env, "lock", target.pid, "5000") == {"result": SUCCESS, "state": LOCKED}
    assert control(checkpoint_probe, env, "checkpoint", target.pid) == {"result": SUCCESS, "state": CHECKPOINTED}
    suspended = nvml_snapshot(env)
    assert suspended["processes"] == {}
    assert suspended["used"] == 0

    # The whole device is another process's while the target is checkpointed.
    other = workloads(env, "hold", str(16 * GIB))
    assert other.wait_for("alloc") == f"{16 * GIB} 0"
    other.finish()

    resume(checkpoint_probe, env, target.pid)
    assert target.ask("verify", "intact") == "1"
    assert nvml_snapshot(env)["processes"] == {str(target.pid): 64 * MIB}


def test_calls_in_the_wrong_state_are_illegal(env, checkpoint_targets, checkpoint_probe):
    target = checkpoint_targets(env, "1M")
    for operation in ("checkpoint", "restore", "unlock"):
        assert control(checkpoint_probe, env, operation, target.pid) == {"result": ILLEGAL_STATE, "state": RUNNING}
    assert control(checkpoint_probe, env, "lock", target.pid)["result"] == SUCCESS
    for operation in ("lock", "restore"):
        assert control(checkpoint_probe, env, operation, target.pid) == {"result": ILLEGAL_STATE, "state": LOCKED}
    assert control(checkpoint_probe, env, "checkpoint", target.pid)["result"] == SUCCESS
    for operation in ("lock", "checkpoint", "unlock"):
        answer = control(checkpoint_probe, env, operation, target.pid)
        assert answer == {"result": ILLEGAL_STATE, "state": CHECKPOINTED}
    resume(checkpoint_probe, env, target.pid)
    assert target.ask("verify", "intact") == "1"


def test_a_process_without_cuda_is_not_a_checkpoint_target(env, checkpoint_probe):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        answer = control(checkpoint_probe, env, "state", sleeper.pid)
        assert answer["result"] == INVALID_VALUE and answer["state"] == "none"
        assert control(checkpoint_probe, env, "lock", sleeper.pid)["result"] == INVALID_VALUE
    finally:
        sleeper.kill()
        sleeper.wait()


def test_lock_that_times_out_leaves_a_busy_process_running(env, checkpoint_targets, checkpoint_probe):
    target = checkpoint_targets(env, "1M")
    assert target.ask("busy 20000", "queued") == ""
    started = time.monotonic()
    answer = control(checkpoint_probe, env, "lock", target.pid, "200")
    assert answer == {"result": TIMEOUT, "state": RUNNING}
    assert time.monotonic() - started < 20  # it gave up at its timeout, not when the work ended
    # Its calls go through: the gate is open again.
    assert target.ask("alloc 1M", "alloc") == str(SUCCESS)


def test_restore_without_room_fails_and_leaves_the_process_checkpointed(
    env, checkpoint_targets, workloads, checkpoint_probe
):
    target = checkpoint_targets(env, "64M")
    suspend(checkpoint_probe, env, target.pid)
    other = workloads(env, "hold", str(16 * GIB))
    assert other.wait_for("alloc") == f"{16 * GIB} 0"

    assert control(checkpoint_probe, env, "restore", target.pid) == {"result": OUT_OF_MEMORY, "state": CHECKPOINTED}
    assert nvml_snapshot(env)["processes"] == {str(other.pid): 16 * GIB}

    other.finish()
    resume(checkpoint_probe, env, target.pid)
    assert target.ask("verify", "intact") == "1"


def test_failed_restore_mode_leaves_the_process_failed_for_good(env, checkpoint_targets, workloads, checkpoint_probe):
    target = checkpoint_targets({**env, "VGPU_SIM_RESTORE_OOM_FAILS": "1"}, "64M")
    suspend(checkpoint_probe, env, target.pid)
    other = workloads(env, "hold", str(16 * GIB))
    other.wait_for("alloc")
    assert control(checkpoint_probe, env, "restore", target.pid) == {"result": OUT_OF_MEMORY, "state": FAILED}
    other.finish()
    for operation in ("restore", "unlock", "lock"):
        assert control(checkpoint_probe, env, operation, target.pid) == {"result": ILLEGAL_STATE, "state": FAILED}


def test_a_call_from_a_background_thread_blocks_until_the_process_is_unlocked(
    env, checkpoint_targets, checkpoint_probe
):
    target = checkpoint_targets(env, "1M")
    suspend(checkpoint_probe, env, target.pid)
    tid = target.ask("call", "call-thread")
    syscall = Path(f"/proc/{target.pid}/task/{tid}/syscall")
    wait_until(lambda: syscall.read_text().split()[0] == str(FUTEX), timeout=30)
    # The program's own threads still run; the CUDA call has not returned.
    assert target.ask("ping", "pong") == ""
    assert "call-returned" not in target.lines
    resume(checkpoint_probe, env, target.pid)
    assert target.wait_for("call-returned") == str(SUCCESS)


def test_restore_needs_a_controller_that_initialised_the_driver(env, checkpoint_targets, checkpoint_probe):
    target = checkpoint_targets(env, "1M")
    assert control(checkpoint_probe, env, "lock", target.pid, init=False)["result"] == SUCCESS
    assert control(checkpoint_probe, env, "checkpoint", target.pid, init=False)["result"] == SUCCESS
    answer = control(checkpoint_probe, env, "restore", target.pid, init=False)
    assert answer == {"result": NOT_INITIALIZED, "state": CHECKPOINTED}
    resume(checkpoint_probe, env, target.pid)


def test_the_restore_thread_is_a_thread_of_the_target(env, checkpoint_targets, checkpoint_probe):
    target = checkpoint_targets(env, "1M")
    answer = control(checkpoint_probe, env, "tid", target.pid)
    assert answer["result"] == SUCCESS
    assert Path(f"/proc/{target.pid}/task/{answer['tid']}").is_dir()
    assert int(answer["tid"]) != target.pid


def test_copies_take_the_configured_bandwidth(env, checkpoint_targets, checkpoint_probe):
    """A lower bound, which the simulator guarantees: 64 MiB at 256 MiB/s take at least 0.25 s."""
    target = checkpoint_targets({**env, "VGPU_SIM_CHECKPOINT_BANDWIDTH": str(256 * MIB)}, "64M")
    assert control(checkpoint_probe, env, "lock", target.pid)["result"] == SUCCESS
    started = time.monotonic()
    assert control(checkpoint_probe, env, "checkpoint", target.pid)["result"] == SUCCESS
    assert time.monotonic() - started >= 0.25
    started = time.monotonic()
    assert control(checkpoint_probe, env, "restore", target.pid)["result"] == SUCCESS
    assert time.monotonic() - started >= 0.25


ENTRY_POINTS = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
names = ["cuCheckpointProcess" + n for n in ("GetState", "GetRestoreThreadId", "Lock", "Checkpoint", "Restore", "Unlock")]
answers = {}
for version in (12000, 12080):
    for name in names:
        pointer = ctypes.c_void_p()
        result = cuda.cuGetProcAddress(name.encode(), ctypes.byref(pointer), version, ctypes.c_uint64(0))
        answers[f"{name} {version}"] = [result, pointer.value == ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value]
print(json.dumps(answers))
"""


def test_cuGetProcAddress_serves_the_checkpoint_entry_points_from_cuda_12_8(env):
    answers = python_json(env, ENTRY_POINTS)
    for key, (result, same) in answers.items():
        if key.endswith("12080"):
            assert (result, same) == (SUCCESS, True), key
        else:
            assert result == 500, key  # CUDA_ERROR_NOT_FOUND: too new for a CUDA 12.0 caller


def test_the_api_answers_on_x86_64_only(machine, env):
    """The driver answered "not supported" on aarch64; the simulated one built for aarch64 does too."""
    probe = machine.compile("checkpoint_probe")
    machine_env = machine.environment(env)
    target = CheckpointTarget(probe, machine_env, "1M", launcher=tuple(machine.command(probe)[:-1]))
    try:
        command = machine.command(probe, "control", "lock", str(target.pid))
        finished = subprocess.run(command, env=machine_env, capture_output=True, text=True, timeout=120, check=True)
        answer = parse_lines(finished.stdout)
        if machine.name == "host":
            assert (answer["result"], answer["state"]) == (str(SUCCESS), LOCKED)
            assert control(probe, machine_env, "unlock", target.pid) == {"result": SUCCESS, "state": RUNNING}
        else:
            assert (answer["result"], answer["state"]) == (str(NOT_SUPPORTED), "none")
        assert target.ask("alloc 1M", "alloc") == str(SUCCESS)
    finally:
        target.kill()
