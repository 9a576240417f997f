"""Resume ahead of use (issue 26, item 1) in a real browser: the user turning to a notebook whose
kernel is suspended resumes it before any cell runs, and its next cell finds it running; side by
side with resume-on-cell (the lab's wakeHint setting off), at 4 GiB held on the simulated GPU
copying at 7 GB/s, the time from the cell's execute_request to its first line."""

from __future__ import annotations

import json

import pytest

GIB = 1 << 30
BANDWIDTH = 7_000_000_000  # bytes per second, as benchmarks/suspend_resume.py
MARKER = "first line"
# Cell 0 holds 4 GiB and writes 1 MiB of it: a checkpoint moves an allocation once it was written,
# all of it (the simulated driver paces the 4 GiB at BANDWIDTH; the pages it never wrote take no
# host memory). Cells 1 to 3 print their first line after a CUDA call, then check the bytes.
HOLD = """
pointer = ctypes.c_uint64()
print('allocated', cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(4 << 30)))
assert cuda.cuMemsetD8_v2(pointer, 0x5A, ctypes.c_size_t(1 << 20)) == 0
def intact():
    back = (ctypes.c_ubyte * (1 << 20))()
    assert cuda.cuMemcpyDtoH_v2(back, pointer, ctypes.c_size_t(1 << 20)) == 0
    return bytes(back) == b'\\x5a' * (1 << 20)
"""
FIRST_LINE = f"print({MARKER!r}, allocate(1 << 20), flush=True)\nprint('intact', intact())"


@pytest.fixture
def browser_gpu_env(sim_env) -> dict[str, str]:
    """A 16 GiB simulated GPU whose checkpoints move the bytes at 7 GB/s (the kernels inherit it)."""
    return {
        **sim_env,
        "VGPU_SIM_DEVICES": "name=Sim Browser GPU,memory=16GiB,sms=50,context_memory=0",
        "VGPU_SIM_CHECKPOINT_BANDWIDTH": str(BANDWIDTH),
    }


@pytest.mark.parametrize("lab_options", [("--LabApp.expose_app_in_browser=True", "--VGPUApp.default_memory=5GiB")])
def test_turning_to_a_suspended_notebook_resumes_its_kernel_before_its_next_cell(lab, drive, cuda_prelude):
    notebook = lab.write_notebook(
        "ahead.ipynb",
        [cuda_prelude + HOLD, FIRST_LINE, FIRST_LINE, FIRST_LINE],
        kernelspec="python3-vgpu",  # the server's default size: 5GiB here
    )

    seen = drive("resumeAhead", notebook=notebook, marker=MARKER, hintLeadMs=1000)

    hinted, unhinted = seen["hinted"], seen["unhinted"]
    print(
        f"execute_request -> first line at 4 GiB: with the hint {hinted['ms']:.1f} ms, "
        f"resume on the cell {unhinted['ms']:.1f} ms, not suspended {seen['running']['ms']:.1f} ms "
        f"(the hint's resume: {seen['resumedAfterMs']} ms from the click to REST reading it running "
        "and out of the line)"
    )
    print(json.dumps(seen, indent=1))
    assert "allocated 0" in seen["allocated"]
    # A click into a cell resumed the kernel, with no cell run (the kernel idle, cell 1 never ran),
    # and the status bar said so while it happened.
    assert (seen["kernelAfterWake"], seen["promptAfterWake"]) == ("idle", "[ ]:")
    assert any(text.startswith("GPU resuming · 4GiB coming back from host memory") for text in seen["statusTexts"]), (
        seen["statusTexts"]
    )
    assert seen["statusTexts"][0].startswith("GPU suspended"), seen["statusTexts"]
    assert seen["statusAfterWake"].startswith("GPU 4.0 / 5.0 GiB")
    # With the hint, the cell did not wait for the restore: its slice read running and out of the
    # line (the memory back) before its execute_request went, its CUDA call printed no waiting
    # line, and it was the next cell run.
    assert (hinted["stateBefore"], hinted["queueBefore"]) == ("running", None)
    assert hinted["outputs"] == f"{MARKER} 0\nintact True\n" and hinted["prompt"] == "[2]:"
    # A keystroke alone (the cursor in a cell since before the suspend) woke it too.
    assert seen["resumedByEdit"][0][1:] in (["suspended", None], ["suspended", 1], ["resuming", 1])
    assert seen["resumedByEdit"][-1][1:] == ["running", None]
    # Without it (wakeHint off), the cell found its kernel suspended and its first CUDA call
    # resumed it.
    assert unhinted["stateBefore"] == "suspended"
    lines = unhinted["outputs"].splitlines()
    assert {f"{MARKER} 0", "intact True"} <= set(lines), lines
    assert lines[0].startswith("jupyter-vgpu: waiting for room on GPU 0"), lines
    (slice_,) = lab.api("GET", "api/vgpu/slices")
    assert (slice_["state"], slice_["host_memory_bytes"]) == ("running", 0)
