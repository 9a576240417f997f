"""How many decisions per second the ledger makes, and how long one takes: the embedded ledger
(an SQLite file in the server) side by side with the same checking what the GPUs really hold
(``embedded+nvml``: every admission, growth and usage reading reads NVML's memory and process
list, here the simulated GPU's, as a server and a broker do) and with the remote one (a
RemoteLedger over HTTP to a service of such a file in another process, as a node's broker serves
it).

    python benchmarks/ledger_decisions.py            # about a minute
    python benchmarks/ledger_decisions.py --smoke    # about 10 seconds, as CI runs it

Throughput workloads: a kernel starting and stopping (admit then release: one pair is two
decisions) and a slice being resized back and forth, from 1 thread and from 4 threads sharing one
ledger, as the server's request handlers do. Every decision is a committed transaction. Latency:
admit, resize and release of one kernel after another from one thread, median and 99th
percentile. Each run has a fresh file in a temporary directory (and, remote, a fresh service).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from private_machine import private_machine  # noqa: E402

from jupyter_vgpu.holders.device_memory import DeviceMemoryReader, kernel_pid  # noqa: E402
from jupyter_vgpu.ledger import EmbeddedLedger, Ledger  # noqa: E402
from jupyter_vgpu.ledger.remote import RemoteLedger  # noqa: E402
from jupyter_vgpu.model import Device, SliceLimits, list_devices, use_simulator  # noqa: E402

GIB = 1 << 30
DEVICES = [Device(f"GPU-bench-{index}", index, "bench GPU", 80 * GIB, 132) for index in range(2)]
SIMULATED_DEVICES = ";".join(["name=bench GPU,memory=80GiB,sms=132"] * 2)
PREFIX = "/ledger"
KINDS = ("embedded", "embedded+nvml", "remote")


# -- the two kinds of ledger -------------------------------------------------------------------


def _serve(path: str, token: str, ports) -> None:
    """The service process: an EmbeddedLedger on ``path`` served over HTTP until terminated."""
    import asyncio

    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application

    from jupyter_vgpu.ledger.service import ledger_handlers

    async def main() -> None:
        ledger = EmbeddedLedger(path, DEVICES)
        sockets = bind_sockets(0, "127.0.0.1")
        HTTPServer(Application(ledger_handlers(PREFIX, ledger, token))).add_sockets(sockets)
        ports.send(sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


@contextmanager
def open_ledger(kind: str, path: Path) -> Iterator[Ledger]:
    if kind == "embedded":
        with EmbeddedLedger(path, DEVICES) as ledger:
            yield ledger
        return
    if kind == "embedded+nvml":
        # The simulated GPUs, so that the devices the ledger holds are the ones NVML lists.
        with EmbeddedLedger(path, list_devices(), reader=DeviceMemoryReader(kernel_pid)) as ledger:
            yield ledger
        return
    token = secrets.token_hex(16)
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    service = context.Process(target=_serve, args=(str(path), token, sender), daemon=True)
    service.start()
    sender.close()  # the child's end only: if it dies before serving, recv() ends instead of waiting
    try:
        try:
            if not receiver.poll(60):
                raise RuntimeError("the ledger service did not start within 60 s")
            port = receiver.recv()
        except EOFError:
            raise RuntimeError(f"the ledger service exited before it served (exit code {service.exitcode})") from None
        with RemoteLedger(f"http://127.0.0.1:{port}{PREFIX}", token) as ledger:
            yield ledger
    finally:
        service.terminate()
        service.join()


# -- throughput --------------------------------------------------------------------------------


def admit_and_release(ledger: Ledger, worker: int) -> Callable[[int], int]:
    def step(number: int) -> int:
        kernel_id = f"worker-{worker}-kernel-{number}"
        ledger.admit(kernel_id, SliceLimits(GIB, 10))
        ledger.release(kernel_id)
        return 2

    return step


def resize_back_and_forth(ledger: Ledger, worker: int) -> Callable[[int], int]:
    kernel_id = f"worker-{worker}-resized"
    ledger.admit(kernel_id, SliceLimits(GIB, 10))

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


# -- latency -----------------------------------------------------------------------------------


def latencies(ledger: Ledger, kernels: int) -> dict[str, list[float]]:
    """Seconds each admit, resize and release took, one kernel after another."""
    timings: dict[str, list[float]] = {"admit": [], "resize": [], "release": []}
    for number in range(kernels):
        kernel_id = f"kernel-{number}"
        for decision, call in (
            ("admit", lambda kernel_id=kernel_id: ledger.admit(kernel_id, SliceLimits(GIB, 10))),
            ("resize", lambda kernel_id=kernel_id: ledger.resize(kernel_id, memory_limit=2 * GIB)),
            ("release", lambda kernel_id=kernel_id: ledger.release(kernel_id)),
        ):
            began = time.perf_counter()
            call()
            timings[decision].append(time.perf_counter() - began)
    return timings


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="about 10 seconds: proves the benchmark runs")
    args = parser.parse_args()
    seconds, kernels = (0.5, 200) if args.smoke else (5.0, 2000)
    workloads = [("admit+release", admit_and_release), ("resize", resize_back_and_forth)]

    with tempfile.TemporaryDirectory(prefix="vgpu-ledger-bench-") as tmp:
        os.environ["VGPU_SIM_STATE"] = str(Path(tmp) / "sim.state")
        os.environ["VGPU_SIM_DEVICES"] = SIMULATED_DEVICES
        use_simulator()
        print(f"{'workload':<16}{'threads':>8}" + "".join(f"{kind + ' decisions/s':>28}" for kind in KINDS))
        for name, workload in workloads:
            for threads in (1, 4):
                rates = []
                for kind in KINDS:
                    with open_ledger(kind, Path(tmp) / f"{kind}-{name}-{threads}.sqlite") as ledger:
                        rates.append(decisions_per_second(ledger, workload, threads, seconds))
                print(f"{name:<16}{threads:>8}" + "".join(f"{rate:>28,.0f}" for rate in rates))

        timings = {}
        for kind in KINDS:
            with open_ledger(kind, Path(tmp) / f"{kind}-latency.sqlite") as ledger:
                timings[kind] = latencies(ledger, kernels)
        print()
        print(f"{'decision':<16}" + "".join(f"{kind + ' median ms':>26}{kind + ' p99 ms':>23}" for kind in KINDS))
        for decision in ("admit", "resize", "release"):
            row = "".join(
                f"{statistics.median(timings[kind][decision]) * 1e3:>26.3f}"
                f"{percentile(timings[kind][decision], 0.99) * 1e3:>23.3f}"
                for kind in KINDS
            )
            print(f"{decision:<16}{row}")


if __name__ == "__main__":
    with private_machine("vgpu-bench-ledger-"):
        main()
