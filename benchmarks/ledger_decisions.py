"""How many decisions per second the ledger makes on a file (each one a committed transaction).

    python benchmarks/ledger_decisions.py            # about 20 seconds
    python benchmarks/ledger_decisions.py --smoke    # about 2 seconds, as CI runs it

Workloads: a kernel starting and stopping (admit then release: one pair is two decisions) and a
slice being resized back and forth, from 1 thread and from 4 threads sharing one Ledger, as the
server's request handlers do. The file lives in a temporary directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_vgpu.ledger.embedded import DeviceCapacity, Ledger, SliceRequest  # noqa: E402

GIB = 1 << 30
DEVICES = [DeviceCapacity(f"GPU-bench-{index}", index, "bench GPU", 80 * GIB, 132) for index in range(2)]


def admit_and_release(ledger: Ledger, worker: int) -> Callable[[int], int]:
    def step(number: int) -> int:
        kernel_id = f"worker-{worker}-kernel-{number}"
        ledger.admit(kernel_id, SliceRequest(GIB, 10))
        ledger.release(kernel_id)
        return 2

    return step


def resize_back_and_forth(ledger: Ledger, worker: int) -> Callable[[int], int]:
    kernel_id = f"worker-{worker}-resized"
    ledger.admit(kernel_id, SliceRequest(GIB, 10))

    def step(number: int) -> int:
        ledger.resize(kernel_id, memory_limit=(1 + number % 2) * GIB, sm_share=10 + number % 2)
        return 1

    return step


def decisions_per_second(ledger: Ledger, workload, threads: int, seconds: float) -> float:
    """Run ``workload`` from ``threads`` threads for ``seconds``; decisions per second in all."""
    steps = [workload(ledger, worker) for worker in range(threads)]
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline = 0.0

    def run(worker: int) -> None:
        start.wait()
        number = 0
        while time.perf_counter() < deadline:
            counts[worker] += steps[worker](number)
            number += 1

    workers = [threading.Thread(target=run, args=(worker,)) for worker in range(threads)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline = began + seconds
    start.wait()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="about 2 seconds: proves the benchmark runs")
    args = parser.parse_args()
    seconds = 0.5 if args.smoke else 5.0
    workloads = [("admit+release", admit_and_release), ("resize", resize_back_and_forth)]

    print(f"{'workload':<16}{'threads':>8}{'decisions/s':>14}")
    with tempfile.TemporaryDirectory(prefix="vgpu-ledger-bench-") as tmp:
        for name, workload in workloads:
            for threads in (1, 4):
                with Ledger(Path(tmp) / f"{name}-{threads}.sqlite", DEVICES) as ledger:
                    rate = decisions_per_second(ledger, workload, threads, seconds)
                print(f"{name:<16}{threads:>8}{rate:>14,.0f}")


if __name__ == "__main__":
    main()
