"""The simulated machine's description: VGPU_SIM_DEVICES, CUDA_VISIBLE_DEVICES, the state file."""

from __future__ import annotations

import re

import pytest
from sim_helpers import GIB, MIB, Workload, probe, with_devices

NVML_ERROR_DRIVER_NOT_LOADED = "9"
CUDA_ERROR_NO_DEVICE = "100"
THREE = ";".join(
    f"name=GPU {i},uuid=GPU-{i}{i}{i}{i}aaaa-0000-4000-8000-00000000000{i},memory={i + 1}GiB,sms={10 * (i + 1)}"
    for i in range(3)
)


def test_default_device_when_no_spec_is_given(programs, env):
    del env["VGPU_SIM_DEVICES"]
    seen = probe(programs, env, "init")
    assert seen["cuInit"] == "0" and seen["count"] == "1"
    assert seen["name_0"] == "jupyter-vgpu simulated GPU"
    assert seen["memory_0"] == str(16 * GIB)
    assert seen["sms_0"] == "100"
    assert seen["uuid_0"] == "GPU-5eed0000-0000-4000-8000-000000000000"
    assert seen["nvml_uuid_0"] == seen["uuid_0"]


def test_spec_sets_every_key_with_the_documented_units(programs, env):
    devices = (
        " name = Lab GPU , memory=512MiB, sms=8, context_memory=64MiB, block_ns=123 ;"
        "memory=4G;memory=4096,uuid=GPU-ABCDEF01-2345-6789-abcd-ef0123456789;"
    )
    seen = probe(programs, with_devices(env, devices), "init")
    assert seen["count"] == "3" and seen["nvml_count"] == "3"
    assert seen["name_0"] == "Lab GPU"
    assert [seen[f"memory_{i}"] for i in range(3)] == [str(512 * MIB), str(4 * GIB), str(4 * GIB)]
    assert seen["sms_0"] == "8" and seen["sms_1"] == "100"
    assert seen["name_1"] == "jupyter-vgpu simulated GPU"
    assert re.fullmatch(r"GPU-5eed0000-0000-4000-8000-000000000001", seen["uuid_1"])
    # UUIDs are normalised to lower case, as NVML prints them, and CUDA's bytes agree.
    assert seen["uuid_2"] == seen["nvml_uuid_2"] == "GPU-abcdef01-2345-6789-abcd-ef0123456789"


def test_device_attributes_are_those_of_compute_capability_9_0(programs, env):
    seen = probe(programs, env, "init")
    assert seen["cc_0"] == "9.0"
    assert seen["warp_0"] == "32"
    assert seen["threads_per_block_0"] == "1024"
    assert seen["threads_per_sm_0"] == "2048"
    assert seen["blocks_per_sm_0"] == "32"
    assert seen["bus_0"] == seen["nvml_bus_0"]


MALFORMED = {
    "memory=lots": "memory 'lots'",
    "memory=16GB": "memory '16GB'",
    "memory=-1": "memory '-1'",
    "sms=0": "sms '0'",
    "sms=2.5": "sms '2.5'",
    "color=red": "unknown key 'color'",
    "memory=1GiB,memory=2GiB": "given twice",
    "uuid=GPU-123": "uuid 'GPU-123'",
    "name": "'name' is not key=value",
    "memory=1GiB,context_memory=1GiB": "context_memory must be smaller",
    "block_ns=0": "block_ns '0'",
    ";".join(["sms=1"] * 17): "more than 16 devices",
    "uuid=GPU-11111111-1111-1111-1111-111111111111;uuid=GPU-11111111-1111-1111-1111-111111111111": "same uuid",
    " ; ": "no device",
}


@pytest.mark.parametrize("devices", sorted(MALFORMED))
def test_malformed_spec_is_refused_by_cuda_and_nvml(programs, env, devices):
    seen = probe(programs, with_devices(env, devices), "init")
    assert seen["cuInit"] == CUDA_ERROR_NO_DEVICE
    assert seen["nvmlInit"] == NVML_ERROR_DRIVER_NOT_LOADED
    errors = seen["stderr"].splitlines()
    assert len(errors) == 2  # one line from each library
    for line in errors:
        assert "VGPU_SIM_DEVICES is malformed" in line
        assert MALFORMED[devices] in line
        assert "accepted:" in line


def init_with_visible_devices(programs, env: dict[str, str], visible: str) -> dict[str, str]:
    """What the probe's init sees of THREE devices with CUDA_VISIBLE_DEVICES=visible."""
    env = with_devices(env, THREE)
    env["CUDA_VISIBLE_DEVICES"] = visible
    return probe(programs, env, "init")


def test_cuda_visible_devices_selects_devices_by_index(programs, env):
    seen = init_with_visible_devices(programs, env, "2,0")
    assert seen["count"] == "2"
    assert (seen["name_0"], seen["name_1"]) == ("GPU 2", "GPU 0")
    assert seen["memory_0"] == str(3 * GIB)
    assert seen["nvml_count"] == "3"  # NVML shows every device, as the real one does


def test_cuda_visible_devices_selects_devices_by_uuid_or_unique_prefix(programs, env):
    seen = init_with_visible_devices(programs, env, "GPU-1111aaaa-0000-4000-8000-000000000001,GPU-0000")
    assert seen["count"] == "2"
    assert (seen["name_0"], seen["name_1"]) == ("GPU 1", "GPU 0")
    assert seen["uuid_0"] == "GPU-1111aaaa-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    "visible, names",
    [
        ("1,7,0", ["GPU 1"]),  # out of range: the list ends there
        ("2,2,1", ["GPU 2"]),  # repeated
        ("0,GPU-,1", ["GPU 0"]),  # a prefix that matches several devices
        ("1,banana,0", ["GPU 1"]),
    ],
)
def test_cuda_visible_devices_stops_at_the_first_invalid_entry(programs, env, visible, names):
    seen = init_with_visible_devices(programs, env, visible)
    assert [seen[f"name_{i}"] for i in range(int(seen["count"]))] == names


@pytest.mark.parametrize("visible", ["", "-1"])
def test_cuda_visible_devices_can_hide_every_device(programs, env, visible):
    env["CUDA_VISIBLE_DEVICES"] = visible
    seen = probe(programs, env, "init")
    assert seen["cuInit"] == CUDA_ERROR_NO_DEVICE
    assert seen["nvml_count"] == "1"
    assert seen["stderr"] == ""


def test_default_state_file_is_per_user_and_keyed_by_the_spec(programs, env, tmp_path):
    del env["VGPU_SIM_STATE"]
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    probe(programs, env, "init")
    probe(programs, with_devices(env, "memory=1GiB"), "init")
    probe(programs, env, "init")
    files = sorted(path.name for path in tmp_path.glob("jupyter-vgpu-sim-*.state"))
    assert len(files) == 2, files
    assert all(re.fullmatch(r"jupyter-vgpu-sim-v\d+-[0-9a-f]{16}\.state", name) for name in files)


def test_state_file_of_another_spec_starts_over_when_nobody_uses_it(programs, env):
    probe(programs, with_devices(env, "memory=1GiB"), "init")
    seen = probe(programs, with_devices(env, "memory=2GiB;memory=3GiB"), "init")
    assert seen["count"] == "2" and seen["memory_1"] == str(3 * GIB)
    assert seen["stderr"] == ""


def test_state_file_of_another_spec_is_refused_while_a_process_uses_it(programs, env):
    holder = Workload(programs, with_devices(env, "memory=1GiB"), "hold", str(MIB))
    try:
        holder.wait_for("ready")
        seen = probe(programs, with_devices(env, "memory=2GiB"), "init")
        assert seen["cuInit"] == CUDA_ERROR_NO_DEVICE
        assert "in use by running processes with another VGPU_SIM_DEVICES" in seen["stderr"]
    finally:
        holder.kill()
