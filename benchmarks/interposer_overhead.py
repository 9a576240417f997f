"""What libvgpu.so adds to each driver call and to a process's start-up, and how fast a resize
reaches a running program.

    python benchmarks/interposer_overhead.py            # full run (about a minute)
    python benchmarks/interposer_overhead.py --smoke    # a few seconds, as CI runs it

Runs the same program (benchmarks/bench_calls.c) straight on the simulated driver and under
libvgpu.so, side by side and alternating, and reports the fastest run of each. The simulated
driver's kernels last 1 ns here so launch timings measure the call path, not the device.

Start-up (benchmarks/bench_startup.c): exec to exit of a small program making about 1000
driver calls (a context, then allocations, frees, memory queries and launches), and of the
same program making none (a tool that merely inherits LD_PRELOAD), bare and in a slice,
alternating run by run; the fastest and the median of each are reported as time added. Every
DataLoader worker and subprocess of a notebook pays it. Such processes join a slice whose first
process (the kernel) has measured a context already; the first process of a fresh slice, which
measures it, is timed on its own row.

Two launching threads are timed twice: on one simulated device, where both threads take turns
on that device's timeline (one atomic word every launch of every process updates, so the
baseline itself swings with how the two threads collide there), and each on its own simulated
device, where the driver shares nothing between them and any cost the interposer adds by
making threads contend shows undiluted.
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

from private_machine import private_machine  # noqa: E402

from jupyter_vgpu.holders.region import Region  # noqa: E402

GOALS_NS = {"launch": 10, "launch_limited": 30, "alloc_free": 150, "mem_get_info": 50, "get_proc_address": 200}
HAMI_CORE_NS = {"launch": 21, "alloc_free": 665, "mem_get_info": 578, "get_proc_address": 2100}
STARTUP_GOAL_MS = 0.5  # added to a process's start-up, 1000 calls or none
HAMI_CORE_STARTUP_MS = 3.0  # issue 8: ~4 ms under HAMi-core for a program that runs in ~1 ms bare
DEVICE = "name=bench GPU,memory=80GiB,sms=132,context_memory=0,block_ns=1"


def build(workdir: Path) -> tuple[Path, Path, Path, Path, Path]:
    runpy.run_path(str(ROOT / "native" / "build.py"))["build"]()
    native = ROOT / "jupyter_vgpu" / "_native"
    programs = []
    for name in ("bench_calls", "bench_resize", "bench_startup"):
        executable = workdir / name
        subprocess.run(
            [
                os.environ.get("CC", "cc"),
                "-std=c11",
                "-D_GNU_SOURCE",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-I{ROOT / 'native' / 'include'}",
                "-o",
                str(executable),
                str(ROOT / "benchmarks" / f"{name}.c"),
                f"-L{native / 'sim'}",
                "-l:libcuda.so.1",
                "-lpthread",
            ],
            check=True,
        )
        programs.append(executable)
    return native / "libvgpu.so", native / "sim", *programs


def device_uuid(env: dict[str, str]) -> str:
    code = "import pynvml as n; n.nvmlInit(); print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="few iterations: proves the benchmark runs")
    args = parser.parse_args()
    iterations = {"launch": 200_000, "alloc_free": 100_000, "mem_get_info": 1_000_000, "get_proc_address": 200_000}
    repeats, resizes, startups = (11, 200, 51)
    if args.smoke:
        iterations = {name: count // 100 for name, count in iterations.items()}
        repeats, resizes, startups = (1, 10, 3)

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        workdir = Path(tmp)
        vgpu, sim_dir, bench_calls, bench_resize, bench_startup = build(workdir)
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES")}
        base.update(LD_LIBRARY_PATH=str(sim_dir), VGPU_SIM_STATE=str(workdir / "sim.state"), VGPU_SIM_DEVICES=DEVICE)
        uuid = device_uuid(base)

        def slice_env(name: str, **limits) -> tuple[dict[str, str], Region]:
            region = Region.create(workdir / f"{name}.region", device_uuid=uuid, device_index=0, **limits)
            return {**base, "LD_PRELOAD": str(vgpu), "VGPU_REGION": str(region.path)}, region

        unlimited, _ = slice_env("unlimited", memory_limit=0)
        capped, _ = slice_env("capped", memory_limit=64 << 30)
        limited, _ = slice_env("limited", memory_limit=64 << 30, sm_share=50)

        def timed(env, call: str, threads: int, devices: int) -> float:
            if devices > 1:  # the same device again, under its own index and UUID; its own state
                env = {
                    **env,
                    "VGPU_SIM_DEVICES": ";".join([DEVICE] * devices),
                    "VGPU_SIM_STATE": str(workdir / f"sim-{devices}.state"),
                }
            out = subprocess.run(
                [str(bench_calls), call, str(iterations[call]), str(threads)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            return float(out.stdout)

        def compare(
            label: str, call: str, threads: int, env: dict[str, str], goal: str | None, devices: int = 1
        ) -> tuple:
            direct, interposed = [], []
            for _ in range(repeats):  # alternate so drift in machine load hits both alike
                direct.append(timed(base, call, threads, devices))
                interposed.append(timed(env, call, threads, devices))
            # The fastest of many runs: the run least disturbed by the rest of a noisy machine.
            d, i = min(direct), min(interposed)
            hami = HAMI_CORE_NS.get(goal.replace("_limited", "")) if goal else None
            return label, d, i, i - d, GOALS_NS[goal] if goal else "-", hami

        rows = [
            compare("cuLaunchKernel, 1 thread, no SM limit", "launch", 1, capped, "launch"),
            compare("cuLaunchKernel, 2 threads, no SM limit", "launch", 2, capped, "launch", devices=2),
            compare("  the 2 threads on one device's timeline", "launch", 2, capped, None),
            compare("cuLaunchKernel, 1 thread, limiter on (50 %)", "launch", 1, limited, "launch_limited"),
            compare("cuLaunchKernel, 2 threads, limiter on (50 %)", "launch", 2, limited, "launch_limited", devices=2),
            compare("  the 2 threads on one device's timeline", "launch", 2, limited, None),
            compare("cuMemAlloc_v2 + cuMemFree_v2 (capped)", "alloc_free", 1, capped, "alloc_free"),
            compare("cuMemGetInfo_v2 (capped)", "mem_get_info", 1, capped, "mem_get_info"),
            compare('cuGetProcAddress_v2 ("cuMemAlloc")', "get_proc_address", 1, unlimited, "get_proc_address"),
        ]
        print(f"\n{'call':<46}{'direct ns':>11}{'vgpu ns':>10}{'added ns':>10}{'goal':>7}{'HAMi-core':>11}")
        for label, d, i, added, goal, hami in rows:
            print(f"{label:<46}{d:>11.1f}{i:>10.1f}{added:>10.1f}{goal:>7}{(str(hami) if hami else '-'):>11}")

        # Start-up: the spawner runs bare itself and gives LD_PRELOAD to the slice's runs only.
        # A later process of a slice counts its context at the size the slice's first process
        # measured, so the first process of a fresh slice is timed apart (a new slice each run).
        def startup_runs(env: dict[str, str], rounds: int, calls: int) -> list[tuple[float, float]]:
            out = subprocess.run(
                [str(bench_startup), "spawn", str(rounds), str(vgpu), "--", str(bench_startup), "calls", str(calls)],
                env={k: v for k, v in env.items() if k != "LD_PRELOAD"},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            return [tuple(int(ns) / 1e6 for ns in line.split()) for line in out.splitlines()]

        def first_process_runs(rounds: int) -> list[tuple[float, float]]:
            runs = []
            for round_ in range(rounds):
                env, region = slice_env(f"fresh-{round_}", memory_limit=64 << 30)
                runs += startup_runs(env, 1, 1000)
                region.close()
            return runs

        print(
            f"\n{'process start-up, exec to exit, ' + str(startups) + ' runs':<46}{'bare ms':>11}{'vgpu ms':>10}"
            f"{'added ms':>10}{'goal':>7}{'HAMi-core':>11}"
        )
        # The goal is for the processes a slice starts (workers, subprocesses); its first
        # process, the kernel itself, starts once.
        for label, runs, goal, hami in (
            ("about 1000 driver calls", startup_runs(capped, startups, 1000), STARTUP_GOAL_MS, HAMI_CORE_STARTUP_MS),
            ("  the same, a slice's first process", first_process_runs(startups), "-", "-"),
            ("no driver call", startup_runs(capped, startups, 0), STARTUP_GOAL_MS, "-"),
        ):
            bare, sliced = zip(*runs, strict=True)
            for how, pick in (("fastest", min), ("median", statistics.median)):
                d, i = pick(bare), pick(sliced)
                print(f"{label + ', ' + how:<46}{d:>11.3f}{i:>10.3f}{i - d:>10.3f}{goal:>7}{hami:>11}")

        # Resize latency: publish a new cap, see when a program polling cuMemGetInfo notices it.
        env, region = slice_env("resize", memory_limit=1 << 30)
        stop_total = (1 << 30) + resizes * (1 << 20)
        child = subprocess.Popen([str(bench_resize), str(stop_total)], env=env, stdout=subprocess.PIPE, text=True)
        child.stdout.readline()  # the initial cap: the program is attached and polling
        latencies = []
        for step in range(1, resizes + 1):
            published = time.monotonic_ns()
            region.set_limits(memory_limit=(1 << 30) + step * (1 << 20))
            seen_ns, total = map(int, child.stdout.readline().split())
            assert total == (1 << 30) + step * (1 << 20)
            latencies.append((seen_ns - published) / 1000)
        child.wait()
        latencies.sort()
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"\nresize latency (publish -> next cuMemGetInfo sees it), {resizes} resizes: "
            f"p50 {p50:.1f} us, p99 {p99:.1f} us, max {latencies[-1]:.1f} us"
        )


if __name__ == "__main__":
    with private_machine("vgpu-bench-calls-"):
        main()
