"""What libvgpu.so adds to each driver call and to a process's start-up, and how fast a resize
reaches a running program.

    python benchmarks/interposer_overhead.py            # full run (about a minute)
    python benchmarks/interposer_overhead.py --smoke    # a few seconds, as CI runs it

Runs the same program (benchmarks/bench_calls.c) straight on the simulated driver and under
libvgpu.so in interleaved pairs (the order alternating from pair to pair), in the same
environment (LD_PRELOAD renamed for the runs without it), and reports for each row the median
of each side and the median of the pairs' differences ("added"), for wall time per call (as the
calling thread sees it) and CPU time per call (every thread of the process, the program's and
libvgpu.so's own: the limiter's controller, the monitor; not the time other programs ran on a
busy machine). Beside them, where valgrind is installed, the instructions per call that
callgrind counts in the calling thread's loop (--toggle-collect on bench_calls's `run`), from
two runs of different lengths, so one-off costs cancel: a figure the machine's load does not
move. The simulated driver's kernels last 1 ns here so launch timings measure the call path,
not the device.

Start-up (benchmarks/bench_startup.c): exec to exit of a small program making about 1000
driver calls (a context, then allocations, frees, memory queries and launches), and of the
same program making none (a tool that merely inherits LD_PRELOAD), bare and in a slice,
alternating run by run; each bare run is paired with the sliced run next to it, and the rows
give the median of each and the median (and fastest) of the pairs' differences. Every
DataLoader worker and subprocess of a notebook pays it. Such processes join a slice whose first
process (the kernel) has measured a context already; the first process of a fresh slice, which
measures it, is timed on its own row, paired the same way.

Two launching threads are timed twice: on one simulated device, where both threads take turns
on that device's timeline (one atomic word every launch of every process updates, so the
baseline itself swings with how the two threads collide there), and each on its own simulated
device, where the driver shares nothing between them and any cost the interposer adds by
making threads contend shows undiluted.

    python benchmarks/interposer_overhead.py --against b33eae6   # that commit's libvgpu.so beside this tree's

--against REV judges a change to the interposer: it builds REV's libvgpu.so from git (`git archive`,
that revision's own native/build.py) beside this tree's, and times the per-call rows for the driver
alone, REV's interposer and this tree's, all over this tree's simulated driver and bench program,
in rounds: each round runs the three one after the other, in an order that rotates from round to
round, several times each, pinned to as many CPUs as the row has threads (where the machine lets
it). A round's "added" is its fastest run under an interposer minus its fastest on the driver; the
table gives both builds' median over the rounds with their range, and the median and range of the
difference within each round, so drift in the machine's load hits both builds alike.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
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

GOALS_NS = {
    "launch": 10,
    "launch_limited": 30,
    "alloc_free": 150,
    "mem_get_info": 50,
    "get_proc_address": 200,
    "gated": 5,
}
STARTUP_GOAL_MS = 0.5  # added to a process's start-up, 1000 calls or none
DEVICE = "name=bench GPU,memory=80GiB,sms=132,context_memory=0,block_ns=1"


def build_revision(revision: str, workdir: Path) -> Path:
    """libvgpu.so of `revision`, built from git by that revision's own native/build.py."""
    source = workdir / "revision"
    source.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "native"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    output = workdir / "revision-native"
    subprocess.run(
        [sys.executable, str(source / "native" / "build.py"), str(output)], check=True, stdout=subprocess.DEVNULL
    )
    return output / "libvgpu.so"


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


# The per-call rows: label, bench_calls's call, threads, the slice it runs in, goal (None: no
# goal, the row shows the simulator's contention), simulated devices.
CALL_ROWS: tuple[tuple[str, str, int, str, str | None, int], ...] = (
    ("cuLaunchKernel, 1 thread, no SM limit", "launch", 1, "capped", "launch", 1),
    ("cuLaunchKernel, 2 threads, no SM limit", "launch", 2, "capped", "launch", 2),
    ("  the 2 threads on one device's timeline", "launch", 2, "capped", None, 1),
    ("cuLaunchKernel, 1 thread, limiter on (50 %)", "launch", 1, "limited", "launch_limited", 1),
    ("cuLaunchKernel, 2 threads, limiter on (50 %)", "launch", 2, "limited", "launch_limited", 2),
    ("  the 2 threads on one device's timeline", "launch", 2, "limited", None, 1),
    ("cuMemAlloc_v2 + cuMemFree_v2 (capped)", "alloc_free", 1, "capped", "alloc_free", 1),
    ("cuMemGetInfo_v2 (capped)", "mem_get_info", 1, "capped", "mem_get_info", 1),
    ('cuGetProcAddress_v2 ("cuMemAlloc")', "get_proc_address", 1, "unlimited", "get_proc_address", 1),
    ("cuCtxGetCurrent (not hooked: the gate)", "gated", 1, "capped", "gated", 1),
)
# callgrind's two run lengths (calls), per call: the difference of the counts over the
# difference of the lengths is the cost of one call, start-up and warm-up left out.
CALLGRIND_CALLS = (20_000, 40_000)


def callgrind_instructions(program: Path, env: dict[str, str], call: str, workdir: Path) -> float | None:
    """Instructions per call of bench_calls's loop (one thread) under callgrind, or None without
    valgrind. Counted only inside `run` (the loop and what it calls: the interposer and the
    driver), so the monitor's and the controller's threads do not blur it."""
    if not shutil.which("valgrind"):
        return None
    counts = []
    for calls in CALLGRIND_CALLS:
        finished = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--toggle-collect=run*",
                f"--callgrind-out-file={workdir / 'callgrind.out'}",
                str(program),
                call,
                str(calls),
                "1",
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        collected = [line for line in finished.stderr.splitlines() if "Collected :" in line]
        counts.append(int(collected[-1].split(":")[-1]))
    # The warm-up runs calls / 10 + 1 more of them, inside `run` too.
    (short, long_), (count_short, count_long) = CALLGRIND_CALLS, counts
    return (count_long - count_short) / ((long_ + long_ // 10) - (short + short // 10))


SLICES = {
    "unlimited": {"memory_limit": 0},
    "capped": {"memory_limit": 64 << 30},
    "limited": {"memory_limit": 64 << 30, "sm_share": 50},
}


def without_interposer(env: dict[str, str]) -> dict[str, str]:
    """A slice's environment without the interposer: LD_PRELOAD renamed, every variable and its
    length kept. The program and the driver see an environment of the same size either way: the
    simulated driver reads variables on some calls, and the environment's size moves the stack,
    so a run with two variables fewer measured those differences as the interposer's cost."""
    return {("NO_PRELOAD" if name == "LD_PRELOAD" else name): value for name, value in env.items()}


def pinned_cpus(threads: int) -> set[int] | None:
    """The CPUs a row with `threads` launching threads is pinned to: the last ones this process
    may use, so that its runs do not wander between CPUs; None where there are too few."""
    allowed = sorted(os.sched_getaffinity(0))
    return set(allowed[-threads:]) if len(allowed) >= threads else None


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="few iterations: proves the benchmark runs")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="build libvgpu.so of git revision REV too and compare it with this tree's, call by call, "
        "in interleaved pinned rounds (the other parts of the benchmark are skipped)",
    )
    parser.add_argument(
        "--rounds", type=int, default=9, help="rounds of --against (each runs the driver alone and both builds 3 times)"
    )
    parser.add_argument("--no-callgrind", action="store_true", help="leave out the instruction counts")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, not {args.rounds}")
    iterations = {
        "launch": 200_000,
        "alloc_free": 100_000,
        "mem_get_info": 1_000_000,
        "get_proc_address": 200_000,
        "gated": 2_000_000,
    }
    repeats, resizes, startups, rounds = (11, 200, 51, args.rounds)
    if args.smoke:
        iterations = {name: count // 100 for name, count in iterations.items()}
        repeats, resizes, startups, rounds = (1, 10, 3, 1)

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-") as tmp:
        workdir = Path(tmp)
        vgpu, sim_dir, bench_calls, bench_resize, bench_startup = build(workdir)
        base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "CUDA_VISIBLE_DEVICES")}
        base.update(LD_LIBRARY_PATH=str(sim_dir), VGPU_SIM_STATE=str(workdir / "sim.state"), VGPU_SIM_DEVICES=DEVICE)
        uuid = device_uuid(base)

        def slice_env(name: str, library: Path = vgpu, **limits) -> tuple[dict[str, str], Region]:
            region = Region.create(workdir / f"{name}.region", device_uuid=uuid, device_index=0, **limits)
            return {**base, "LD_PRELOAD": str(library), "VGPU_REGION": str(region.path)}, region

        def timed_both(env, call: str, threads: int, devices: int, cpus: set[int] | None = None) -> tuple[float, float]:
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
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
            # (wall, CPU): on a machine busy with other programs a run's wall time counts the
            # time they ran; its CPU time counts the program's threads and libvgpu.so's own.
            wall, cpu = out.stdout.split()
            return float(wall), float(cpu)

        def timed(env, call: str, threads: int, devices: int, cpus: set[int] | None = None) -> float:
            return timed_both(env, call, threads, devices, cpus)[1]

        if args.against:
            compare_builds(args.against, build_revision(args.against, workdir), vgpu, workdir, slice_env, timed, rounds)
            return

        slices = {name: slice_env(name, **limits)[0] for name, limits in SLICES.items()}
        print(
            f"\n{'call (medians of ' + str(repeats) + ' interleaved pairs)':<46}"
            f"{'wall: direct':>13}{'vgpu':>7}{'added':>7}{'CPU: direct':>12}{'vgpu':>7}{'added':>7}"
            f"{'instr: direct':>14}{'vgpu':>7}{'added':>7}{'goal':>6}"
        )
        median = statistics.median
        for label, call, threads, slice_name, goal, devices in CALL_ROWS:
            pairs = []
            for repeat in range(repeats):  # interleaved, the order alternating: drift hits both alike
                bare_env, vgpu_env = without_interposer(slices[slice_name]), slices[slice_name]
                if repeat % 2:
                    i = timed_both(vgpu_env, call, threads, devices)
                    d = timed_both(bare_env, call, threads, devices)
                else:
                    d = timed_both(bare_env, call, threads, devices)
                    i = timed_both(vgpu_env, call, threads, devices)
                pairs.append((d, i))
            wall = [median(p[k][0] for p in pairs) for k in (0, 1)] + [median(i[0] - d[0] for d, i in pairs)]
            cpu = [median(p[k][1] for p in pairs) for k in (0, 1)] + [median(i[1] - d[1] for d, i in pairs)]
            counted = "" + f"{'-':>14}{'-':>7}{'-':>7}"
            if threads == 1 and not args.no_callgrind and not args.smoke:
                di = callgrind_instructions(bench_calls, without_interposer(slices[slice_name]), call, workdir)
                ii = callgrind_instructions(bench_calls, slices[slice_name], call, workdir)
                if di is not None and ii is not None:
                    counted = f"{di:>14.1f}{ii:>7.1f}{ii - di:>7.1f}"
            print(
                f"{label:<46}{wall[0]:>13.1f}{wall[1]:>7.1f}{wall[2]:>7.1f}{cpu[0]:>12.1f}{cpu[1]:>7.1f}{cpu[2]:>7.1f}"
                f"{counted}{GOALS_NS[goal] if goal else '-':>6}"
            )
        capped = slices["capped"]

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
            f"\n{'process start-up, exec to exit, ' + str(startups) + ' pairs':<46}{'bare ms':>11}{'vgpu ms':>10}"
            f"{'added ms':>10}{'goal':>7}"
        )
        # The goal is for the processes a slice starts (workers, subprocesses); its first
        # process, the kernel itself, starts once.
        for label, runs, goal in (
            ("about 1000 driver calls", startup_runs(capped, startups, 1000), STARTUP_GOAL_MS),
            ("  the same, a slice's first process", first_process_runs(startups), "-"),
            ("no driver call", startup_runs(capped, startups, 0), STARTUP_GOAL_MS),
        ):
            # Each bare run with the sliced run beside it: the median of the pairs' differences.
            bare, sliced = zip(*runs, strict=True)
            added = [i - d for d, i in runs]
            d, i = statistics.median(bare), statistics.median(sliced)
            print(f"{label + ', median':<46}{d:>11.3f}{i:>10.3f}{statistics.median(added):>10.3f}{goal:>7}")
            print(
                f"{'  fastest of each, least added':<46}{min(bare):>11.3f}{min(sliced):>10.3f}{min(added):>10.3f}{'':>7}"
            )

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


def compare_builds(revision: str, before: Path, after: Path, workdir: Path, slice_env, timed, rounds: int) -> None:
    """The per-call rows for REV's libvgpu.so (`before`) and this tree's (`after`), side by side."""
    runs_per_round = 3
    # Both libraries and both builds' regions at paths of one length: environments of one size.
    libraries = {}
    for build, library, folder in (("before", before, "a"), ("after", after, "b")):
        (workdir / folder).mkdir()
        libraries[build] = shutil.copy2(library, workdir / folder / "libvgpu.so")
    builds = ("direct", "before", "after")
    envs = {
        (build, name): slice_env(f"{build[0]}-{name}", Path(libraries[build]), **limits)[0]
        for build in ("before", "after")
        for name, limits in SLICES.items()
    }
    added: dict[tuple[int, str], list[float]] = {}
    for round_ in range(rounds):
        for row, (_label, call, threads, slice_name, _goal, devices) in enumerate(CALL_ROWS):
            cpus = pinned_cpus(threads)
            order = list(builds)[round_ % 3 :] + list(builds)[: round_ % 3]
            fastest = {build: float("inf") for build in builds}
            for _ in range(runs_per_round):
                for build in order:
                    env = (
                        without_interposer(envs[("after", slice_name)])
                        if build == "direct"
                        else envs[(build, slice_name)]
                    )
                    fastest[build] = min(fastest[build], timed(env, call, threads, devices, cpus))
            for build in ("before", "after"):
                added.setdefault((row, build), []).append(fastest[build] - fastest["direct"])
    pinned = {threads: pinned_cpus(threads) for threads in {row[2] for row in CALL_ROWS}}
    print(
        f"\nadded ns per call, {revision} (before) against this tree (after): median (range) of {rounds} rounds, "
        f"each the fastest of {runs_per_round} runs; pinned to CPUs "
        + ", ".join(f"{sorted(cpus) if cpus else 'none'} ({threads} thread(s))" for threads, cpus in pinned.items())
    )
    print(f"{'call':<46}{'before':>22}{'after':>22}{'after - before':>24}{'goal':>7}")
    for row, (label, _call, _threads, _slice, goal, _devices) in enumerate(CALL_ROWS):
        before_added, after_added = added[(row, "before")], added[(row, "after")]
        difference = [a - b for a, b in zip(after_added, before_added, strict=True)]
        print(
            f"{label:<46}{spread(before_added):>22}{spread(after_added):>22}{spread(difference):>24}"
            f"{GOALS_NS[goal] if goal else '-':>7}"
        )


if __name__ == "__main__":
    with private_machine("vgpu-bench-calls-"):
        main()
