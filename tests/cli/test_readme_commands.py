"""README's first commands ("Two commands"), run as a newcomer types them, in their order, on the
simulated GPU: each must succeed, `doctor` after `run` included; and the site's batch line.
tests/docs/test_site_commands.py runs every other `jupyter vgpu` command of README and the site."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
FIRST_COMMAND = "jupyter vgpu devices --simulate"


def first_commands() -> list[str]:
    """The commands of README's block that starts with FIRST_COMMAND, comments cut."""
    block = next(part for part in README.read_text().split("```bash\n") if part.startswith(FIRST_COMMAND))
    lines = block.split("```", 1)[0].splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def test_readme_s_first_commands_succeed_in_their_order_doctor_after_run_included(cli_env, tmp_path):
    commands = first_commands()
    assert [command.split()[:3] for command in commands] == [
        ["jupyter", "vgpu", "devices"],
        ["jupyter", "vgpu", "run"],
        ["jupyter", "vgpu", "doctor"],
    ]
    (tmp_path / "my_script.py").write_text("print('hello from a slice')\n")
    # `jupyter` and `python` as the newcomer's activated virtual environment has them.
    env = {**cli_env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), cli_env.get("PATH", "")])}
    for command in commands:
        result = subprocess.run(
            shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
        if " run " in command:
            assert "hello from a slice" in result.stdout
    assert "[ok] file modes: region folders and files private" in result.stdout


def test_the_sites_nbconvert_line_runs_a_notebook_in_a_slice(cli_env, tmp_path):
    """docs/run.md's nbconvert command as written, on the simulated GPU (the one option added, as
    `--simulate` is to the commands above where no driver is)."""
    page = (README.parent / "docs" / "run.md").read_text()
    (command,) = [
        " ".join(line.split()[2:])
        for line in page.splitlines()
        if line.startswith("jupyter nbconvert") and "kernel_name" in line
    ]
    data = Path(cli_env["JUPYTER_DATA_DIR"])
    shutil.copytree(README.parent / "kernels" / "python3-vgpu", data / "kernels" / "python3-vgpu")
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {
                "cell_type": "code",
                "id": "c",
                "source": "print('ran')",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
            }
        ],
    }
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook))
    env = {**cli_env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), cli_env.get("PATH", "")])}
    argv = ["jupyter", "nbconvert", *shlex.split(command), "--VGPUProvisioner.simulate=True"]

    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)

    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
    executed = json.loads((tmp_path / "nb.nbconvert.ipynb").read_text())
    assert "".join(executed["cells"][0]["outputs"][0]["text"]) == "ran\n"
