"""A notebook in JupyterLab whose server is killed (SIGKILL) and started again: the page loaded
again reconnects the notebook to its kernel, which outlived its server and was adopted by the new
one (issue 26), with its variables and GPU memory: no new kernel, no kernel restart, no dialog. A
real `jupyter lab` on the simulated GPU and headless Chromium (tests/browser/lab_restart.mjs)."""

from __future__ import annotations

import json
import subprocess

from conftest import CHROMIUM, HERE, TOKEN, Lab
from support import running


def test_reloading_the_lab_after_a_server_sigkill_reconnects_the_notebook_to_its_kernel(
    browser_tools, lab, browser_gpu_env, tmp_path, cuda_prelude
):
    notebook = lab.write_notebook(
        "survivor.ipynb", [cuda_prelude + "x = 41\nprint('set', allocate(1 << 30))", "print('x is', x + 1)"]
    )
    before = browse("before", lab, tmp_path, notebook)
    assert "set 0" in before["output"] and before["status"].startswith("GPU 1.0 / 1.0 GiB")
    (listed,) = lab.api("GET", "api/vgpu/slices")
    pid = listed["pid"]

    lab.kill()
    assert running(pid)
    restarted = Lab(tmp_path, lab.env)
    try:
        after = browse("after", restarted, tmp_path, notebook)
        assert after["kernelId"] == before["kernelId"]  # the same kernel, not a new one
        assert "x is 42" in after["output"]  # its variable is there
        assert after["status"].startswith("GPU 1.0 / 1.0 GiB")  # and its GPU memory
        assert after["dialogs"] == 0  # no "kernel restarted", no "select kernel"
        assert "survivor.ipynb" in after["sidebar"]  # the sidebar lists its slice, by its notebook
        (listed,) = restarted.api("GET", "api/vgpu/slices")
        assert listed["pid"] == pid
    finally:
        restarted.stop()


def browse(scenario: str, lab: Lab, tmp_path, notebook: str) -> dict:
    failure_screenshot = tmp_path / f"failed-{scenario}.png"
    settings = {
        "url": lab.url,
        "token": TOKEN,
        "chromium": str(CHROMIUM),
        "notebook": notebook,
        "failureScreenshot": str(failure_screenshot),
    }
    result = subprocess.run(
        ["node", str(HERE / "lab_restart.mjs"), scenario, json.dumps(settings)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (
        f"browser scenario {scenario} failed (the page then: {failure_screenshot}):\n{result.stdout}\n"
        f"{result.stderr}\n--- lab log ---\n{lab.log.read_text()[-4000:]}"
    )
    return json.loads(result.stdout.strip().splitlines()[-1])
