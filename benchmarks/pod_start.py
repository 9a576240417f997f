"""Pod kernels on a real Kubernetes control plane (tests/cluster: kube-apiserver, etcd,
kube-controller-manager, kube-scheduler built from Kubernetes' own modules), their pods run by the
tests' node agent as local processes (the in-pod agent, then ipykernel under the interposer on
the simulated GPU). Three measurements, each on a real `jupyter server` with no GPU of its own:

1. **Starts**: POST /api/vgpu/kernels to the kernel's first kernel_info reply, one start at a
   time, and the phases between (the pod created, bound by the scheduler, Running, the POST
   answered), as a watch of the pods sees them on this process's clock; the scheduler's share is
   created -> bound.
2. **Adoption**: N live kernel pods, the server SIGKILLed and started again: the seconds from the
   restart to the server answering with all N adopted, and to all N answering a cell through the
   server's websocket.
3. **A class on a full cluster**: 40 kernels of 1 GiB on nodes that advertise room for 24: every
   start runs or waits in line with its place (none refused, none deleted); then the running
   kernels are shut down one at a time, and each time the seconds from the shut-down kernel's pod
   freeing its room (ended, or gone) to the next waiting pod being bound.

    python benchmarks/pod_start.py            # 20 starts, 20 adopted, 40 on room for 24
    python benchmarks/pod_start.py --smoke    # 3 starts, 3 adopted, 6 on room for 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

import build  # noqa: E402
from control_plane import ControlPlane  # noqa: E402
from fixtures import Kube  # noqa: E402
from node_agent import GPU, NodeAgent  # noqa: E402
from pod_server import KERNEL, PodServer, pod_server_env, write_pod_server_config  # noqa: E402
from private_machine import private_machine  # noqa: E402
from support import free_port, wait_for  # noqa: E402

from jupyter_vgpu.pods.manifest import KERNEL_LABEL  # noqa: E402

POD_SIM_DEVICES = "name=bench pod GPU,memory=64GiB,sms=100,context_memory=0"


class PodWatch(threading.Thread):
    """Notes, on this process's clock, when each pod of the namespace is first seen, first seen
    bound to a node, first seen Running, and seen gone."""

    def __init__(self, kube: Kube):
        super().__init__(daemon=True)
        self.kube = kube
        self.seen: dict[str, dict[str, float]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        from kubernetes import client, watch

        version = ""
        while not self.stopped.is_set():
            stream = watch.Watch()
            try:
                # Each reconnection goes on from the last version seen: no event is missed.
                for event in stream.stream(
                    self.kube.core.list_namespaced_pod,
                    self.kube.namespace,
                    timeout_seconds=5,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                ):
                    now = time.perf_counter()
                    pod = event["object"]
                    if event["type"] == "BOOKMARK":  # only a version to go on from
                        version = event["raw_object"]["metadata"]["resourceVersion"]
                        continue
                    version = pod.metadata.resource_version or version
                    stamps = self.seen.setdefault(pod.metadata.name, {})
                    stamps.setdefault("created", now)
                    if pod.spec.node_name:
                        stamps.setdefault("bound", now)
                    if pod.status and pod.status.phase == "Running":
                        stamps.setdefault("running", now)
                    # Its room is free once it ended (the scheduler counts no finished pod) or is gone.
                    if event["type"] == "DELETED" or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
                        stamps.setdefault("freed", now)
                    if event["type"] == "DELETED":
                        stamps.setdefault("gone", now)
            except client.ApiException as error:
                if self.stopped.is_set():
                    return
                if error.status == 410:  # too old a version: start again from now
                    version = ""
                    continue
                raise
            except Exception as error:
                if self.stopped.is_set():
                    return  # the control plane went first
                print(f"pod watch: {error!r}", file=sys.stderr)
                raise

    def first(self, name: str, what: str, timeout: float = 60) -> float:
        wait_for(lambda: what in self.seen.get(name, {}), timeout, f"the watch to see {name} {what}", interval=0.005)
        return self.seen[name][what]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def row(label: str, samples: list[float]) -> str:
    return f"{label:<46}{percentile(samples, 0.5) * 1e3:>10.0f}{percentile(samples, 0.95) * 1e3:>10.0f}{max(samples) * 1e3:>10.0f}{len(samples):>5}"


def kernel_pod(kube: Kube, kernel_id: str) -> str:
    (name,) = [
        p["metadata"]["name"] for p in kube.pods() if p["metadata"].get("labels", {}).get(KERNEL_LABEL) == kernel_id
    ]
    return name


def measure_starts(server: PodServer, kube: Kube, watch: PodWatch, count: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for index in range(count + 1):  # the first is not counted: imports, first connections
        sent = time.perf_counter()
        reply = server.api("POST", "api/vgpu/kernels", {"name": KERNEL}, timeout=120)
        answered = time.perf_counter()
        kernel_id, pod = reply["kernel"]["id"], reply["slice"]["location"]["pod"]
        server.run_over_websocket(kernel_id, "pass")  # its kernel_info and a cell, as a notebook's first
        ready = time.perf_counter()
        server.api("DELETE", f"api/kernels/{kernel_id}", timeout=120)
        created, bound, running = (watch.first(pod, what) for what in ("created", "bound", "running"))
        wait_for(lambda name=pod: kube.pod(name) is None, 60, "the pod gone")
        if index == 0:
            continue
        for phase, seconds in {
            "POST -> pod created": created - sent,
            "pod created -> bound (the scheduler)": bound - created,
            "bound -> Running (node agent)": running - bound,
            "Running -> POST answered": answered - running,
            "POST -> POST answered": answered - sent,
            "POST answered -> first cell done": ready - answered,
            "POST -> first cell done": ready - sent,
        }.items():
            times.setdefault(phase, []).append(seconds)
    return times


def measure_adoption(folder: Path, env: dict[str, str], port: int, count: int) -> tuple[PodServer, float, float]:
    server = PodServer(folder, env, port)
    kernels = [
        server.api("POST", "api/vgpu/kernels", {"name": KERNEL}, timeout=120)["kernel"]["id"] for _ in range(count)
    ]
    for kernel_id in kernels:
        try:
            server.run_over_websocket(kernel_id, "x = 1")
        except Exception:
            print(f"kernel {kernel_id} ran no cell: {server.log.read_text()[-3000:]}", file=sys.stderr)
            raise
    server.kill()
    restarted_at = time.perf_counter()
    restarted = PodServer(folder, env, port, timeout=300)
    listed = sorted(kernel["id"] for kernel in restarted.api("GET", "api/kernels"))
    answering = time.perf_counter()
    if listed != sorted(kernels):
        raise RuntimeError(f"adopted {len(listed)} of {count}: {restarted.log.read_text()[-3000:]}")
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            printed = list(pool.map(lambda k: restarted.run_over_websocket(k, "print(x)"), kernels))
    except Exception:
        print(restarted.log.read_text()[-6000:], file=sys.stderr)
        raise
    if printed != ["1\n"] * count:
        raise RuntimeError(f"adopted kernels lost their state: {printed}")
    cells = time.perf_counter()
    for kernel_id in kernels:
        restarted.api("DELETE", f"api/kernels/{kernel_id}", timeout=120)
    return restarted, answering - restarted_at, cells - restarted_at


def measure_class(server: PodServer, kube: Kube, watch: PodWatch, students: int, room: int) -> dict:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda _: server.api("POST", "api/vgpu/kernels", {"name": KERNEL}, timeout=300), range(students))
        )
    states = [reply["slice"]["state"] for reply in replies]
    kernels = [reply["kernel"]["id"] for reply in replies]
    listed = {item["kernel_id"]: item for item in server.api("GET", "api/vgpu/slices")}
    queued = sorted(item["queue"]["position"] for item in listed.values() if item["state"] == "queued")
    running = [k for k in kernels if listed[k]["state"] == "running"]
    pods = {k: kernel_pod(kube, k) for k in kernels}
    result = {
        "started": states.count("running"),
        "queued at once": states.count("queued"),
        "refused": students - len(replies),
        "places": queued,
        "running after": len(running),
    }
    waits = []
    order = list(running)
    while order:
        leaving = order.pop(0)
        waiting = {k for k, item in listed.items() if item["state"] == "queued"}
        server.api("DELETE", f"api/kernels/{leaving}", timeout=120)
        freed = watch.first(pods[leaving], "freed")
        if waiting:
            wait_for(
                lambda waiting=waiting: any("bound" in watch.seen.get(pods[k], {}) for k in waiting), 60, "a pod bound"
            )
            (nxt,) = [k for k in waiting if "bound" in watch.seen.get(pods[k], {})][:1]
            waits.append(watch.seen[pods[nxt]]["bound"] - freed)
            wait_for(lambda nxt=nxt: server.slice_of(nxt)["state"] == "running", 120, "the next kernel running")
            order.append(nxt)
        listed = {item["kernel_id"]: item for item in server.api("GET", "api/vgpu/slices")}
    result["deleted by the server while waiting"] = sum(
        1 for k in kernels if "gone" in watch.seen.get(pods[k], {}) and watch.seen[pods[k]].get("running") is None
    )
    result["bound after room freed"] = waits
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="3 starts, 3 adopted, 6 kernels on room for 4")
    parser.add_argument("--adopt", type=int, default=20, help="live kernel pods a restarted server adopts (default 20)")
    parser.add_argument("--only", choices=("starts", "adoption", "class"), help="run one of the three")
    args = parser.parse_args()
    starts, adopted, students, room = (3, 3, 6, 4) if args.smoke else (20, args.adopt, 40, 24)
    binaries = build.cache_folder()
    if build.missing(binaries):
        sys.exit(f"the control plane is not built: run `python {ROOT / 'tests/cluster/build.py'}`")

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-pods-") as tmp:
        tmp = Path(tmp)
        import os

        os.environ["VGPU_SIM_STATE"] = str(tmp / "pod-sim.state")
        os.environ["VGPU_SIM_DEVICES"] = POD_SIM_DEVICES
        plane = ControlPlane(tmp / "plane", binaries).start()
        agents: list[NodeAgent] = []
        servers: list[PodServer] = []
        watch: PodWatch | None = None
        try:
            kube = Kube(plane, "bench", tmp)
            # Two nodes of one GPU each; kernels of 1 GiB: room for `room` of them.
            for index in range(2):
                agent = NodeAgent(
                    plane,
                    f"bench-{index}",
                    tmp / f"node-{index}",
                    gpus=[GPU(f"GPU-bench-{index}", 1024 * room // 2, split=room)],
                    address_base=2 + 100 * index,
                )
                agent.start()
                agents.append(agent)
            watch = PodWatch(kube)
            watch.start()
            results = {}
            # Each benchmark its own server folder (its own ledger), and its own kernel ports.
            for part in [args.only] if args.only else ["starts", "adoption", "class"]:
                folder = tmp / part
                port = free_port()
                write_pod_server_config(
                    folder,
                    namespace="bench",
                    server_url=f"http://127.0.0.1:{port}/",
                    ports=[free_port() for _ in range(5)],
                    node_selector={"jupyter-vgpu.io/test-agent": "true"},
                    cores=4,  # GPU memory, not the SM share, is what runs out: 24 x 4 % on two GPUs
                )
                env = pod_server_env(folder, kube.kubeconfig)
                if part == "starts":
                    servers.append(PodServer(folder, env, port))
                    results[part] = measure_starts(servers[-1], kube, watch, starts)
                elif part == "adoption":
                    restarted, listed, cells = measure_adoption(folder, env, port, adopted)
                    servers.append(restarted)
                    results[part] = (listed, cells)
                else:
                    servers.append(PodServer(folder, env, port))
                    results[part] = measure_class(servers[-1], kube, watch, students, room)
                servers[-1].stop(60)
        finally:
            for server in servers:
                server.stop(60)
            if watch is not None:
                watch.stopped.set()
                watch.join(10)
            for agent in agents:
                agent.stop()
            plane.stop()
        errors = [error for agent in agents for error in agent.errors]
        if errors:
            raise RuntimeError(f"node agents failed: {errors[:3]}")

    if "starts" in results:
        print(f"\n1. pod kernel starts on the real control plane, {starts} one at a time (after one not counted)")
        print(f"{'phase':<46}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}{'n':>5}")
        for label, samples in results["starts"].items():
            print(row(label, samples))
    if "adoption" in results:
        listed, cells = results["adoption"]
        print(f"\n2. adoption: {adopted} live kernel pods, server SIGKILLed and restarted")
        print(f"   restart -> server answering with all {adopted} adopted: {listed:.1f} s")
        print(f"   restart -> all {adopted} answered a cell over the server's websocket (state intact): {cells:.1f} s")
    if "class" in results:
        found = results["class"]
        print(f"\n3. a class of {students} kernels of 1 GiB on nodes with room for {room}")
        print(
            f"   started at once {found['started']}, queued at once {found['queued at once']} "
            f"(places {found['places']}), refused {found['refused']}"
        )
        print(f"   deleted while waiting: {found['deleted by the server while waiting']}")
        print(
            f"{'':<3}{'room freed (pod ended or gone) -> next bound':<43}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}{'n':>5}"
        )
        print(row("   a kernel's pod freed -> next waiting pod bound", found["bound after room freed"]))


if __name__ == "__main__":
    with private_machine("vgpu-bench-pods-"):
        main()
