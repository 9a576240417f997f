"""Notebooks run unattended in GPU slices, as a user runs them: `jupyter nbconvert --execute`,
papermill (its command line and its Python API) and `jupyter execute` (nbclient's), with a vGPU
kernelspec on the simulated GPU (one 16GiB device), no vGPU server anywhere. In each, pynvml in
the kernel sees the chosen cap, `%vgpu` prints the slice, and an allocation over the cap gets
the out-of-memory line in the saved notebook."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from support import run_checked

GIB = 1 << 30
NO_SERVER_NOTE = "  note    started without a vGPU server (a batch run): its size was chosen when the run started"


def slice_lines(printed: str, cap: str) -> list[str]:
    """What %vgpu printed, with the first line (the kernel's id and state) checked and cut, and the
    line saying what `unused` means where it is that."""
    lines = printed.splitlines()
    shown = re.fullmatch(r"GPU slice of kernel ([0-9a-f]{8}) \(\1[0-9a-f-]{28}\), (unused|running)", lines[0])
    assert shown, lines[0]
    if shown[2] == "unused":
        assert lines.pop(1).startswith("  state   unused: the slice is held, but no process of the kernel uses"), lines
    assert lines[1:5] == [
        "  device  0 · jupyter-vgpu test GPU",
        f"  memory  0B used of {cap} cap",
        "  SM      0.0% measured of 100% share",
        "  policy  hard",
    ]
    return lines


def oom_line(asked: str, cap: str, suggested: str) -> str:
    return (
        f"jupyter-vgpu: out of GPU memory in this slice: cuMemAlloc_v2 asked for {asked}, the slice uses 0 bytes of "
        f"its {cap} cap. This kernel has no vGPU server to resize it: run it again in a larger slice (nbconvert: "
        f"`--VGPUProvisioner.memory={suggested}`; papermill: `-k` a kernelspec of that size)."
    )


def without_oom_line(printed: list[str], start: int, line: str) -> list[str]:
    """The cells' outputs with libvgpu.so's out-of-memory line taken out, which must be there
    once, in the output of cell ``start`` or a later one: ipykernel forwards what C code writes
    to fd 2 from a thread, so the line may come after the cell's own output has been sent."""
    found = [index for index in range(start, len(printed)) if line in printed[index].splitlines()]
    assert len(found) == 1, printed[start:]
    rest = list(printed)
    rest[found[0]] = "".join(part for part in printed[found[0]].splitlines(keepends=True) if part.rstrip("\n") != line)
    return rest


def test_nbconvert_runs_a_notebook_in_the_slice_its_command_line_chooses(
    jupyter, nbconvert, notebook, outputs, cells, tmp_path, standalone_regions, region_files
):
    # A kernelspec with a size of its own (1GiB): the run's command line wins over it.
    installed = jupyter("vgpu", "kernelspec", "install", "--memory", "1GiB", "--name", "sized-1g", "--user")
    assert installed.returncode == 0, installed.stderr
    source = notebook(
        "train.ipynb", cells.NVML_TOTAL, "%vgpu", cells.CUDA, cells.allocate(4 * GIB), cells.allocate(GIB)
    )
    run = nbconvert(source, tmp_path / "done.ipynb", "--VGPUProvisioner.memory=3GiB", kernel="sized-1g")
    assert run.returncode == 0, run.stderr
    printed = outputs(tmp_path / "done.ipynb")
    assert printed[0] == "nvml total MiB 3072\n"
    assert slice_lines(printed[1], "3GiB")[5:] == [NO_SERVER_NOTE]
    rest = without_oom_line(printed, 3, oom_line("4.0 GiB", "3.0 GiB", "4GiB"))
    assert rest[3:] == ["cuMemAlloc_v2 status 2\n", "cuMemAlloc_v2 status 0\n"]
    assert region_files(standalone_regions) == []  # the slice went with its kernel


def test_without_a_size_on_the_command_line_the_kernelspecs_holds(
    jupyter, nbconvert, notebook, outputs, cells, tmp_path
):
    installed = jupyter("vgpu", "kernelspec", "install", "--memory", "1GiB", "--name", "sized-1g", "--user")
    assert installed.returncode == 0, installed.stderr
    run = nbconvert(notebook("plain.ipynb", cells.NVML_TOTAL), tmp_path / "done.ipynb", kernel="sized-1g")
    assert run.returncode == 0, run.stderr
    assert outputs(tmp_path / "done.ipynb") == ["nvml total MiB 1024\n"]


def test_the_shipped_kernelspec_gives_a_batch_kernel_the_default_slice(nbconvert, notebook, outputs, cells, tmp_path):
    run = nbconvert(notebook("plain.ipynb", cells.NVML_TOTAL, "%vgpu"), tmp_path / "done.ipynb")
    assert run.returncode == 0, run.stderr
    printed = outputs(tmp_path / "done.ipynb")
    assert printed[0] == "nvml total MiB 4096\n"
    slice_lines(printed[1], "4GiB")


@pytest.mark.parametrize(
    "option, message",
    [
        (
            "--VGPUProvisioner.memory=3parsecs",
            "VGPUProvisioner.memory: memory size '3parsecs' has an unknown unit 'parsecs'; use a size like 512MiB",
        ),
        ("--VGPUProvisioner.memory=0", "VGPUProvisioner.memory: memory size '0' must be more than zero"),
        (
            "--VGPUProvisioner.cores=140",
            "VGPUProvisioner.cores: SM share '140' is not a whole percentage from 1 to 100",
        ),
        ("--VGPUProvisioner.policy=soft", "VGPUProvisioner.policy: policy 'soft' is not 'hard'"),
        (
            "--VGPUProvisioner.device=banana",
            "VGPUProvisioner.device: device 'banana' is not a GPU index (0, 1, ...) or UUID (GPU-...)",
        ),
        ("--VGPUProvisioner.device=7", "device '7' matches no single GPU; use an index or UUID of: 0 (GPU-"),
        (
            "--VGPUProvisioner.memory=64GiB",
            "a memory cap of 64GiB is more than GPU 0 has (16GiB); ask for at most that",
        ),
        (
            "--VGPUProvisioner.ledger=/nowhere/ledger.sqlite",
            "VGPUProvisioner.ledger: no ledger file at /nowhere/ledger.sqlite.",
        ),
        (
            "--VGPUProvisioner.ledger=",
            "VGPUProvisioner.ledger is empty; give auto, none or the path of a vGPU server's ledger",
        ),
    ],
)
def test_a_bad_value_on_the_command_line_stops_the_run_with_what_is_accepted(
    nbconvert, notebook, cells, tmp_path, standalone_regions, region_files, option, message
):
    run = nbconvert(notebook("plain.ipynb", cells.NVML_TOTAL), tmp_path / "done.ipynb", option)
    assert run.returncode != 0
    assert message in run.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "done.ipynb").exists()
    assert region_files(standalone_regions) == []


def test_a_bad_size_in_the_kernelspec_is_named_as_the_kernelspecs(user_env, nbconvert, notebook, cells, tmp_path):
    folder = tmp_path / "data" / "kernels" / "bad-size"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(
        '{"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Bad size",'
        ' "language": "python", "metadata": {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner",'
        ' "config": {"memory": "lots"}}}}'
    )
    run = nbconvert(notebook("plain.ipynb", cells.NVML_TOTAL), tmp_path / "done.ipynb", kernel="bad-size")
    assert run.returncode != 0
    assert "the kernelspec 'Bad size' sets memory in its provisioner config: memory size 'lots' is not" in run.stderr


def test_papermill_runs_a_notebook_in_the_slice_of_a_kernelspec_made_for_it(
    jupyter, papermill, notebook, outputs, cells, tmp_path, standalone_regions, region_files
):
    # papermill's command line takes no provisioner options: the size comes with the kernelspec.
    installed = jupyter(
        "vgpu", "kernelspec", "install", "--memory", "512MiB", "--simulate", "--name", "batch-512", "--user"
    )
    assert installed.returncode == 0, installed.stderr
    source = notebook(
        "report.ipynb",
        cells.NVML_TOTAL,
        "%vgpu",
        cells.CUDA,
        cells.allocate(GIB),
        "%vgpu resize --memory 1GiB",
        "%vgpu panel",
    )
    run = papermill("-k", "batch-512", str(source), str(tmp_path / "done.ipynb"))
    assert run.returncode == 0, run.stderr  # resize and panel say what to do; they do not fail the run
    printed = outputs(tmp_path / "done.ipynb")
    assert printed[0] == "nvml total MiB 512\n"
    assert slice_lines(printed[1], "512MiB")[5:] == [NO_SERVER_NOTE]
    printed = without_oom_line(printed, 3, oom_line("1.0 GiB", "512.0 MiB", "1024MiB"))
    assert printed[3] == "cuMemAlloc_v2 status 2\n"
    assert printed[4] == (
        "resize refused: this kernel was started without a vGPU server (nbconvert, papermill, nbclient), so its slice "
        "cannot be resized from the notebook; choose the size when starting the run: jupyter nbconvert --execute "
        "--VGPUProvisioner.memory=1GiB ..., or papermill -k NAME with a kernelspec made by jupyter vgpu kernelspec "
        "install --memory 1GiB --name NAME\n"
    )
    assert printed[5] == (
        "%vgpu panel shows and resizes the slices of a vGPU server's kernels, and this kernel was started without a "
        "server (a batch run); %vgpu shows its own slice\n"
    )
    assert region_files(standalone_regions) == []


def test_papermill_from_python_takes_the_size_from_its_config(user_env, notebook, outputs, cells, tmp_path):
    source = notebook("report.ipynb", cells.NVML_TOTAL, "%vgpu")
    script = (
        "import sys, papermill\n"
        "from traitlets.config import Config\n"
        "papermill.execute_notebook(sys.argv[1], sys.argv[2], kernel_name='python3-vgpu', progress_bar=False,\n"
        "    config=Config({'VGPUProvisioner': {'memory': '1536MiB', 'simulate': True}}))\n"
    )
    run_checked([sys.executable, "-c", script, str(source), str(tmp_path / "done.ipynb")], env=user_env, timeout=240)
    printed = outputs(tmp_path / "done.ipynb")
    assert printed[0] == "nvml total MiB 1536\n"
    slice_lines(printed[1], "1.5GiB")


def test_jupyter_execute_takes_the_size_from_its_command_line(jupyter, notebook, outputs, cells, tmp_path):
    # nbclient's own command line makes its kernel manager without its config; the provisioner
    # reads the running application's.
    source = notebook("report.ipynb", cells.NVML_TOTAL)
    run = jupyter(
        "execute",
        "--kernel_name=python3-vgpu",
        "--VGPUProvisioner.simulate=True",
        "--VGPUProvisioner.memory=2GiB",
        "--inplace",
        str(source),
    )
    assert run.returncode == 0, run.stderr
    assert outputs(source) == ["nvml total MiB 2048\n"]


def test_a_batch_run_without_a_gpu_says_in_one_line_what_to_do(nbconvert_command, user_env, notebook, cells, tmp_path):
    """README's example on a machine without an NVIDIA driver, without --VGPUProvisioner.simulate=True:
    one line naming the option, not two tracebacks of 99 lines (issue 27 #1)."""
    if shutil.which("nvidia-smi"):
        pytest.skip("an NVIDIA driver is here")
    command = [
        part
        for part in nbconvert_command(notebook("nb.ipynb", cells.NVML_TOTAL), tmp_path / "done.ipynb")
        if part != "--VGPUProvisioner.simulate=True"
    ]
    run = subprocess.run(command, check=False, env=user_env, capture_output=True, text=True, timeout=240)
    assert run.returncode != 0
    said = [line for line in run.stderr.splitlines() if not line.startswith("[NbConvertApp] Converting notebook")]
    line = (
        "jupyter-vgpu: NVML is not available (NVML Shared Library Not Found): no NVIDIA driver is loaded on this "
        "machine. To run the notebook on the simulated GPU, give --VGPUProvisioner.simulate=True (papermill: -k a "
        "kernelspec made with `jupyter vgpu kernelspec install --simulate`)."
    )
    assert said == [line], run.stderr
    assert not (tmp_path / "done.ipynb").exists()
