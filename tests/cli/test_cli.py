"""`jupyter vgpu run | devices | doctor | kernelspec install`, driven as a user types them, on the
simulated GPU (16GiB, tests/conftest.py), and what every command shares: usage errors, --version."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TWO_DEVICES = (
    "name=Sim Alpha,memory=8GiB,sms=50;name=Sim Beta,memory=24GiB,sms=132,uuid=GPU-bbbbbbbb-0000-4000-8000-000000000001"
)
SEE_MEMORY = (
    "import pynvml as n; n.nvmlInit(); "
    "m = n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)); print(m.total, m.free)"
)


@pytest.mark.parametrize(
    "flags, accepted",
    [
        (["--memory", "lots"], "512MiB, 4GiB, 4G or a bare number of MiB"),
        (["--memory", "0"], "512MiB, 4GiB, 4G or a bare number of MiB"),
        (["--cores", "130"], "whole percentage from 1 to 100"),
        (["--policy", "soft"], "'hard' (never above the share) or 'burst'"),
    ],
)
def test_run_refuses_bad_values_before_starting_anything(vgpu, tmp_path, flags, accepted):
    marker = tmp_path / "started"
    result = vgpu("run", "--simulate", *flags, "--", "touch", str(marker))
    assert result.returncode == 2
    assert accepted in result.stderr
    assert not marker.exists()


def test_run_without_a_command_says_how(vgpu):
    result = vgpu("run", "--simulate", "--memory", "1GiB")
    assert result.returncode == 2
    assert "-- COMMAND" in result.stderr


def test_run_returns_the_commands_exit_status(vgpu):
    result = vgpu("run", "--simulate", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert result.returncode == 7


def test_run_reports_a_command_that_does_not_exist(vgpu):
    result = vgpu("run", "--simulate", "--", "no-such-program-vgpu")
    assert result.returncode == 1
    assert "no-such-program-vgpu" in result.stderr


def test_program_in_a_run_slice_sees_its_cap(vgpu):
    result = vgpu("run", "--simulate", "--memory", "1536MiB", "--", sys.executable, "-c", SEE_MEMORY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(1536 << 20), str(1536 << 20)]


def test_child_processes_of_a_run_are_in_the_same_slice(vgpu):
    nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SEE_MEMORY!r}], check=True)"
    result = vgpu("run", "--simulate", "--memory", "2GiB", "--", sys.executable, "-c", nested)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(2 << 30), str(2 << 30)]


def test_devices_lists_the_simulated_devices(vgpu, cli_env):
    cli_env["VGPU_SIM_DEVICES"] = TWO_DEVICES
    result = vgpu("devices", "--simulate")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()[1:]
    assert len(rows) == 2
    assert "Sim Alpha" in rows[0] and "8GiB" in rows[0] and rows[0].split()[-1] == "50"
    assert (
        "Sim Beta" in rows[1] and "GPU-bbbbbbbb-0000-4000-8000-000000000001" in rows[1] and rows[1].split()[-1] == "132"
    )


def test_run_places_the_slice_on_the_device_asked_for(vgpu, cli_env):
    cli_env["VGPU_SIM_DEVICES"] = TWO_DEVICES
    code = (
        "import ctypes; c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); n = ctypes.c_int(); "
        "c.cuDeviceGetCount(ctypes.byref(n)); name = ctypes.create_string_buffer(64); "
        "c.cuDeviceGetName(name, 64, 0); print(n.value, name.value.decode())"
    )
    for selector in ("1", "GPU-bbbbbbbb"):
        result = vgpu("run", "--simulate", "--device", selector, "--", sys.executable, "-c", code)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "1 Sim Beta"


def test_run_refuses_an_unknown_device(vgpu):
    result = vgpu("run", "--simulate", "--device", "7", "--", "true")
    assert result.returncode == 2
    assert "matches no single GPU" in result.stderr and "0 (GPU-" in result.stderr


def test_doctor_passes_on_the_simulated_gpu(vgpu):
    result = vgpu("doctor", "--simulate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ok] slice: a process in a 256MiB slice sees a 256MiB GPU" in result.stdout
    assert "[ok] process ids: NVML lists a process of the slice under its own pid" in result.stdout
    assert "[ok] file modes: region folders and files private, ledger not writable by others" in result.stdout
    assert "[note] server ledger: none at " in result.stdout  # no server ever ran here
    assert "no problems found" in result.stdout


def test_doctor_names_a_pid_namespace_that_hides_the_slices_processes_from_nvml(vgpu):
    """In a container with its own PID namespace NVML still reports the host's pids (the
    simulated driver does the same where the host's /proc is visible): doctor says what that
    changes and how to avoid it, without calling it a problem (slices find the pids)."""
    namespace = ("unshare", "--user", "--map-root-user", "--pid", "--fork")
    result = vgpu("doctor", "--simulate", prefix=namespace)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ok] slice: a process in a 256MiB slice sees a 256MiB GPU" in result.stdout
    note = next(line for line in result.stdout.splitlines() if line.startswith("[note] process ids"))
    assert "not under the probe's pid" in note and "PID namespace" in note and "hostPID: true" in note
    assert "[ok] process ids" not in result.stdout


def test_kernelspec_install_writes_a_sliced_kernelspec(vgpu, cli_env):
    result = vgpu(
        "kernelspec", "install", "--memory", "8G", "--cores", "25", "--policy", "burst", "--name", "big-gpu", "--user"
    )
    assert result.returncode == 0, result.stderr
    spec = json.loads((Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "big-gpu" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "vgpu-provisioner",
        "config": {"memory": "8GiB", "cores": "25", "policy": "burst"},
    }
    assert spec["display_name"] == "Python 3 (GPU 8GiB, 25% SM)"
    # The shipped kernelspec's logos: JupyterLab's launcher shows them instead of a letter.
    installed = sorted(path.name for path in (Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "big-gpu").iterdir())
    assert installed == ["kernel.json", "logo-32x32.png", "logo-64x64.png", "logo-svg.svg"]


def test_kernelspec_install_for_batch_runs_names_a_device_and_the_simulated_gpu(vgpu, cli_env):
    # papermill -k NAME takes no provisioner options: such a kernelspec carries them all.
    result = vgpu(
        "kernelspec", "install", "--memory", "512MiB", "--device", "1", "--simulate", "--name", "batch", "--user"
    )
    assert result.returncode == 0, result.stderr
    spec = json.loads((Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "batch" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"] == {
        "memory": "512MiB",
        "cores": "100",
        "policy": "hard",
        "device": "1",
        "simulate": True,
    }


@pytest.mark.parametrize(
    "flags, accepted",
    [
        (["--memory", "huge"], "512MiB, 4GiB"),
        (["--cores", "0"], "1 to 100"),
        (["--name", "a b"], "letters, digits"),
        (["--device", "banana"], "--device: device 'banana' is not a GPU index (0, 1, ...) or UUID (GPU-...)"),
    ],
)
def test_kernelspec_install_refuses_bad_values(vgpu, cli_env, flags, accepted):
    result = vgpu("kernelspec", "install", "--user", *flags)
    assert result.returncode == 2 and accepted in result.stderr
    assert not (Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels").exists()


def test_run_refuses_a_cap_larger_than_the_gpu_before_starting_anything(vgpu, tmp_path):
    marker = tmp_path / "started"
    result = vgpu("run", "--simulate", "--memory", "32GiB", "--", "touch", str(marker))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "jupyter vgpu run: a memory cap of 32GiB is more than GPU 0 has (16GiB); "
        "ask for at most that, or leave --memory out for the whole GPU"
    )
    assert not marker.exists()


# Values each parser must refuse in words: a digit int() cannot read, and a size too large for a float.
UNREADABLE_VALUES = [("--cores", "\N{SUPERSCRIPT TWO}"), ("--memory", "9" * 400)]
COMMANDS = {
    "run": ("run", "--simulate"),
    "resize": ("resize", "1c2e"),
    "kernelspec install": ("kernelspec", "install", "--user"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("option, value", UNREADABLE_VALUES, ids=["superscript-two", "400-nines"])
def test_unreadable_values_get_a_one_line_usage_error_and_exit_2(vgpu, cli_env, tmp_path, command, option, value):
    marker = tmp_path / "started"
    program = ["--", "touch", str(marker)] if command == "run" else []
    result = vgpu(*COMMANDS[command], option, value, *program)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"jupyter vgpu {command}: ") and "Traceback" not in line
    assert not marker.exists() and not (Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels").exists()


@pytest.mark.parametrize(
    "command", [(), ("run",), ("status",), ("kernelspec",), ("kernelspec", "install"), ("config",)]
)
def test_version_is_the_packages_at_every_level(vgpu, command):
    from jupyter_vgpu import __version__

    result = vgpu(*command, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __version__


def test_kernelspec_without_a_subcommand_says_how(vgpu):
    result = vgpu("kernelspec")
    assert result.returncode == 2
    assert "jupyter vgpu kernelspec install" in result.stderr


def test_version_prints_the_package_version(vgpu):
    from jupyter_vgpu import __version__

    result = vgpu("--version")
    assert (result.returncode, result.stdout.strip()) == (0, __version__)
