"""Pod kernel start overhead against the stand-in Kubernetes API: where the time goes between a
POST /api/vgpu/kernels and the kernel answering, on a real Jupyter server with no GPU of its own,
and an ordinary kernel's start on the same server for scale.

    python benchmarks/pod_start.py            # 20 starts of each kind
    python benchmarks/pod_start.py --smoke    # 3 starts: proves it runs

The stand-in API (tests/kube_standin.py: kmock's emulator, served from a thread of this process)
is subclassed here to note when each request reaches it, on this process's clock: the pod's and
the Secret's creation, the Kubelet setting the pod Running, and the server's readings of the pod.
The stand-in's Kubelet (a thread here too) runs each pod's command as a local process, so the
kernel in the pod runs for real (under the in-pod agent, on the simulated GPU) and its
kernel_info is awaited after the POST is answered, as a client would. Nothing is added to the
server: every time is read at the server's edges (the POST's send and answer, its requests to
the API). Pod and ordinary starts alternate, after one unmeasured start of each. With 20 starts
the p99 is the slowest one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client import BlockingKernelClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import kmock  # noqa: E402
from kube_standin import Kubelet, StandIn, StandInEmulator  # noqa: E402
from private_machine import private_machine  # noqa: E402
from support import JupyterProcess, free_port  # noqa: E402

from jupyter_vgpu.pods.manifest import CONNECTION_FILE  # noqa: E402

TOKEN = "vgpu-benchmark"
POD_SIM_DEVICES = "name=bench pod GPU,memory=8GiB,sms=100,context_memory=0"

# (perf_counter, what, name): what reached the stand-in API when, appended from its thread.
JOURNAL: list[tuple[float, str, str]] = []


class TimedEmulator(StandInEmulator):
    """The stand-in's emulator, noting when the requests a start is made of reach it."""

    async def _handle(self, request):
        received = time.perf_counter()
        plural = request.resource.plural if request.resource is not None else None
        what = None
        if request.action == kmock.action.CREATE and plural in ("pods", "secrets") and isinstance(request.data, dict):
            what, name = f"create {plural}", (request.data.get("metadata") or {}).get("name", "")
        elif request.action == kmock.action.UPDATE and plural == "pods" and request.subresource == "status":
            if ((request.data or {}).get("status") or {}).get("phase") == "Running":
                what, name = "running", request.name
        elif request.action == kmock.action.FETCH and plural == "pods" and not request.subresource:
            what, name = "read pod", request.name  # the Kubelet lists pods; only the server reads one
        if what:
            JOURNAL.append((received, what, name))
        return await super()._handle(request)


class TimedStandIn(StandIn):
    """The stand-in API served by the TimedEmulator."""

    emulator_class = TimedEmulator


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def first(what: str, name: str, after: float = 0.0) -> float:
    for stamp, seen, seen_name in JOURNAL:
        if seen == what and seen_name == name and stamp >= after:
            return stamp
    raise RuntimeError(f"the stand-in saw no {what} of {name}")


ROWS = [
    ("pod", "a", "POST sent -> Pod create reaches the API"),
    ("pod", "b", "Pod created -> Secret created"),
    ("pod", "kubelet", "Secret created -> Pod Running (stand-in Kubelet)"),
    ("pod", "seen", "  Pod Running -> server reads it Running"),
    ("pod", "connect", "  server reads Running -> POST answered"),
    ("pod", "c", "Pod Running -> POST answered"),
    ("pod", "answered", "pod kernel: POST -> POST answered"),
    ("pod", "ready", "  POST answered -> kernel_info reply"),
    ("pod", "total", "pod kernel: POST -> kernel_info reply"),
    ("plain", "answered", "ordinary kernel: POST -> answered"),
    ("plain", "ready", "  POST answered -> kernel_info reply"),
    ("plain", "total", "ordinary kernel: POST -> kernel_info"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="3 starts of each kind: proves the benchmark runs")
    parser.add_argument("--starts", type=int, help="measured starts of each kind (default 20, 3 with --smoke)")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        help="VGPUPodProvisioner.poll_interval: seconds between the server's readings of a starting pod (default 0.5, the product's)",
    )
    args = parser.parse_args()
    starts = args.starts or (3 if args.smoke else 20)

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-pods-") as tmp:
        tmp = Path(tmp)
        standin = TimedStandIn(tmp)
        kubelet = Kubelet(
            standin, tmp / "node", {"VGPU_SIM_STATE": str(tmp / "pod-sim.state"), "VGPU_SIM_DEVICES": POD_SIM_DEVICES}
        )
        kubelet.folder.mkdir()
        kubelet.start()

        kernels = tmp / "data" / "kernels"
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (kernels / "plain").mkdir(parents=True)
        (kernels / "plain" / "kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "plain", "language": "python", "metadata": {}})
        )
        (kernels / "pod").mkdir(parents=True)
        (kernels / "pod" / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "Python 3 (GPU pod)",
                    "language": "python",
                    "interrupt_mode": "message",
                    "metadata": {
                        "kernel_provisioner": {
                            "provisioner_name": "vgpu-pod-provisioner",
                            "config": {"memory": "1GiB", "cores": "30"},
                        }
                    },
                }
            )
        )
        (tmp / "config").mkdir()
        (tmp / "config" / "jupyter_server_config.json").write_text(
            json.dumps(
                {
                    "VGPUApp": {
                        "local_gpus": False,
                        "ledger_path": str(tmp / "ledger.sqlite"),
                        "region_dir": str(tmp / "regions"),
                    },
                    "VGPUPodProvisioner": {
                        "image": "registry.example.org/kernels/bench:1",
                        "python": sys.executable,  # the "image" is this machine: the Kubelet runs pods here
                        "kernel_ports": [free_port() for _ in range(5)],
                        "simulate": True,
                        "owner": "bench",
                        "poll_interval": args.poll_interval,
                    },
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VGPU_REGION", "KUBERNETES_SERVICE_HOST")}
        env.update(
            JUPYTER_DATA_DIR=str(tmp / "data"),
            JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
            JUPYTER_CONFIG_DIR=str(tmp / "config"),
            KUBECONFIG=str(standin.kubeconfig),
        )
        server = JupyterProcess(env, tmp / "server.log", TOKEN, f"--ServerApp.root_dir={tmp}")

        def api(method: str, path: str, body=None):
            return server.api(method, path, body, timeout=120)

        def kernel_info(client: BlockingKernelClient) -> None:
            client.start_channels(hb=False)  # a heartbeat missed while the kernel starts would read as "died"
            try:
                client.wait_for_ready(timeout=60)
            finally:
                client.stop_channels()

        def start_pod() -> dict[str, float]:
            sent = time.perf_counter()
            reply = api("POST", "api/vgpu/kernels", {"name": "pod"})
            answered = time.perf_counter()
            kernel_id, pod = reply["kernel"]["id"], reply["slice"]["location"]["pod"]
            info = json.loads((kubelet.folder / pod / CONNECTION_FILE).read_text())
            client = BlockingKernelClient()
            client.load_connection_info({**info, "ip": "127.0.0.1"})  # the pod's IP, as the Kubelet set it
            kernel_info(client)
            ready = time.perf_counter()
            api("DELETE", f"api/kernels/{kernel_id}")
            kubelet.processes[pod].wait(60)  # the next pod listens on the same ports, as in a cluster
            created = first("create pods", pod, sent)
            secret = first("create secrets", pod, created)
            running = first("running", pod, secret)
            seen = first("read pod", pod, running)
            return {
                "a": created - sent,
                "b": secret - created,
                "kubelet": running - secret,
                "seen": seen - running,
                "connect": answered - seen,
                "c": answered - running,
                "answered": answered - sent,
                "ready": ready - answered,
                "total": ready - sent,
            }

        def start_plain() -> dict[str, float]:
            sent = time.perf_counter()
            kernel_id = api("POST", "api/kernels", {"name": "plain"})["id"]
            answered = time.perf_counter()
            client = BlockingKernelClient(connection_file=str(tmp / "runtime" / f"kernel-{kernel_id}.json"))
            client.load_connection_file()
            kernel_info(client)
            ready = time.perf_counter()
            api("DELETE", f"api/kernels/{kernel_id}")
            return {"answered": answered - sent, "ready": ready - answered, "total": ready - sent}

        try:
            warmup = {"pod": start_pod(), "plain": start_plain()}
            times: dict[str, dict[str, list[float]]] = {"pod": {}, "plain": {}}
            for _ in range(starts):
                for kind, start in (("pod", start_pod), ("plain", start_plain)):
                    for phase, seconds in start().items():
                        times[kind].setdefault(phase, []).append(seconds)
        except BaseException:
            server.stop(60)
            print(server.log.read_text()[-4000:], file=sys.stderr)
            raise
        finally:
            kubelet.stop()
            server.stop(60)
            standin.close()
        if kubelet.errors:
            raise RuntimeError(f"the stand-in Kubelet failed: {kubelet.errors}")

    print(
        f"\nkernel starts against the stand-in API, {starts} of each kind, alternating "
        f"(server poll_interval {args.poll_interval:g} s)"
    )
    print(f"{'phase':<48}{'p50 ms':>10}{'p99 ms':>10}{'n':>5}")
    for kind, key, label in ROWS:
        samples = times[kind][key]
        print(
            f"{label:<48}{percentile(samples, 0.5) * 1e3:>10.1f}{percentile(samples, 0.99) * 1e3:>10.1f}{len(samples):>5}"
        )
    print(
        f"first start (not above): pod kernel {warmup['pod']['a'] * 1e3:.1f} ms to its Pod create, "
        f"{warmup['pod']['total'] * 1e3:.0f} ms to kernel_info; ordinary kernel {warmup['plain']['total'] * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    with private_machine("vgpu-bench-pods-"):
        main()
