"""How long suspending a kernel's process to host memory and resuming it take, against how much
device memory it holds, on the simulated GPU with the copy bandwidth set to a measured real one.

    python benchmarks/suspend_resume.py            # about two minutes; needs ~13 GiB of free RAM
    python benchmarks/suspend_resume.py --smoke    # about half a minute, as CI runs it

A target process (tests/programs/checkpoint_probe.c) allocates SIZE bytes and writes a pattern
into all of them; this process is the controller, as the server is
(jupyter_vgpu.holders.checkpoint.CheckpointController): suspend = lock (its queued work ends),
read NVML, checkpoint (the bytes to host memory, the device freed); resume = check NVML's free
memory, restore (the bytes back), unlock. The pattern is checked after every resume.

The simulated driver copies at VGPU_SIM_CHECKPOINT_BANDWIDTH: 7 GB/s here, the middle of what
others measured restoring on a B200 (16 GB in 2.8 s, 145 GB in 17.9 s: 5.7 to 8.1 GB/s;
FIELD-NOTES "Suspending a CUDA process"). So these figures are the API's own overhead on top of
that copy time (the `copy` column), not a real GPU's; framework_checks.py measures one.

Then a kernel's cell after a suspend (issue 26, resume ahead of use; issue 34 item 7): a `jupyter
server` of its own (its own runtime folder, ledger, regions and simulated GPU state, at the same
bandwidth) starts a sliced kernel holding SIZE (4 GiB; 256 MiB with --smoke) and suspends it
through REST, then, alternating:

- hint to ready: POST .../wake (the lab's "turned to it" hint) and the time until the slice
  reads running with no place in line (REST, polled every 5 ms): what a user who waits that long
  before running a cell gets for free;
- a cell's latency, from its execute_request (sent by a jupyter_client in this process) to the
  cell's first line (printed after a CUDA call): with no hint (the cell's CUDA call resumes the
  kernel), with the hint given HINT_DELAYS seconds before the cell (0: at the same moment), and
  for the floor the same cell on the kernel not suspended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_client import BlockingKernelClient  # noqa: E402
from private_machine import private_machine  # noqa: E402
from support import (  # noqa: E402
    CUDA_PRELUDE,
    CheckpointTarget,
    JupyterProcess,
    compile_sim_program,
    kernel_client,
    write_vgpu_kernelspec,
    written_with_a_pattern,
)

from jupyter_vgpu.holders.checkpoint import CheckpointController  # noqa: E402
from jupyter_vgpu.model import use_simulator  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
BANDWIDTH = 7_000_000_000  # bytes per second
DEVICE = "name=bench GPU,memory=16GiB,sms=132,context_memory=0"
HINT_DELAYS = (0.0, 0.25, 0.5, 1.0)  # seconds between the wake hint and the cell
POLL = 0.005  # seconds between two readings of the slice while waiting for it to be back
MARKER = "first line"
# The kernel holds SIZE and writes 1 MiB of it: a checkpoint moves an allocation once written,
# all of it (paced at the bandwidth; the pages never written take no host memory).
HOLD = (
    CUDA_PRELUDE
    + """
pointer = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t({size})) == 0
"""
    + written_with_a_pattern("pointer", 1 << 20)
)
FIRST_LINE = f"print({MARKER!r}, allocate(1 << 20), flush=True)\nprint('intact', intact())"


def build(workdir: Path) -> Path:
    runpy.run_path(str(ROOT / "native" / "build.py"))["build"]()
    return compile_sim_program("checkpoint_probe", workdir)


def run_cell(client: BlockingKernelClient, code: str) -> tuple[float, str]:
    """Seconds from the cell's execute_request to its stream output with MARKER, and all its
    stream output."""
    started = time.perf_counter()
    msg_id = client.execute(code)
    first, outputs = None, []
    while True:
        msg = client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
            if first is None and MARKER in msg["content"]["text"]:
                first = time.perf_counter() - started
        elif msg["msg_type"] == "error":
            raise AssertionError(f"the cell failed: {msg['content']}")
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert first is not None, f"the cell printed no {MARKER!r}: {outputs}"
    return first, "".join(outputs)


def cell_after_suspend(workdir: Path, size: int, repeats: int) -> None:
    """Resume-on-cell against wake-ahead: a kernel's cell after a suspend (module docstring)."""
    runtime = workdir / "runtime"
    data = workdir / "data"
    write_vgpu_kernelspec(data / "kernels" / "vgpu-bench", "vGPU bench", {"memory": f"{size // MIB + 1024}MiB"})
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "LD_LIBRARY_PATH")}
    env.update(
        JUPYTER_CONFIG_DIR=str(workdir / "config"),
        JUPYTER_DATA_DIR=str(data),
        JUPYTER_RUNTIME_DIR=str(runtime),
        JUPYTER_PREFER_ENV_PATH="0",
        VGPU_SIM_STATE=str(workdir / "server-sim.state"),
        VGPU_SIM_DEVICES=DEVICE,
        VGPU_SIM_CHECKPOINT_BANDWIDTH=str(BANDWIDTH),
    )
    server = JupyterProcess(
        env,
        workdir / "server.log",
        "vgpu-bench",
        "--VGPUApp.simulate=True",
        f"--VGPUApp.ledger_path={workdir / 'ledger.sqlite'}",
        f"--VGPUApp.region_dir={workdir / 'regions'}",
    )
    client, kernel_id = None, None
    try:
        kernel_id = server.api("POST", "api/vgpu/kernels", {"name": "vgpu-bench"})["kernel"]["id"]
        client = kernel_client(runtime / f"kernel-{kernel_id}.json", timeout=120)
        client.wait_for_ready(timeout=120)
        reply = client.execute_interactive(HOLD.format(size=size), timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        slices = f"api/vgpu/slices/{kernel_id}"

        def slice_now() -> dict:
            (found,) = [s for s in server.api("GET", "api/vgpu/slices") if s["kernel_id"] == kernel_id]
            return found

        def suspend() -> None:
            suspended = server.api("POST", f"{slices}/suspend", {})
            assert suspended["state"] == "suspended" and suspended["host_memory_bytes"] >= size, suspended

        # Hint to ready: from POST .../wake until the slice reads running with no place in line.
        ready: list[float] = []
        for _ in range(repeats):
            suspend()
            hinted = time.perf_counter()
            server.api("POST", f"{slices}/wake", {})
            while not ((now := slice_now())["state"] == "running" and now["queue"] is None):
                time.sleep(POLL)
            ready.append(time.perf_counter() - hinted)
            seconds, output = run_cell(client, FIRST_LINE)  # back whole: no wait, the pattern intact
            assert {f"{MARKER} 0", "intact True"} <= set(output.splitlines()) and "jupyter-vgpu:" not in output, output

        # A cell's latency: no hint, the hint some seconds before, and the kernel not suspended.
        ways = ["no hint", *(f"hint {delay:g} s before" for delay in HINT_DELAYS), "not suspended"]
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats):
            for way, seen in times.items():
                if way != "not suspended":
                    suspend()
                if way.startswith("hint"):
                    delay = float(way.split()[1])
                    hinted = time.monotonic()
                    server.api("POST", f"{slices}/wake", {})
                    time.sleep(max(0.0, hinted + delay - time.monotonic()))  # the user reads the cell
                seconds, output = run_cell(client, FIRST_LINE)
                assert {f"{MARKER} 0", "intact True"} <= set(output.splitlines()), output
                if way == "no hint":
                    assert "waiting for room" in output, output  # the cell's CUDA call resumed it
                seen.append(seconds)
        runs = ", ".join(f"{v * 1000:.0f}" for v in ready)
        print(
            f"\na kernel's cell after a suspend, {size / GIB:g} GiB held ({size / BANDWIDTH * 1000:.0f} ms of copy);"
            f" median of {repeats} (all runs, ms)"
        )
        print(f"{'hint to ready':>20} {statistics.median(ready) * 1000:>8.1f} ms   ({runs})")
        print("execute_request to the cell's first line:")
        for way, values in times.items():
            runs = ", ".join(f"{v * 1000:.0f}" for v in values)
            print(f"{way:>20} {statistics.median(values) * 1000:>8.1f} ms   ({runs})")
    finally:
        if client is not None:
            client.stop_channels()
        if kernel_id is not None:
            with contextlib.suppress(OSError):  # the server's stop ends it anyway
                server.api("DELETE", f"api/kernels/{kernel_id}")
        if server.stop() is None:
            print(f"jupyter server did not stop; its log: {workdir / 'server.log'}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one run each: proves the benchmark runs")
    args = parser.parse_args()
    sizes, repeats = ([64 * MIB, 256 * MIB], 1) if args.smoke else ([256 * MIB, GIB, 2 * GIB, 4 * GIB], 3)

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        workdir = Path(tmp)
        program = build(workdir)
        os.environ.update(VGPU_SIM_STATE=str(workdir / "sim.state"), VGPU_SIM_DEVICES=DEVICE)
        use_simulator()  # this process is the controller: the simulated driver, cuInit once
        controller = CheckpointController()
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES")}
        env.update(
            LD_LIBRARY_PATH=str(ROOT / "jupyter_vgpu" / "_native" / "sim"),
            VGPU_SIM_CHECKPOINT_BANDWIDTH=str(BANDWIDTH),
        )
        print(f"copy bandwidth {BANDWIDTH / 1e9:g} GB/s; median of {repeats} run(s) per size")
        print(f"{'size':>8} {'copy s':>7} {'suspend s':>10} {'resume s':>9} {'suspend GB/s':>13} {'resume GB/s':>12}")
        for size in sizes:
            target = CheckpointTarget(program, env, str(size))
            suspends, resumes = [], []
            try:
                for _ in range(repeats):
                    suspension = controller.suspend([target.pid], lock_timeout=10)
                    assert suspension.memory == size, f"NVML showed {suspension.memory} bytes, not {size}"
                    resumes.append(controller.resume(suspension))
                    suspends.append(suspension.seconds)
                    assert target.ask("verify", "intact") == "1", "the pattern did not survive"
            finally:
                target.kill()
            suspend, resume = statistics.median(suspends), statistics.median(resumes)
            print(
                f"{size / GIB:>6.2f}Gi {size / BANDWIDTH:>7.3f} {suspend:>10.3f} {resume:>9.3f}"
                f" {size / suspend / 1e9:>13.2f} {size / resume / 1e9:>12.2f}"
            )
        cell_after_suspend(workdir, 256 * MIB if args.smoke else 4 * GIB, 1 if args.smoke else 5)


if __name__ == "__main__":
    with private_machine("vgpu-bench-suspend-"):
        main()
