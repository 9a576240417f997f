"""Helpers of the batch tests: notebooks run unattended as a user runs them (``jupyter nbconvert
--execute``, ``papermill``, ``jupyter execute``) with a vGPU kernelspec on the simulated GPU, in a
user's environment of the test's own, and a real vGPU server (``jupyter server``, a separate
process) whose ledger a batch run finds where a server keeps it by default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from support import JupyterProcess

BIN = Path(sys.executable).parent
JUPYTER, PAPERMILL = str(BIN / "jupyter"), str(BIN / "papermill")
TOKEN = "batch-test-token"


class Cells:
    """Cells batch notebooks are made of."""

    # The memory NVML shows the kernel, in MiB.
    NVML_TOTAL = (
        "import pynvml\n"
        "pynvml.nvmlInit()\n"
        "print('nvml total MiB', pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total // 2**20)"
    )
    # Defines allocate(size) over the CUDA driver (ctypes), which returns the call's status.
    CUDA = (
        "import ctypes\n"
        "cuda = ctypes.CDLL('libcuda.so.1')\n"
        "assert cuda.cuInit(0) == 0\n"
        "device, context = ctypes.c_int(), ctypes.c_void_p()\n"
        "cuda.cuDeviceGet(ctypes.byref(device), 0)\n"
        "cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)\n"
        "cuda.cuCtxSetCurrent(context)\n"
        "def allocate(size):\n"
        "    pointer = ctypes.c_uint64()\n"
        "    return cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))"
    )

    @staticmethod
    def allocate(size: int) -> str:
        return f"print('cuMemAlloc_v2 status', allocate({size}))"


@pytest.fixture
def cells() -> type[Cells]:
    return Cells


@pytest.fixture
def notebook(tmp_path):
    """notebook(name, *cells) -> the path of a new notebook with those code cells."""

    def write(name: str, *sources: str) -> Path:
        book = nbformat.v4.new_notebook()
        book.cells = [nbformat.v4.new_code_cell(source) for source in sources]
        book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = tmp_path / name
        nbformat.write(book, path)
        return path

    return write


@pytest.fixture
def outputs():
    """outputs(path) -> the text each cell of a saved notebook printed."""
    return cell_outputs


def cell_outputs(path: Path) -> list[str]:
    """The text each cell of a saved notebook printed (streams joined; errors as their traceback)."""
    texts = []
    for cell in nbformat.read(path, as_version=4).cells:
        parts = []
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                parts.append(output["text"])
            elif output["output_type"] == "error":
                parts.append("\n".join(output["traceback"]))
        texts.append("".join(parts))
    return texts


@pytest.fixture
def user_env(sim_env, tmp_path):
    """A user's environment: the simulated machine named (one 16GiB GPU, the machine's state
    file of the test's own), nothing preloaded or on the library path, Jupyter's runtime, data
    and config folders of the test's own (the shipped kernelspec python3-vgpu stays visible)."""
    env = dict(sim_env)
    env.pop("LD_LIBRARY_PATH")
    # ipykernel forwards what C code writes to fd 2 (libvgpu.so's out-of-memory line) into the
    # cell's output, except in a kernel that sees PYTEST_CURRENT_TEST.
    for name in (
        "PYTEST_CURRENT_TEST",
        "JUPYTER_TOKEN",
        "JUPYTER_VGPU_SERVER_URL",
        "JUPYTER_VGPU_KERNEL_ID",
        "JUPYTER_VGPU_KERNEL_CREDENTIAL",
    ):
        env.pop(name, None)
    env.update(
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    return env


@pytest.fixture
def standalone_regions(user_env) -> Path:
    """The folder where slices of kernels no server started keep their regions."""
    return Path(user_env["JUPYTER_RUNTIME_DIR"]) / "vgpu" / "regions" / "standalone"


@pytest.fixture
def jupyter(user_env):
    """jupyter(*args, timeout=) -> the finished `jupyter ARGS...` in the user's environment."""

    def run(*args: str, timeout: float = 180, env: dict | None = None):
        return subprocess.run(
            [JUPYTER, *args], check=False, env=env or user_env, capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture
def papermill(user_env):
    """papermill(*args) -> the finished `papermill ARGS...` in the user's environment."""

    def run(*args: str):
        return subprocess.run(
            [PAPERMILL, "--no-progress-bar", *args],
            check=False,
            env=user_env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    return run


@pytest.fixture
def nbconvert_command():
    """nbconvert_command(notebook, output, *options, kernel=) -> argv of `jupyter nbconvert
    --execute` as a user types it, with the shipped vGPU kernelspec unless ``kernel`` names another."""

    def command(notebook: Path, output: Path, *options: str, kernel: str = "python3-vgpu") -> list[str]:
        return [
            JUPYTER,
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            f"--ExecutePreprocessor.kernel_name={kernel}",
            "--ExecutePreprocessor.timeout=120",
            "--VGPUProvisioner.simulate=True",
            *options,
            str(notebook),
            "--output",
            str(output),
        ]

    return command


@pytest.fixture
def nbconvert(nbconvert_command, user_env):
    """nbconvert(notebook, output, *options, kernel=) -> the finished nbconvert run."""

    def run(notebook: Path, output: Path, *options: str, kernel: str = "python3-vgpu"):
        command = nbconvert_command(notebook, output, *options, kernel=kernel)
        return subprocess.run(command, check=False, env=user_env, capture_output=True, text=True, timeout=240)

    return run


class Server(JupyterProcess):
    """A vGPU Jupyter server as a user starts it (simulated GPU), its ledger and regions where a
    server keeps them by default, so a batch run finds them the way it finds a user's."""

    def __init__(self, env: dict[str, str], log: Path):
        super().__init__(env, log, TOKEN, "--VGPUApp.simulate=True", f"--ServerApp.root_dir={log.parent}", timeout=90)

    def slices(self) -> dict[str, dict]:
        return {item["kernel_id"]: item for item in self.api("GET", "api/vgpu/slices")}


@pytest.fixture
def start_server(user_env, tmp_path):
    """start_server() -> a running Server in the user's environment; stopped after the test."""
    servers = []

    def start() -> Server:
        server = Server(user_env, tmp_path / "server.log")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(60)


@pytest.fixture
def waiting_notebook(notebook, tmp_path):
    """waiting_notebook(before, after) -> (notebook, waiting, go): a notebook that runs the cells
    ``before``, creates the file ``waiting``, waits until the test creates the file ``go`` (real
    conditions on both sides, not times), then runs the cells ``after``."""

    def make(before: list[str], after: list[str]) -> tuple[Path, Path, Path]:
        waiting, go = tmp_path / "waiting", tmp_path / "go"
        wait = (
            f"import os, time\nopen({str(waiting)!r}, 'w').close()\n"
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)"
        )
        return notebook("waits.ipynb", *before, wait, *after), waiting, go

    return make


@pytest.fixture
def region_files():
    """region_files(folder) -> names of the region files in it."""
    return lambda folder: sorted(path.name for path in Path(folder).glob("*.region"))
