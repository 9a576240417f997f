"""A real Jupyter server (pytest-jupyter) with the jupyter_vgpu extension on the simulated GPU,
and a kernelspec whose kernels start in slices."""

from __future__ import annotations

import pytest
from support import vgpu_server_config, write_vgpu_kernelspec

KERNEL_NAME = "vgpu-test"


@pytest.fixture
def jp_server_config(in_process_sim, tmp_path):
    """The server runs on the session's one in-process simulated machine (tests/conftest.py's
    IN_PROCESS_SIM_DEVICES: GPU 0 "Sim Small", 8GiB and 50 SMs; GPU 1 "Sim Large", 16GiB, 100)."""
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
