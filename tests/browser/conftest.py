"""A live `jupyter lab` on the simulated GPU, started as a user starts it, and Debian's Chromium
driven by playwright-core (tests/browser/lab.mjs) against it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient
from support import JupyterProcess, write_vgpu_kernelspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHROMIUM = Path("/usr/bin/chromium")
# Tests save their screenshots in a temporary folder; to refresh the README's pictures run
# `VGPU_SCREENSHOTS=docs/screenshots python -m pytest tests/browser`.
SCREENSHOTS_ENV = "VGPU_SCREENSHOTS"
KERNEL_NAME = "vgpu-browser"
TOKEN = "vgpu-browser-token"
BROWSER_DEVICE = "name=Sim Browser GPU,memory=8GiB,sms=50,context_memory=0"


class Lab(JupyterProcess):
    """`jupyter lab` in a private Jupyter environment (config, data, runtime, settings), with a
    vGPU kernelspec named ``kernel_name``, and more ``options`` on its command line."""

    kernel_name = KERNEL_NAME

    def __init__(self, tmp_path: Path, env: dict[str, str], *options: str):
        self.root = tmp_path / "notebooks"
        self.root.mkdir(exist_ok=True)  # a lab started again on the same folders finds it there
        self.env = env
        self.runtime_dir = tmp_path / "runtime"  # JUPYTER_RUNTIME_DIR: the kernels' connection files
        super().__init__(
            env,
            tmp_path / "lab.log",
            TOKEN,
            f"--ServerApp.root_dir={self.root}",
            "--VGPUApp.simulate=True",
            f"--VGPUApp.ledger_path={tmp_path / 'ledger.sqlite'}",
            f"--VGPUApp.region_dir={tmp_path / 'regions'}",
            *options,
            app="lab",
        )

    def run_in_kernel(self, kernel_id: str, code: str = "") -> None:
        """Wait until the kernel answers on its own channels, then run ``code`` there (if any),
        which must end without an error."""
        client = BlockingKernelClient(connection_file=str(self.runtime_dir / f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            if code:
                reply = client.execute_interactive(code, timeout=120)
                assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()

    def write_notebook(self, name: str, cells: list[str], kernelspec: str = KERNEL_NAME) -> str:
        """A notebook with the given code cells, whose kernel is the vGPU kernelspec by default."""
        notebook = {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": kernelspec, "display_name": kernelspec, "language": "python"}},
            "cells": [
                {
                    "cell_type": "code",
                    "id": f"cell-{index}",
                    "source": source,
                    "metadata": {},
                    "outputs": [],
                    "execution_count": None,
                }
                for index, source in enumerate(cells)
            ],
        }
        (self.root / name).write_text(json.dumps(notebook))
        return name


def write_private_jupyter_env(tmp_path: Path, labextension: Path) -> dict[str, str]:
    """JUPYTER_* dirs of this test only: a vGPU kernelspec of the test's own and the one this
    project ships (kernels/python3-vgpu, "Python 3 (GPU slice)"), the lab extension as built from
    this checkout (found before any installed copy), and lab settings that keep the news and
    update prompts out of the page (and the screenshots)."""
    data = tmp_path / "data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "jupyter-vgpu").symlink_to(labextension, target_is_directory=True)
    shutil.copytree(ROOT / "kernels" / "python3-vgpu", data / "kernels" / "python3-vgpu")
    write_vgpu_kernelspec(
        data / "kernels" / KERNEL_NAME, "GPU slice (browser test)", {"memory": "1GiB", "cores": "50", "policy": "hard"}
    )
    config = tmp_path / "config"
    notification = config / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    return {
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        # In a virtualenv Jupyter looks in the environment's share/jupyter before the user's data
        # dir; the user's (this test's) must come first, or an installed copy of the extension wins.
        "JUPYTER_PREFER_ENV_PATH": "0",
    }


@pytest.fixture(scope="session")
def labextension_build() -> Path:
    """Builds labextension/ from this checkout once per test session (as native_libs builds
    native/), so the browser runs the extension as it is in the tree, not a stale installed copy."""
    assert shutil.which("npm"), "npm is missing; the browser tests build the lab extension with it"
    result = subprocess.run(
        ["npm", "--prefix", str(ROOT / "labextension"), "run", "build"], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, f"building the lab extension failed:\n{result.stdout}\n{result.stderr}"
    output = ROOT / "jupyter_vgpu" / "labextension"
    assert (output / "package.json").is_file(), f"the lab extension build left no {output / 'package.json'}"
    return output


@pytest.fixture
def lab_options() -> tuple[str, ...]:
    """More options for the lab's command line; a test sets them with
    ``@pytest.mark.parametrize("lab_options", [(...)])``."""
    return ()


@pytest.fixture
def browser_gpu_env(sim_env) -> dict[str, str]:
    """The simulated GPU's environment with the lab's device: a program run with it shares the
    lab's GPU (holds memory there outside any slice)."""
    return {**sim_env, "VGPU_SIM_DEVICES": BROWSER_DEVICE}


@pytest.fixture
def lab(browser_gpu_env, tmp_path, labextension_build, lab_options):
    env = dict(browser_gpu_env)
    env.pop("LD_LIBRARY_PATH")  # the server points its kernels at the simulated driver itself
    # ipykernel forwards what C code writes to fd 2 (the OOM line) unless it sees this variable.
    env.pop("PYTEST_CURRENT_TEST", None)
    env.update(write_private_jupyter_env(tmp_path, labextension_build))
    server = Lab(tmp_path, env, *lab_options)
    yield server
    if server.stop() is None:
        pytest.fail(f"jupyter lab did not exit within 30 s of SIGTERM; its log:\n{server.log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def browser_tools():
    """Chromium and playwright-core must be there: CI installs them, so a missing one fails."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing; install it with `apt-get install -y chromium`"
    assert shutil.which("node"), "node is missing; the browser tests drive Chromium from Node"
    assert (HERE / "node_modules" / "playwright-core").is_dir(), (
        "playwright-core is missing; install it with `npm ci --prefix tests/browser`"
    )


@pytest.fixture
def screenshots(tmp_path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def drive(browser_tools, lab, tmp_path, screenshots):
    """drive(scenario, when=None, **params) runs one scenario of lab.mjs against the lab; fails with
    its output. ``when`` maps a line the scenario prints to what the test does then (while the
    scenario waits for its effect: e.g. free the GPU)."""

    def run(scenario: str, when: dict[str, Callable[[], object]] | None = None, **params) -> dict:
        failure_screenshot = tmp_path / f"failed-{scenario}.png"
        settings = {
            "url": lab.url,
            "token": TOKEN,
            "chromium": str(CHROMIUM),
            "screenshots": str(screenshots),
            "failureScreenshot": str(failure_screenshot),
            **params,
        }
        pending = dict(when or {})
        with (tmp_path / f"{scenario}.stderr").open("w+") as stderr:
            process = subprocess.Popen(
                ["node", str(HERE / "lab.mjs"), scenario, json.dumps(settings)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            deadline = threading.Timer(240, process.kill)
            deadline.start()
            try:
                assert process.stdout is not None
                lines = []
                for line in process.stdout:
                    lines.append(line)
                    action = pending.pop(line.strip(), None)
                    if action is not None:
                        action()
                returncode = process.wait()
            finally:
                deadline.cancel()
                if process.poll() is None:
                    process.kill()
                    process.wait()
            stderr.seek(0)
            errors = stderr.read()
        output = "".join(lines)
        assert returncode == 0, (
            f"browser scenario {scenario} failed (the page then: {failure_screenshot}):\n{output}\n{errors}\n--- lab log ---\n{lab.log.read_text()[-4000:]}"
        )
        assert not pending, f"browser scenario {scenario} never printed {sorted(pending)}:\n{output}"
        return json.loads(output.strip().splitlines()[-1])

    return run
