"""Kernel start time in a slice against a plain ipykernel, and GET /api/vgpu/slices latency with
many live sliced kernels, on a real Jupyter server on the simulated GPU.

    python benchmarks/server_slices.py            # 10 starts of each kind, 50 live kernels
    python benchmarks/server_slices.py --smoke    # 2 starts, 5 kernels: proves it runs

Starts are timed from the POST until the kernel answers kernel_info, alternating sliced and
plain so both see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client import BlockingKernelClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from private_machine import private_machine
from support import JupyterProcess

TOKEN = "vgpu-benchmark"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds: proves the benchmark runs")
    args = parser.parse_args()
    starts, live_kernels, requests = (2, 5, 20) if args.smoke else (10, 50, 500)

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-server-") as tmp:
        tmp = Path(tmp)
        kernels = tmp / "data" / "kernels"
        for name, provisioner in (("plain", None), ("sliced", "vgpu-provisioner")):
            (kernels / name).mkdir(parents=True)
            spec = {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name,
                "language": "python",
                "metadata": {},
            }
            if provisioner:
                spec["metadata"]["kernel_provisioner"] = {
                    "provisioner_name": provisioner,
                    "config": {"memory": "256MiB", "cores": "1"},
                }
            (kernels / name / "kernel.json").write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION")}
        env.update(
            JUPYTER_DATA_DIR=str(tmp / "data"),
            JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
            JUPYTER_CONFIG_DIR=str(tmp / "config"),
            VGPU_SIM_STATE=str(tmp / "sim.state"),
            VGPU_SIM_DEVICES="name=bench GPU,memory=80GiB,sms=132,context_memory=0",
        )
        server = JupyterProcess(
            env,
            tmp / "server.log",
            TOKEN,
            "--VGPUApp.simulate=True",
            f"--VGPUApp.ledger_path={tmp / 'ledger.sqlite'}",
            f"--VGPUApp.region_dir={tmp / 'regions'}",
            f"--ServerApp.root_dir={tmp}",
        )
        api = server.api

        try:

            def start(kind: str) -> tuple[str, float]:
                began = time.perf_counter()
                if kind == "sliced":
                    kernel_id = api("POST", "api/vgpu/kernels", {"name": "sliced"})["kernel"]["id"]
                else:
                    kernel_id = api("POST", "api/kernels", {"name": "plain"})["id"]
                client = BlockingKernelClient(connection_file=str(tmp / "runtime" / f"kernel-{kernel_id}.json"))
                client.load_connection_file()
                client.start_channels(
                    hb=False
                )  # a heartbeat missed while a loaded machine starts the kernel would read as "died"
                client.wait_for_ready(timeout=60)
                client.stop_channels()
                return kernel_id, time.perf_counter() - began

            times = {"plain": [], "sliced": []}
            for _ in range(starts):
                for kind in ("plain", "sliced"):
                    kernel_id, seconds = start(kind)
                    times[kind].append(seconds)
                    api("DELETE", f"api/kernels/{kernel_id}")
            plain, sliced = statistics.median(times["plain"]), statistics.median(times["sliced"])
            print(f"\nkernel start until kernel_info answers ({starts} each, alternating)")
            print(f"{'kernel':<28}{'median s':>10}")
            print(f"{'plain ipykernel':<28}{plain:>10.3f}")
            print(f"{'ipykernel in a GPU slice':<28}{sliced:>10.3f}")
            print(f"{'ratio sliced / plain':<28}{sliced / plain:>10.3f}   (goal <= 1.10)")

            for _ in range(live_kernels):
                start("sliced")
            latencies = []
            for _ in range(requests):
                began = time.perf_counter()
                listed = api("GET", "api/vgpu/slices")
                latencies.append((time.perf_counter() - began) * 1000)
            assert len(listed) == live_kernels
            latencies.sort()
            p50 = latencies[len(latencies) // 2]
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(f"\nGET /api/vgpu/slices with {live_kernels} live sliced kernels, {requests} requests")
            print(f"{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
            print(f"{p50:>10.2f}{p99:>10.2f}{latencies[-1]:>10.2f}   (goal p99 <= 20 ms)")
        finally:
            server.stop(60)


if __name__ == "__main__":
    with private_machine("vgpu-bench-server-"):
        main()
