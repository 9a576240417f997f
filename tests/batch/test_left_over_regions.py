"""A batch kernel that is never shut down, only garbage-collected (nbclient driven by hand, a
papermill run killed), leaves its region and limits page in the standalone folder; the next batch
kernel's start clears every such left-over whose processes are all gone, and leaves alone what
is in use (issue 27 #17)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from jupyter_vgpu.holders.device_memory import process_running
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.model import Device, SliceLimits

DEVICE = Device("GPU-00000000-0000-4000-8000-000000000000", 0, "test", 16 << 30, 100)

# A real nbclient kernel of the shipped vGPU kernelspec, on the simulated GPU, that runs one cell
# and is then dropped without a shutdown: what the program leaves is what the kernel leaves.
ABANDON = """
import gc, json, os
import nbformat
from nbclient import NotebookClient
from traitlets.config import Config

from jupyter_vgpu.holders.region import process_start_time

notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os; print(os.environ['VGPU_REGION'])")])
client = NotebookClient(notebook, kernel_name="python3-vgpu", config=Config({"VGPUProvisioner": {"simulate": True}}))
client.km = client.create_kernel_manager()
client.start_new_kernel()
client.start_new_kernel_client()
client.execute_cell(notebook.cells[0], 0)
pid = client.km.provisioner.pid
print(json.dumps({"region": notebook.cells[0].outputs[0]["text"].strip(), "pid": pid, "start": process_start_time(pid)}))
del client
gc.collect()
"""


def run_a_batch_kernel(jupyter, notebook, cells) -> None:
    """The next batch kernel: a notebook run by `jupyter execute` with the vGPU kernelspec."""
    result = jupyter(
        "execute",
        "--kernel_name=python3-vgpu",
        "--VGPUProvisioner.simulate=True",
        str(notebook("nb.ipynb", cells.NVML_TOTAL)),
    )
    assert result.returncode == 0, result.stderr


def test_the_next_batch_start_clears_what_an_abandoned_nbclient_kernel_left(
    user_env, jupyter, notebook, cells, standalone_regions
):
    run = subprocess.run(
        [sys.executable, "-c", ABANDON], check=False, env=user_env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr
    abandoned = json.loads(run.stdout.strip().splitlines()[-1])
    region = Path(abandoned["region"])
    assert region.parent == standalone_regions
    # Its program is gone; the kernel, orphaned, notices and ends.
    deadline = time.monotonic() + 60
    while process_running(abandoned["pid"], abandoned["start"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_running(abandoned["pid"], abandoned["start"]), "the abandoned kernel kept running"
    left = sorted(path.name for path in standalone_regions.iterdir())
    assert region.name in left and f"{region.name}.limits" in left  # what issue 27 #17 found piling up

    run_a_batch_kernel(jupyter, notebook, cells)
    assert sorted(path.name for path in standalone_regions.iterdir()) == []  # its own, shut down, too


def test_the_next_batch_start_leaves_a_region_in_use_alone(user_env, jupyter, notebook, cells, standalone_regions):
    """A region whose owner runs (here this test's process), though no process of its slice made
    a CUDA call yet, so that its region lists none."""
    holder = LocalHolder(standalone_regions)
    holder.new_region("in-use", SliceLimits(1 << 30), DEVICE).close()
    holder.mark_owners("in-use", os.getpid())
    try:
        run_a_batch_kernel(jupyter, notebook, cells)
        assert sorted(path.name for path in standalone_regions.iterdir()) == [
            "in-use.owners",
            "in-use.region",
            "in-use.region.limits",
        ]
    finally:
        holder.release("in-use")
