"""`jupyter vgpu kernelspec install` as `jupyter kernelspec install` works: --user, --prefix DIR,
--sys-prefix; one line saying where; a warning where no GPU here has the slice's memory; an
option it does not have refused, not ignored (issue 27 #12, #18)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WARNING = "warning: a 99GiB slice is more than any simulated GPU here has (the largest, simulated GPU 0, has 16GiB)"


def installed(data_dir: Path) -> list[str]:
    return sorted(path.name for path in (data_dir / "kernels").iterdir()) if (data_dir / "kernels").exists() else []


@pytest.mark.parametrize("simulate", [["--simulate"], []], ids=["simulate", "no-driver"])
def test_a_slice_larger_than_any_gpu_here_is_installed_with_a_warning(vgpu, cli_env, simulate):
    if not simulate and shutil.which("nvidia-smi"):
        pytest.skip("an NVIDIA driver is here: the warning names its GPUs")
    # Without a driver the GPU is the simulated one a --VGPUApp.simulate=True server has (16GiB).
    result = vgpu("kernelspec", "install", "--memory", "99GiB", "--name", "huge", "--user", *simulate)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == (
        f"jupyter vgpu kernelspec install: {WARNING}; its kernels will be refused on this machine "
        "(installed anyway, for a machine with a larger GPU)"
    )
    assert installed(Path(cli_env["JUPYTER_DATA_DIR"])) == ["huge"]


def test_a_slice_larger_than_the_named_gpu_is_warned_about_and_one_that_fits_is_not(vgpu, cli_env):
    cli_env["VGPU_SIM_DEVICES"] = "name=small,memory=8GiB,sms=40;name=large,memory=16GiB,sms=100"
    larger = vgpu("kernelspec", "install", "--memory", "12GiB", "--device", "0", "--simulate", "--user")
    assert larger.returncode == 0, larger.stderr
    assert "a 12GiB slice is more than simulated GPU 0 has (8GiB)" in larger.stderr
    fits = vgpu("kernelspec", "install", "--memory", "12GiB", "--device", "1", "--simulate", "--user")
    assert (fits.returncode, fits.stderr) == (0, "")


def test_install_says_where_once(vgpu, cli_env):
    result = vgpu("kernelspec", "install", "--name", "Once", "--user")
    assert result.returncode == 0, result.stderr
    folder = Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "once"  # Jupyter lower-cases kernelspec names
    assert (result.stdout + result.stderr).strip() == f"installed kernelspec once in {folder}"


def test_prefix_installs_under_it_like_jupyter_kernelspec_install(vgpu, cli_env, tmp_path):
    result = vgpu("kernelspec", "install", "--prefix", str(tmp_path / "env"), "--name", "in-env")
    assert result.returncode == 0, result.stderr
    spec = json.loads((tmp_path / "env" / "share" / "jupyter" / "kernels" / "in-env" / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "vgpu-provisioner"
    assert installed(Path(cli_env["JUPYTER_DATA_DIR"])) == []


def test_sys_prefix_installs_in_this_pythons_environment(cli_env, tmp_path):
    """sys.prefix made a folder of the test's, so that the test's own environment stays as it is."""
    probe = (
        "import sys; sys.prefix = sys.argv[1]; sys.argv = ['jupyter-vgpu', 'kernelspec', 'install', "
        "'--sys-prefix', '--name', 'here']; from jupyter_vgpu.cli import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "env")],
        check=False,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "env" / "share" / "jupyter" / "kernels" / "here" / "kernel.json").is_file()


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--user", "--prefix", "/tmp/somewhere"], "--user and --prefix (or --sys-prefix) name two places"),
        (
            ["--user", "--prefx", "/tmp/somewhere"],
            "unknown option --prefx; `jupyter vgpu kernelspec install --help` lists",
        ),
    ],
)
def test_options_that_cannot_be_followed_are_refused_before_installing(vgpu, cli_env, flags, said):
    result = vgpu("kernelspec", "install", *flags)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert installed(Path(cli_env["JUPYTER_DATA_DIR"])) == [] and not Path("/tmp/somewhere").exists()
