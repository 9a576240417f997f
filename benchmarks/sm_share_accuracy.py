"""How closely a slice's SM utilisation follows its share, how evenly its processes split it,
and how fast a burst slice yields.

    python benchmarks/sm_share_accuracy.py            # shares 10..90 %, 1 and 2 launch threads
    python benchmarks/sm_share_accuracy.py --smoke    # one share: proves it runs

Runs tests/programs/pacing_load.c (a launch loop that keeps the device fed) inside a slice on
the simulated GPU and reads SM utilisation per process from NVML (tests/programs/pacing_monitor.c,
outside the slice), as an operator's tool would: the window is the third second of the run.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_vgpu.holders.region import Region  # noqa: E402

DEVICE = "name=bench GPU,memory=16GiB,sms=100,context_memory=0,block_ns=50000"


def realtime_us() -> int:
    return time.time_ns() // 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one share: proves the benchmark runs")
    args = parser.parse_args()
    shares = [30] if args.smoke else [10, 30, 50, 70, 90]
    thread_counts = [1] if args.smoke else [1, 2]

    runpy.run_path(str(ROOT / "native" / "build.py"))["build"]()
    native = ROOT / "jupyter_vgpu" / "_native"
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-sm-") as tmp:
        tmp = Path(tmp)
        programs = {}
        for name in ("pacing_load", "pacing_monitor"):
            programs[name] = tmp / name
            subprocess.run(
                [os.environ.get("CC", "cc"), "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{ROOT / 'native' / 'include'}",
                 "-o", str(programs[name]), str(ROOT / "tests" / "programs" / f"{name}.c"), f"-L{native / 'sim'}",
                 "-l:libcuda.so.1", "-l:libnvidia-ml.so.1", "-lpthread"],
                check=True,
            )
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES")}
        base.update(LD_LIBRARY_PATH=str(native / "sim"), VGPU_SIM_STATE=str(tmp / "sim.state"), VGPU_SIM_DEVICES=DEVICE)
        uuid = subprocess.run(
            [sys.executable, "-c", "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)))"],
            env=base, check=True, capture_output=True, text=True).stdout.strip()

        def slice_env(name: str, share: int, policy: str) -> dict[str, str]:
            region = Region.create(tmp / f"{name}.region", memory_limit=0, sm_share=share, policy=policy,
                                   device_uuid=uuid, device_index=0)
            return {**base, "LD_PRELOAD": str(native / "libvgpu.so"), "VGPU_REGION": str(region.path)}

        def start(env, *extra: str) -> tuple[subprocess.Popen, int, int]:
            process = subprocess.Popen([str(programs["pacing_load"]), *extra], env=env, stdout=subprocess.PIPE, text=True)
            pid = int(process.stdout.readline().split()[1])
            start_us = int(process.stdout.readline().split()[1])
            return process, pid, start_us

        def utilisation(since_us: int) -> dict[int, int]:
            out = subprocess.run([str(programs["pacing_monitor"]), "since", str(since_us)], env=base,
                                 check=True, capture_output=True, text=True).stdout
            return {int(w[1]): int(w[2]) for w in (line.split() for line in out.splitlines()) if w and w[0] == "s"}

        def wait_until(moment_us: int) -> None:
            time.sleep(max(0.0, (moment_us - realtime_us()) / 1e6))

        print("\nSM utilisation of a hard slice, NVML, seconds 2-3 of a saturating launch loop (100 SMs)")
        print(f"{'share %':>8}{'threads':>9}{'measured %':>12}{'error pp':>10}")
        for share in shares:
            for threads in thread_counts:
                process, pid, start_us = start(slice_env(f"hard-{share}-{threads}", share, "hard"),
                                               "--seconds", "3.3", "--threads", str(threads))
                wait_until(start_us + 3_000_000)
                measured = utilisation(start_us + 2_000_000).get(pid, 0)
                process.wait()
                print(f"{share:>8}{threads:>9}{measured:>12}{measured - share:>+10}")

        print("\nSeveral saturating processes in one 40 % hard slice, NVML, seconds 2-3 (the first one's)")
        print(f"{'processes':>10}{'threads each':>14}{'slice %':>9}{'each process %':>22}{'even split %':>14}")
        share = 40
        layouts = [(1, 1)] if args.smoke else [(1, 1), (1, 3), (1, 1, 1, 1)]
        for layout in layouts:
            env = slice_env(f"split-{len(layout)}-{max(layout)}", share, "hard")
            loads = [start(env, "--seconds", "3.3", "--threads", str(threads)) for threads in layout]
            first_start_us = loads[0][2]
            wait_until(first_start_us + 3_000_000)
            measured = utilisation(first_start_us + 2_000_000)
            for process, _, _ in loads:
                process.wait()
            each = [measured.get(pid, 0) for _, pid, _ in loads]
            threads = "/".join(str(t) for t in layout)
            print(f"{len(layout):>10}{threads:>14}{sum(each):>9}{' '.join(map(str, each)):>22}"
                  f"{share / len(layout):>14.1f}")

        share = 30
        process, pid, start_us = start(slice_env("burst", share, "burst"), "--seconds", "3.0")
        wait_until(start_us + 1_000_000)
        alone = utilisation(start_us + 500_000).get(pid, 0)
        other, other_pid, other_start_us = start(slice_env("other", 50, "hard"), "--seconds", "1.5")
        # Utilisation over successive 50 ms windows after the other slice starts: when does the
        # burst slice come back to its share?
        yielded_ms = None
        for end_ms in range(50, 1001, 50):
            wait_until(other_start_us + end_ms * 1000)
            now = utilisation(other_start_us + (end_ms - 50) * 1000).get(pid, 0)
            if now <= share + 3:
                yielded_ms = end_ms
                break
        process.wait()
        other.wait()
        print(f"\nburst slice ({share} % share): {alone} % of the device alone; back at <= {share + 3} % "
              f"in the 50 ms window ending {yielded_ms} ms after another slice started (goal: 200 ms)")


if __name__ == "__main__":
    main()
