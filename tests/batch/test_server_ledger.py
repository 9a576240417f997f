"""A batch run on a machine where a vGPU server runs: its kernel's slice is admitted to the
server's ledger (found where a server keeps it by default), so it never over-commits what the
server's kernels hold; the server lists it, counts it, can resize it, and a server killed and
started again leaves it alone while the batch run goes on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import wait_for

from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.holders.region import process_start_time
from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.manager import BATCH_KEY, SliceManager
from jupyter_vgpu.model import DEFAULT_LIMITS, Device, SliceLimits

GIB = 1 << 30
LEDGER_NOTE = "  note    counted in the vGPU server's ledger {}, beside the server's slices"


@pytest.fixture
def ledger_path(user_env) -> Path:
    return Path(user_env["JUPYTER_RUNTIME_DIR"]) / "vgpu" / "ledger.sqlite"


@pytest.fixture
def background_nbconvert(nbconvert_command, user_env, tmp_path):
    """background_nbconvert(notebook, output, *options) -> a running nbconvert (Popen), its
    stderr in tmp_path; killed (by its pid) if the test leaves it running."""
    runs = []

    def start(notebook: Path, output: Path, *options: str) -> subprocess.Popen:
        with open(tmp_path / f"nbconvert-{len(runs)}.err", "w") as stderr:  # the child keeps its own descriptor
            run = subprocess.Popen(
                nbconvert_command(notebook, output, *options), env=user_env, stdout=subprocess.DEVNULL, stderr=stderr
            )
        run.stderr_path = Path(stderr.name)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.poll() is None:
            run.kill()
            run.wait(30)


def without_unused_note(printed: str) -> list[str]:
    """%vgpu's lines, less the line that says what `unused` means (there while no process of the
    kernel has used the GPU yet, which a batch kernel's first cells may not have)."""
    return [line for line in printed.splitlines() if not line.startswith("  state   unused:")]


def batch_slice(server, known: set[str]) -> dict | None:
    """The one slice the server lists beside ``known``, if the server reads its region."""
    others = [item for kernel_id, item in server.slices().items() if kernel_id not in known]
    return others[0] if len(others) == 1 and others[0]["state"] in ("unused", "running") else None


def test_a_batch_run_asking_for_more_than_a_servers_kernels_leave_is_refused(
    start_server, nbconvert, notebook, cells, outputs, tmp_path, ledger_path, standalone_regions, region_files
):
    server = start_server()
    held = server.api("POST", "api/vgpu/kernels", {"name": "python3-vgpu", "memory": "12GiB", "cores": 50})["kernel"][
        "id"
    ]
    source = notebook("train.ipynb", cells.NVML_TOTAL)
    run = nbconvert(source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=6GiB", "--VGPUProvisioner.cores=50")
    assert run.returncode != 0
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"jupyter-vgpu: this kernel's GPU slice (memory cap 6GiB, SM share 50 percent, policy burst) does not fit "
            f"beside the slices held in the vGPU ledger {ledger_path} (the kernels of a vGPU server on this machine, and "
            "other batch runs): no device has 6GiB of GPU memory free: GPU 0 has 4GiB free; ask for at most 4GiB, or "
            "stop a kernel. Start the run with a smaller slice (--VGPUProvisioner.memory=SIZE or "
            "--VGPUProvisioner.cores=PCT, or a kernelspec made with `jupyter vgpu kernelspec install`), or stop a kernel "
            "that holds one (`jupyter vgpu status` lists the server's)"
        )
    )
    assert not (tmp_path / "done.ipynb").exists()
    assert list(server.slices()) == [held]
    assert region_files(standalone_regions) == []
    # Said outright, the run may go without the ledger (and over-commit, as the option says).
    run = nbconvert(source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=6GiB", "--VGPUProvisioner.ledger=none")
    assert run.returncode == 0, run.stderr
    assert outputs(tmp_path / "done.ipynb") == ["nvml total MiB 6144\n"]


def test_readmes_batch_example_beside_a_server_kernel_takes_a_notebooks_default_as_run_does(
    start_server, nbconvert, notebook, cells, outputs, tmp_path, ledger_path
):
    """README's `jupyter nbconvert --execute ... --VGPUProvisioner.memory=3GiB nb.ipynb` beside a
    server kernel of the default size: what the run leaves out is a notebook's default (20 %,
    burst), as for `jupyter vgpu run`, not all the SMs as a hard share, which no server kernel
    leaves room for (issue 27 #1)."""
    server = start_server()
    server.api("POST", "api/vgpu/kernels", {"name": "python3-vgpu"})
    source = notebook("nb.ipynb", cells.NVML_TOTAL, "%vgpu")
    run = nbconvert(source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=3GiB")
    assert run.returncode == 0, run.stderr
    printed = outputs(tmp_path / "done.ipynb")
    assert printed[0] == "nvml total MiB 3072\n"
    shown = without_unused_note(printed[1])
    assert shown[3:5] == ["  SM      0.0% measured of 20% share", "  policy  burst"], shown
    assert shown[-1] == LEDGER_NOTE.format(ledger_path)


def test_a_batch_kernel_that_fits_is_held_in_the_servers_ledger_until_it_ends(
    start_server,
    background_nbconvert,
    waiting_notebook,
    cells,
    outputs,
    tmp_path,
    ledger_path,
    standalone_regions,
    region_files,
):
    server = start_server()
    held = server.api("POST", "api/vgpu/kernels", {"name": "python3-vgpu", "memory": "10GiB", "cores": 50})["kernel"][
        "id"
    ]
    source, waiting, go = waiting_notebook([cells.NVML_TOTAL], [cells.NVML_TOTAL, "%vgpu"])
    batch = background_nbconvert(
        source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=4GiB", "--VGPUProvisioner.cores=30"
    )
    wait_for(waiting.exists, 120, "the batch notebook to reach its waiting cell")
    listed = batch_slice(server, {held})
    assert listed is not None, server.slices()
    assert listed["limits"] == {"memory_bytes": 4 * GIB, "cores": 30, "policy": "burst"}  # a notebook's default
    assert listed["kernelspec"] == "Python 3 (GPU slice)"
    # The server counts it: 16GiB - 10GiB - 4GiB leaves 2GiB; a 3GiB start of the server takes the
    # room of its own 10GiB kernel, which never used the GPU (lent), never the batch kernel's.
    started = server.api("POST", "api/vgpu/kernels", {"name": "python3-vgpu", "memory": "3GiB", "cores": 10})
    assert server.api("GET", f"api/vgpu/slices/{held}")["state"] == "lent"
    assert batch_slice(server, {held, started["kernel"]["id"]})["state"] in ("unused", "running")
    server.api("DELETE", f"api/kernels/{started['kernel']['id']}")
    # ... and resizes it like its own: the batch kernel obeys on its next call.
    resized = server.api("PATCH", f"api/vgpu/slices/{listed['kernel_id']}", {"memory": "1GiB"})
    assert resized["limits"]["memory_bytes"] == GIB
    go.touch()
    assert batch.wait(120) == 0, batch.stderr_path.read_text()
    printed = outputs(tmp_path / "done.ipynb")
    assert [printed[0], printed[2]] == ["nvml total MiB 4096\n", "nvml total MiB 1024\n"]
    shown = without_unused_note(printed[3])
    assert shown[2:5] == ["  memory  0B used of 1GiB cap", "  SM      0.0% measured of 30% share", "  policy  burst"]
    assert shown[-1] == LEDGER_NOTE.format(ledger_path)
    assert list(server.slices()) == [held]  # released when the run ended
    assert region_files(standalone_regions) == []


def test_a_server_killed_and_started_again_leaves_a_running_batch_kernel_and_its_slice_alone(
    start_server, background_nbconvert, waiting_notebook, cells, outputs, tmp_path
):
    server = start_server()
    source, waiting, go = waiting_notebook([cells.NVML_TOTAL], [cells.NVML_TOTAL])
    batch = background_nbconvert(source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=3GiB")
    wait_for(waiting.exists, 120, "the batch notebook to reach its waiting cell")
    listed = batch_slice(server, set())
    assert listed is not None, server.slices()
    server.kill()
    # A server starting on this ledger stops the kernels it finds alive (it cannot re-adopt
    # them), but not a batch run's, and keeps its slice.
    server = start_server()
    assert list(server.slices()) == [listed["kernel_id"]]
    go.touch()
    assert batch.wait(120) == 0, batch.stderr_path.read_text()
    assert outputs(tmp_path / "done.ipynb") == ["nvml total MiB 3072\n", "", "nvml total MiB 3072\n"]
    assert server.slices() == {}


def test_reconcile_keeps_the_slice_of_a_live_batch_run_and_releases_a_finished_ones(tmp_path):
    device = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "test", 16 * GIB, 100)
    ended = subprocess.Popen(["true"])  # a process that started a batch run and is gone
    ended.wait()
    with EmbeddedLedger(tmp_path / "ledger.sqlite", [device]) as ledger:
        manager = SliceManager(ledger, [LocalHolder(tmp_path / "regions")], DEFAULT_LIMITS)
        running = {"pid": os.getpid(), "pid_start_time": process_start_time(os.getpid())}
        ledger.admit("live-batch", SliceLimits(GIB, 20), metadata={BATCH_KEY: running})
        ledger.admit("ended-batch", SliceLimits(GIB, 20), metadata={BATCH_KEY: {"pid": ended.pid, "pid_start_time": 1}})
        ledger.admit("server-kernel", SliceLimits(GIB, 20), metadata={})
        released = {allocation.kernel_id for allocation in manager.reconcile()}
        assert released == {"ended-batch", "server-kernel"}
        assert [allocation.kernel_id for allocation in ledger.allocations()] == ["live-batch"]


RESTART = """
import sys
from jupyter_client import KernelManager
from traitlets.config import Config
from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.model import SliceLimits, list_devices, use_simulator
from jupyter_vgpu.provisioning.local import default_ledger_path
from jupyter_vgpu.manager import SliceRefused

use_simulator()
ledger = EmbeddedLedger(default_ledger_path(), list_devices())  # as a vGPU server makes it
manager = KernelManager(kernel_name="python3-vgpu", config=Config({"VGPUProvisioner": {"simulate": True, "memory": "6GiB", "cores": 30}}))
manager.start_kernel()
first = ledger.get(manager.kernel_id)
# The server saw the kernel's process gone while the client restarts it, and released the slice.
ledger.release(manager.kernel_id)
manager.restart_kernel(now=True)
again = ledger.get(manager.kernel_id)
print("readmitted", again.memory_limit == first.memory_limit, again.metadata["provisioner_info"]["pid"] != first.metadata["provisioner_info"]["pid"])
# Released again, and meanwhile a server kernel took the room: the restart is refused.
ledger.release(manager.kernel_id)
ledger.admit("server-kernel", SliceLimits(12 << 30, 50))
try:
    manager.restart_kernel(now=True)
except SliceRefused as refusal:
    print("refused", refusal)
manager.shutdown_kernel(now=True)
print("left", [allocation.kernel_id for allocation in ledger.allocations()])
"""


def test_a_restarted_batch_kernel_whose_slice_was_released_is_admitted_again(user_env, ledger_path):
    run = subprocess.run(
        ["python", "-c", RESTART], check=False, env=user_env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "readmitted True True"
    assert lines[1].startswith(
        "refused this kernel's GPU slice (memory cap 6GiB, SM share 30 percent, policy burst) does not fit"
    )
    assert "GPU 0 has 4GiB free" in lines[1]
    assert lines[2] == "left ['server-kernel']"
