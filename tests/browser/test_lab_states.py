"""What JupyterLab says about a slice while things change (issue 27 #4, #10, #18), in a real
browser against a live `jupyter lab` on a simulated 16 GiB GPU whose checkpoints copy at 1 GB/s
(a 4 GiB kernel takes about 4 s each way, as a real GPU's large kernels do): the states between
running and suspended, row messages that go when what they said stops being true, the start
dialog's defaults from the server, a restarted server's notice read within the sidebar, and a
sidebar that lists no slices of a server that is gone."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import KERNEL_NAME, Lab
from support import running, wait_for

GIB = 1 << 30
BANDWIDTH = 1_000_000_000  # bytes per second a checkpoint or a restore copies
# Cell 0: 4 GiB held, 1 MiB of it written (the simulated driver then moves all 4 GiB at BANDWIDTH).
HOLD_4_GIB = """
pointer = ctypes.c_uint64()
print('allocated', cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(4 << 30)))
assert cuda.cuMemsetD8_v2(pointer, 0x5A, ctypes.c_size_t(1 << 20)) == 0
"""
SHIPPED_CARD, TEST_CARD = "Python 3 (GPU slice)", "GPU slice (browser test)"


@pytest.fixture
def browser_gpu_env(sim_env) -> dict[str, str]:
    """A 16 GiB simulated GPU whose checkpoints move the bytes at 1 GB/s (the kernels inherit it)."""
    return {
        **sim_env,
        "VGPU_SIM_DEVICES": "name=Sim Browser GPU,memory=16GiB,sms=50,context_memory=0",
        "VGPU_SIM_CHECKPOINT_BANDWIDTH": str(BANDWIDTH),
    }


@pytest.mark.parametrize("lab_options", [("--VGPUApp.default_memory=5GiB",)])
def test_a_kernel_being_suspended_or_resumed_says_so_and_row_messages_go_when_they_stop_being_true(
    lab, drive, cuda_prelude
):
    notebook = lab.write_notebook("moving.ipynb", [cuda_prelude + HOLD_4_GIB], kernelspec="python3-vgpu")

    seen = drive("suspendingResuming", notebook=notebook, memory="6GiB", otherMemory="7GiB", otherMemoryShown="7.0 GiB")

    # While its 4 GiB go to host memory, and while they come back: said, not "running".
    assert seen["suspending"] == {
        "title": "moving.ipynb · GPU 0 · burst · suspending",
        "bar": "Memory 4GiB moving to host memory (suspending)",
        "status": "GPU suspending · moving 4GiB to host memory",
    }, seen
    assert seen["suspended"] == {"text": "Suspended.", "refused": False}
    assert seen["resuming"] == {
        "title": "moving.ipynb · GPU 0 · burst · resuming",
        "bar": "Memory 4GiB coming back from host memory (resuming)",
        "status": "GPU resuming · 4GiB coming back from host memory",
        "message": "",
    }, seen
    assert seen["afterResume"]["message"] == ""
    assert seen["afterResume"]["status"].startswith("GPU 4.0 / 5.0 GiB")
    assert seen["resized"] == {"text": "Resized.", "refused": False}
    assert seen["afterOtherResize"] == ""  # "Resized." was about 6GiB; another client made it 7GiB
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["state"], slice_["limits"]["memory_bytes"]) == ("running", 7 * GIB)


@pytest.mark.parametrize("lab_options", [("--VGPUApp.default_memory=3GiB", "--VGPUApp.default_cores=30")])
def test_the_start_dialog_shows_the_server_s_defaults_and_its_launcher_closes_when_the_notebook_opens(lab, drive):
    seen = drive("startDialogDefaults", kernels=[TEST_CARD, SHIPPED_CARD])

    # The test's kernelspec sets its own slice; the shipped one none: the server's defaults
    # (here 3GiB and 30 %, burst as by default) are what it gets.
    assert seen["shown"] == {
        TEST_CARD: {"memory": "1GiB", "cores": "50", "policy": "hard"},
        SHIPPED_CARD: {"memory": "3GiB", "cores": "30", "policy": "burst"},
    }
    assert (seen["launchersBefore"], seen["launchersAfter"]) == (1, 0)
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["path"], slice_["kernelspec"]) == (seen["path"], SHIPPED_CARD)
    assert slice_["limits"] == {"memory_bytes": 3 * GIB, "cores": 30, "policy": "burst"}


def test_a_restarted_server_s_notice_about_a_kernel_it_could_not_adopt_wraps_within_the_sidebar(
    lab, drive, tmp_path, cuda_prelude
):
    kernel_id = lab.api("POST", "api/vgpu/kernels", {"name": KERNEL_NAME})["kernel"]["id"]
    lab.run_in_kernel(kernel_id, cuda_prelude + "assert allocate(256 << 20) == 0")
    lab.api("POST", f"api/vgpu/slices/{kernel_id}/suspend")
    (listed,) = lab.api("GET", "api/vgpu/slices")
    pid = listed["pid"]
    # Killed, and its kernelspec gone before the restart: the kernel outlives it, suspended, and
    # the next server cannot adopt it, so it lists it with a notice naming its connection file.
    lab.kill()
    shutil.rmtree(Path(lab.env["JUPYTER_DATA_DIR"]) / "kernels" / KERNEL_NAME)
    restarted = Lab(tmp_path, lab.env)
    try:
        (orphan,) = restarted.api("GET", "api/vgpu/slices")
        assert "jupyter console --existing" in (orphan["notice"] or ""), orphan

        seen = drive("restartNotice", url=restarted.url, kernelId=kernel_id)
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        restarted.stop()

    assert seen["notice"] == orphan["notice"]
    assert seen["scrollWidth"] <= seen["clientWidth"], seen
    assert seen["outside"] == [], seen


GONE_MARKER = "vgpu-test: stop the server now"


def test_the_sidebar_shows_no_slices_of_a_server_that_is_gone(lab, drive):
    notebook = lab.write_notebook("gone.ipynb", ["print('hello')"])

    seen = drive("serverGone", when={GONE_MARKER: lab.stop}, notebook=notebook, goneMarker=GONE_MARKER)

    assert seen["before"] == 1
    # Its kernels ended with it: no bars of dead kernels, no GPU item in the status bar.
    assert (seen["rows"], seen["bars"], seen["statusItemVisible"]) == (0, 0, False), seen
    assert seen["status"].startswith("Cannot reach the server (")
    assert seen["status"].endswith("): its GPU slices show again when it answers.")
    wait_for(lambda: lab.process.poll() is not None, 30, "jupyter lab to exit")
