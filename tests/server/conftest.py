"""A real Jupyter server (pytest-jupyter) with the jupyter_vgpu extension on the simulated GPU,
and a kernelspec whose kernels start in slices."""

from __future__ import annotations

import pytest
from support import vgpu_server_config, write_vgpu_kernelspec

# The in-process server loads the simulated driver into the test process; it reads its device
# list and state file once, so every server test shares one simulated machine.
SERVER_SIM_DEVICES = (
    "name=Sim Small,memory=8GiB,sms=50,context_memory=0;name=Sim Large,memory=16GiB,sms=100,context_memory=0"
)
KERNEL_NAME = "vgpu-test"


@pytest.fixture(scope="session")
def server_sim_state(tmp_path_factory):
    return str(tmp_path_factory.mktemp("server-sim") / "sim.state")


@pytest.fixture
def jp_server_config(native_libs, tmp_path, server_sim_state, monkeypatch):
    monkeypatch.setenv("VGPU_SIM_STATE", server_sim_state)
    monkeypatch.setenv("VGPU_SIM_DEVICES", SERVER_SIM_DEVICES)
    return vgpu_server_config(tmp_path, simulate=True)


@pytest.fixture
def vgpu_kernelspec(jp_data_dir):
    """A vGPU kernelspec in the test's Jupyter data dir (installed specs are hidden from tests)."""
    write_vgpu_kernelspec(
        jp_data_dir / "kernels" / KERNEL_NAME,
        "Python 3 (GPU slice, test)",
        {"memory": "1GiB", "cores": "50", "policy": "hard"},
    )
    return KERNEL_NAME


@pytest.fixture
def unsized_kernelspec(jp_data_dir):
    """A vGPU kernelspec that sets no size, like the one jupyter-vgpu ships."""
    write_vgpu_kernelspec(jp_data_dir / "kernels" / "vgpu-unsized", "Python 3 (GPU slice, no size)")
    return "vgpu-unsized"
