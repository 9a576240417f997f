"""How closely a slice's SM utilisation follows its share, how evenly its processes split it,
and how fast a burst slice yields.

    python benchmarks/sm_share_accuracy.py            # shares 10..90 %, 1 and 2 launch threads
    python benchmarks/sm_share_accuracy.py --smoke    # one share: proves it runs
    python benchmarks/sm_share_accuracy.py --against 13f21f4   # that commit's limiter beside this tree's

Runs tests/programs/pacing_load.c (a launch loop that keeps the device fed) inside a slice on
the simulated GPU and reads SM utilisation per process from NVML (tests/programs/pacing_monitor.c,
outside the slice), as an operator's tool would: the window is the third second of the run.

Steady and on/off loads (issue 12): per share, a steady loop and a notebook-like one (200 ms of
launches, 300 ms idle), each measured on 100 ms windows (a query every 10 ms of the last 100 ms:
what a neighbour's latency-sensitive kernels feel) and over 1 s. For the on/off load only
windows wholly inside a busy phase count, the first phase (the controller learning what a token
costs) left out; its 1 s figure is the utilisation of the busy phases of each second (two phases,
each read from its start once it ended), so the idle time does not hide an excess. Windows are
exact on the simulated device's clock: a query that runs late moves its window, never blurs it.

The limiter's own thread kept waiting for a CPU (issue 27): the launch loop runs alone on one CPU
while the slice's controller thread waits for the other at every wake (SCHED_BATCH behind a
CPU-bound process there: tests/support.py's controller_kept_from_its_cpu), as on a busy machine.
With --against REV, REV's libvgpu.so (built from git) runs in the same table, rounds alternating.
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from interposer_overhead import build_revision  # noqa: E402
from private_machine import private_machine  # noqa: E402
from support import compile_sim_program, controller_kept_from_its_cpu, cpu_waits, watched_utilisation  # noqa: E402

from jupyter_vgpu.holders.region import Region  # noqa: E402

DEVICE = "name=bench GPU,memory=16GiB,sms=100,context_memory=0,block_ns=50000"


def realtime_us() -> int:
    return time.time_ns() // 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one share: proves the benchmark runs")
    parser.add_argument(
        "--against", metavar="REV", help="also run REV's libvgpu.so in the table of a controller kept from its CPU"
    )
    args = parser.parse_args()
    shares = [30] if args.smoke else [10, 30, 50, 70, 90]
    thread_counts = [1] if args.smoke else [1, 2]

    runpy.run_path(str(ROOT / "native" / "build.py"))["build"]()
    native = ROOT / "jupyter_vgpu" / "_native"
    with tempfile.TemporaryDirectory(prefix="vgpu-bench-sm-") as tmp:
        tmp = Path(tmp)
        programs = {name: compile_sim_program(name, tmp) for name in ("pacing_load", "pacing_monitor")}
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES")}
        base.update(LD_LIBRARY_PATH=str(native / "sim"), VGPU_SIM_STATE=str(tmp / "sim.state"), VGPU_SIM_DEVICES=DEVICE)
        uuid = subprocess.run(
            [
                sys.executable,
                "-c",
                "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)))",
            ],
            env=base,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

        def slice_env(name: str, share: int, policy: str, library: Path = native / "libvgpu.so") -> dict[str, str]:
            region = Region.create(
                tmp / f"{name}.region", memory_limit=0, sm_share=share, policy=policy, device_uuid=uuid, device_index=0
            )
            return {**base, "LD_PRELOAD": str(library), "VGPU_REGION": str(region.path)}

        def start(env, *extra: str, prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int, int]:
            process = subprocess.Popen(
                [*prefix, str(programs["pacing_load"]), *extra], env=env, stdout=subprocess.PIPE, text=True
            )
            pid = int(process.stdout.readline().split()[1])
            start_us = int(process.stdout.readline().split()[1])
            return process, pid, start_us

        def utilisation_until(since_us: int) -> tuple[int, dict[int, int]]:
            """(when the window ended, the utilisation of each process over [since_us, then])."""
            out = subprocess.run(
                [str(programs["pacing_monitor"]), "since", str(since_us)],
                env=base,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            lines = [line.split() for line in out.splitlines()]
            return int(lines[0][1]), {int(w[1]): int(w[2]) for w in lines if w and w[0] == "s"}

        def utilisation(since_us: int) -> dict[int, int]:
            return utilisation_until(since_us)[1]

        def wait_until(moment_us: int) -> None:
            time.sleep(max(0.0, (moment_us - realtime_us()) / 1e6))

        def windows_and_phases(share: int, seconds: float, busy_ms: int, idle_ms: int, phases: int):
            """Runs the loop in a hard slice while a watcher reads 100 ms windows; returns
            (start_us, [(end_us, util)], {phase: its utilisation}): flat out when idle_ms is 0,
            with the third second as phase 0."""
            args = ["--seconds", str(seconds)]
            if idle_ms:
                args += ["--busy-ms", str(busy_ms), "--idle-ms", str(idle_ms)]
            process, pid, start_us = start(slice_env(f"windows-{share}-{idle_ms}", share, "hard"), *args)
            watcher = subprocess.Popen(
                [str(programs["pacing_monitor"]), "watch", "10", str(int(seconds * 1000)), "100"],
                env=base,
                stdout=subprocess.PIPE,
                text=True,
            )
            phase_util: dict[int, float] = {}
            if not idle_ms:
                wait_until(start_us + 3_000_000)
                phase_util[0] = utilisation(start_us + 2_000_000).get(pid, 0)  # the third second
            else:
                # Each busy phase from its start, read 15 ms after it ends (its queued kernels
                # have run; the slice is idle until the next), scaled from the query's window.
                cycle_us = (busy_ms + idle_ms) * 1000
                for phase in range(1, phases + 1):
                    begin_us = start_us + phase * cycle_us
                    wait_until(begin_us + (busy_ms + 15) * 1000)
                    end_us, measured = utilisation_until(begin_us)
                    phase_util[phase] = measured.get(pid, 0) * (end_us - begin_us) / (busy_ms * 1000)
            out = watcher.communicate()[0]
            process.wait()
            return start_us, watched_utilisation(out, pid), phase_util

        def worst_and_mean(errors: list[float]) -> str:
            return f"{max(errors):+.1f} / {statistics.mean(errors):+.1f}" if errors else "-"

        print("\nSM utilisation of a hard slice, NVML, seconds 2-3 of a saturating launch loop (100 SMs)")
        print(f"{'share %':>8}{'threads':>9}{'measured %':>12}{'error pp':>10}")
        for share in shares:
            for threads in thread_counts:
                process, pid, start_us = start(
                    slice_env(f"hard-{share}-{threads}", share, "hard"), "--seconds", "3.3", "--threads", str(threads)
                )
                wait_until(start_us + 3_000_000)
                measured = utilisation(start_us + 2_000_000).get(pid, 0)
                process.wait()
                print(f"{share:>8}{threads:>9}{measured:>12}{measured - share:>+10}")

        print(
            "\nA hard slice, steady and on/off (200 ms busy / 300 ms idle) loops; error pp vs the share, worst / mean"
        )
        print(
            f"{'share %':>8}{'steady 1 s':>12}{'steady 100 ms':>17}{'on/off busy 100 ms':>21}"
            f"{'on/off busy 1 s':>18}{'busy windows':>14}"
        )
        busy_ms, idle_ms = 200, 300
        phases = 4 if args.smoke else 8
        on_off_seconds = (phases + 1) * (busy_ms + idle_ms) / 1000 + 0.05
        for share in [60] if args.smoke else [10, 30, 60, 90]:
            start_us, series, steady = windows_and_phases(share, 3.1, 0, 0, 0)
            steady_100 = [util - share for end_us, util in series if 1_000_000 <= end_us - start_us <= 3_000_000]
            start_us, series, phase_util = windows_and_phases(share, on_off_seconds, busy_ms, idle_ms, phases)
            cycle_us = (busy_ms + idle_ms) * 1000
            busy_100 = []
            for end_us, util in series:
                phase, into_us = divmod(end_us - start_us, cycle_us)
                if 1 <= phase <= phases and 100_000 <= into_us <= busy_ms * 1000:
                    busy_100.append(util - share)
            seconds_1s = [(phase_util[k] + phase_util[k + 1]) / 2 - share for k in range(1, phases, 2)]
            print(
                f"{share:>8}{steady[0] - share:>+12}{worst_and_mean(steady_100):>17}"
                f"{worst_and_mean(busy_100):>21}{worst_and_mean(seconds_1s):>18}{len(busy_100):>14}"
            )

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
            print(
                f"{len(layout):>10}{threads:>14}{sum(each):>9}{' '.join(map(str, each)):>22}"
                f"{share / len(layout):>14.1f}"
            )

        share = 30
        process, pid, start_us = start(slice_env("burst", share, "burst"), "--seconds", "3.0")
        wait_until(start_us + 1_000_000)
        alone = utilisation(start_us + 500_000).get(pid, 0)
        other, _other_pid, other_start_us = start(slice_env("other", 50, "hard"), "--seconds", "1.5")
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
        print(
            f"\nburst slice ({share} % share): {alone} % of the device alone; back at <= {share + 3} % "
            f"in the 50 ms window ending {yielded_ms} ms after another slice started (goal: 200 ms)"
        )

        builds = [("this tree", native / "libvgpu.so")]
        if args.against:
            builds.insert(0, (args.against, build_revision(args.against, tmp)))
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            print("\nthe limiter's thread kept from its CPU: needs two CPUs, this machine lends one")
            return
        print(
            "\nA hard slice whose limiter thread waits for a CPU at every wake, NVML, seconds 2-4; "
            "the share of that time each thread waited for a CPU"
        )
        print(f"{'share %':>8}{'build':>12}{'measured %':>12}{'controller waited %':>21}{'launch waited %':>17}")
        for round_ in range(1 if args.smoke else 3):
            for share in [60] if args.smoke else [20, 60]:
                for name, library in builds:
                    env = slice_env(f"late-{round_}-{share}-{len(name)}", share, "hard", library)
                    process, pid, start_us = start(env, "--seconds", "4.2", prefix=("taskset", "-c", str(cpus[0])))
                    with controller_kept_from_its_cpu(pid, cpus[1]) as pacer:
                        wait_until(start_us + 2_000_000)
                        before = cpu_waits(pid)
                        wait_until(start_us + 4_000_000)
                        after = cpu_waits(pid)
                        measured = utilisation(start_us + 2_000_000).get(pid, 0)
                        process.wait()
                    waited = {tid: (after[tid] - before.get(tid, 0)) / 2e9 for tid in after}
                    launch = sum(fraction for tid, fraction in waited.items() if tid != pacer)
                    print(f"{share:>8}{name:>12}{measured:>12}{100 * waited.get(pacer, 0):>21.0f}{100 * launch:>17.1f}")


if __name__ == "__main__":
    with private_machine("vgpu-bench-sm-"):
        main()
