"""How long suspending a kernel's process to host memory and resuming it take, against how much
device memory it holds, on the simulated GPU with the copy bandwidth set to a measured real one.

    python benchmarks/suspend_resume.py            # about a minute; needs ~13 GiB of free RAM
    python benchmarks/suspend_resume.py --smoke    # a few seconds, as CI runs it

A target process (tests/programs/checkpoint_probe.c) allocates SIZE bytes and writes a pattern
into all of them; this process is the controller, as the server is
(jupyter_vgpu.holders.checkpoint.CheckpointController): suspend = lock (its queued work ends),
read NVML, checkpoint (the bytes to host memory, the device freed); resume = check NVML's free
memory, restore (the bytes back), unlock. The pattern is checked after every resume.

The simulated driver copies at VGPU_SIM_CHECKPOINT_BANDWIDTH: 7 GB/s here, the middle of what
others measured restoring on a B200 (16 GB in 2.8 s, 145 GB in 17.9 s: 5.7 to 8.1 GB/s;
FIELD-NOTES "Suspending a CUDA process"). So these figures are the API's own overhead on top of
that copy time (the `copy` column), not a real GPU's; framework_checks.py measures one.
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support import CheckpointTarget, compile_sim_program  # noqa: E402

from jupyter_vgpu.holders.checkpoint import CheckpointController  # noqa: E402
from jupyter_vgpu.model import use_simulator  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
BANDWIDTH = 7_000_000_000  # bytes per second
DEVICE = "name=bench GPU,memory=16GiB,sms=132,context_memory=0"


def build(workdir: Path) -> Path:
    runpy.run_path(str(ROOT / "native" / "build.py"))["build"]()
    return compile_sim_program("checkpoint_probe", workdir)


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


if __name__ == "__main__":
    main()
