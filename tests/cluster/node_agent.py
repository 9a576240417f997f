"""The tests' node agent: a stand-in kubelet for one node of the real control plane whose pods
really run, each pod's container command as a local process.

It is a test agent, not a kubelet: no container runtime, no images, no cgroups. What it does is
what a kubelet does toward the API, under a node's own identity (a client certificate of
``system:node:NAME`` in ``system:nodes``, so the Node authorizer and NodeRestriction hold it to
its node and the pods bound there):

- registers its Node with the capacity it is given (GPU nodes: ``nvidia.com/gpu``, ``gpumem``,
  ``gpucores`` and HAMi's node annotations), keeps it Ready and renews its Lease;
- for each pod the scheduler bound to the node: reads the Secrets its volumes mount (the Node
  authorizer lets a node read only those), writes them into a folder, runs the container's
  command with that folder where the volume is mounted and the container's environment, and
  reports the pod Running with an address of its own;
- stops a deleted pod's processes (SIGTERM, SIGKILL after the grace period) and then removes the
  pod, as a kubelet does; reports a pod whose process exited as Succeeded or Failed.

Pods here share the machine's network, where real ones have a namespace each: every pod gets its
own loopback address (127.0.0.N) as its IP, and a connection file in a mounted Secret that binds
``0.0.0.0`` is narrowed to that address, which is what ``0.0.0.0`` means inside a pod.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

LEASE_SECONDS = 40
HEARTBEAT = 10.0
AGENT_LABEL = "jupyter-vgpu.io/test-agent"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class GPU:
    """One GPU of a node as HAMi's device plugin registers it (``devmem`` in MiB)."""

    uuid: str
    memory_mib: int
    split: int = 10  # vGPUs a GPU is shared by (HAMi's deviceSplitCount)
    cores: int = 100
    kind: str = "NVIDIA-Simulated GPU"


def gpu_node(gpus: list[GPU], *, cpu: str = "16", memory: str = "64Gi", pods: str = "110") -> dict[str, Any]:
    """A GPU node's capacity and annotations: ``nvidia.com/gpu`` (vGPUs), and, for Kubernetes'
    default scheduler to count them per node, ``nvidia.com/gpumem`` (MiB) and
    ``nvidia.com/gpucores`` (percent) summed over its GPUs; HAMi's own register of the GPUs."""
    register = [
        {
            "id": gpu.uuid,
            "index": index,
            "count": gpu.split,
            "devmem": gpu.memory_mib,
            "devcore": gpu.cores,
            "type": gpu.kind,
            "numa": 0,
            "mode": "hami-core",
            "health": True,
        }
        for index, gpu in enumerate(gpus)
    ]
    capacity = {
        "cpu": cpu,
        "memory": memory,
        "pods": pods,
        "nvidia.com/gpu": str(sum(gpu.split for gpu in gpus)),
        "nvidia.com/gpumem": str(sum(gpu.memory_mib for gpu in gpus)),
        "nvidia.com/gpucores": str(sum(gpu.cores for gpu in gpus)),
    }
    annotations = {
        "hami.io/node-nvidia-register": json.dumps(register),
        "hami.io/node-handshake": f"Reported {now()}",
    }
    return {"capacity": capacity, "annotations": annotations}


@dataclass
class RunningPod:
    name: str
    namespace: str
    uid: str
    ip: str
    process: subprocess.Popen
    folder: Path
    stopping_since: float | None = None
    grace: float = 30.0
    reported_end: bool = False


class NodeAgent(threading.Thread):
    """``NodeAgent(plane, name, folder, gpus=..., extra_env=...)``; ``start()`` registers the node
    and serves its pods; ``stop()`` ends every pod's processes and removes the node."""

    def __init__(
        self,
        plane,
        name: str,
        folder: Path,
        *,
        gpus: list[GPU],
        extra_env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        address_base: int = 2,
        interval: float = 0.05,
    ):
        super().__init__(daemon=True, name=f"node-agent-{name}")
        from kubernetes import client

        self.plane, self.name, self.folder = plane, name, folder
        self.gpus, self.extra_env, self.labels = gpus, dict(extra_env or {}), dict(labels or {})
        self.interval = interval
        folder.mkdir(parents=True, exist_ok=True)
        identity = plane.kubeconfig_for(f"node-{name}", f"system:node:{name}", ("system:nodes",))
        api = plane.api_client(identity)
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.pods: dict[str, RunningPod] = {}
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self._next_address = address_base
        self._last_heartbeat = 0.0

    # -- the node ------------------------------------------------------------------------------

    def register(self) -> None:
        node = gpu_node(self.gpus)
        conditions = self._conditions()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    AGENT_LABEL: "true",
                    **self.labels,
                },
                "annotations": node["annotations"],
            },
            "status": {
                "capacity": node["capacity"],
                "allocatable": node["capacity"],
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
                "nodeInfo": self._node_info(),
            },
        }
        self.core.create_node(body, _preload_content=False)
        self._heartbeat()

    @staticmethod
    def _node_info() -> dict[str, str]:
        return {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "v1.36.3",
            "containerRuntimeVersion": "jupyter-vgpu-test-agent://1",
            "kernelVersion": os.uname().release,
            "osImage": "test agent",
            "bootID": "",
            "machineID": "",
            "systemUUID": "",
            "kubeProxyVersion": "",
        }

    @staticmethod
    def _conditions() -> list[dict[str, str]]:
        stamp = now()
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test agent is ready"}
        quiet = [
            {"type": kind, "status": "False", "reason": f"KubeletHas{reason}", "message": "test agent"}
            for kind, reason in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        return [{**item, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp} for item in [ready, *quiet]]

    def _heartbeat(self) -> None:
        from kubernetes import client

        self.core.patch_node_status(self.name, {"status": {"conditions": self._conditions()}}, _preload_content=False)
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_now()},
        }
        try:
            self.coordination.patch_namespaced_lease(
                self.name, "kube-node-lease", {"spec": lease["spec"]}, _preload_content=False
            )
        except client.ApiException as error:
            if error.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", lease, _preload_content=False)
        self._last_heartbeat = time.monotonic()

    # -- the loop ------------------------------------------------------------------------------

    def start(self) -> None:
        self.register()
        super().start()
        self.wait_schedulable()

    def wait_schedulable(self, timeout: float = 60.0) -> None:
        """Until the node lifecycle controller has lifted the not-ready taint that the API server
        puts on every new node (TaintNodesByCondition): before that no pod is placed here."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = json.loads(self.core.read_node(self.name, _preload_content=False).data)
            taints = node.get("spec", {}).get("taints") or []
            if not any(taint.get("key", "").startswith("node.kubernetes.io/") for taint in taints):
                return
            if self.errors:
                raise RuntimeError(f"node agent {self.name}: {self.errors[-1]}")
            time.sleep(0.05)
        raise TimeoutError(f"node {self.name} still tainted after {timeout} s: {taints}")

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.step()
                if time.monotonic() - self._last_heartbeat > HEARTBEAT:
                    self._heartbeat()
            except Exception as error:  # noqa: BLE001 -- a failing agent is reported by the test
                self.errors.append(f"{error!r}: {getattr(error, 'body', '') or error}"[:600])
            self.stopped.wait(self.interval)

    def bound_pods(self) -> list[dict[str, Any]]:
        reply = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.name}", _preload_content=False
        )
        return list(json.loads(reply.data)["items"])

    def step(self) -> None:
        present = {}
        for pod in self.bound_pods():
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            present[key] = pod
            running = self.pods.get(key)
            if running is not None and running.uid != pod["metadata"]["uid"]:
                self._end(key)  # the same name, a new pod
                running = None
            if pod["metadata"].get("deletionTimestamp"):
                self._stopping(key, pod)
            elif running is None and pod.get("status", {}).get("phase") in (None, "Pending"):
                self._run(key, pod)
        for key, running in list(self.pods.items()):
            if key not in present:
                self._end(key)
            elif running.process.poll() is not None and not running.reported_end and running.stopping_since is None:
                self._report_end(running)

    # -- one pod -------------------------------------------------------------------------------

    def _run(self, key: str, pod: dict[str, Any]) -> None:
        from kubernetes import client

        metadata, spec = pod["metadata"], pod["spec"]
        namespace = metadata["namespace"]
        volumes: dict[str, dict[str, bytes]] = {}
        for volume in spec.get("volumes") or []:
            secret = (volume.get("secret") or {}).get("secretName")
            if not secret:
                continue
            try:
                data = json.loads(self.core.read_namespaced_secret(secret, namespace, _preload_content=False).data)
            except client.ApiException as error:
                if error.status in (403, 404):
                    return  # not there yet, or the Node authorizer has not seen the pod's tie to it yet: next step
                raise
            volumes[volume["name"]] = {
                name: base64.b64decode(encoded) for name, encoded in (data.get("data") or {}).items()
            }
        container = spec["containers"][0]
        address = f"127.0.0.{self._next_address}"
        self._next_address += 1
        folder = self.folder / f"{namespace}.{metadata['name']}"
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] not in volumes:
                continue
            local = folder / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            for name, content in volumes[mount["name"]].items():
                (local / name).write_bytes(self._narrowed(name, content, address))
            mounts[mount["mountPath"]] = local
        command = [
            self._local_path(part, mounts) for part in [*container.get("command", []), *container.get("args", [])]
        ]
        env = {**os.environ, **self.extra_env}
        for name in (
            "JUPYTER_VGPU_SERVER_URL",
            "JUPYTER_VGPU_KERNEL_ID",
            "JUPYTER_VGPU_KERNEL_CREDENTIAL",
            "LD_PRELOAD",
            "VGPU_REGION",
            "KUBECONFIG",
        ):
            env.pop(name, None)  # a container starts clean, not with this test process's variables
        env.update({item["name"]: str(item.get("value", "")) for item in container.get("env") or []})
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "container.log", "wb") as log:
            process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.pods[key] = RunningPod(metadata["name"], namespace, metadata["uid"], address, process, folder, grace=grace)
        started = now()
        status = {
            "phase": "Running",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": started,
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": started}
                for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                }
            ],
        }
        try:
            self.core.patch_namespaced_pod_status(
                metadata["name"], namespace, {"status": status}, _preload_content=False
            )
        except client.ApiException as error:
            if error.status != 404:
                raise  # 404: deleted meanwhile; the next step ends its processes

    @staticmethod
    def _narrowed(name: str, content: bytes, address: str) -> bytes:
        if not name.endswith(".json"):
            return content
        try:
            document = json.loads(content)
        except ValueError:
            return content
        if isinstance(document, dict) and document.get("ip") == "0.0.0.0" and "shell_port" in document:
            document["ip"] = address
            return json.dumps(document).encode()
        return content

    @staticmethod
    def _local_path(part: str, mounts: dict[str, Path]) -> str:
        for mount_path, local in mounts.items():
            if part == mount_path or part.startswith(mount_path + "/"):
                return str(local) + part[len(mount_path) :]
        return part

    def _report_end(self, running: RunningPod) -> None:
        code = running.process.returncode
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "finishedAt": now()}
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "kernel",
                    "image": "",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
        with contextlib.suppress(Exception):
            self.core.patch_namespaced_pod_status(
                running.name, running.namespace, {"status": status}, _preload_content=False
            )
        running.reported_end = True

    def _stopping(self, key: str, pod: dict[str, Any]) -> None:
        """A deleted pod: its processes get SIGTERM, SIGKILL after its grace period; once none is
        left the agent removes the pod (grace 0, for exactly this pod: its uid)."""
        from kubernetes import client

        running = self.pods.get(key)
        if running is not None and running.process.poll() is None:
            if running.stopping_since is None:
                running.stopping_since = time.monotonic()
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                running.grace = float(grace if grace is not None else running.grace)
                self._signal(running, signal.SIGTERM)
            if time.monotonic() - running.stopping_since < running.grace:
                return
            self._signal(running, signal.SIGKILL)
            running.process.wait()
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod["metadata"]["uid"])
        )
        try:
            self.core.delete_namespaced_pod(
                pod["metadata"]["name"], pod["metadata"]["namespace"], body=body, _preload_content=False
            )
        except client.ApiException as error:
            if error.status not in (404, 409):
                raise

    @staticmethod
    def _signal(running: RunningPod, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.process.pid, signum)

    def _end(self, key: str) -> None:
        running = self.pods.pop(key)
        if running.process.poll() is None:
            self._signal(running, signal.SIGKILL)
            running.process.wait()

    # -- the test's end --------------------------------------------------------------------------

    def kill_pod_processes(self) -> None:
        for running in self.pods.values():
            self._signal(running, signal.SIGKILL)
        for running in self.pods.values():
            running.process.wait()

    def stop(self, remove_node: bool = True) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join(10)
        self.kill_pod_processes()
        self.pods.clear()
        # What the pods' processes started (a kernel under its in-pod agent) is in their process
        # groups and went with them; wait until the last is gone, as a node that stopped its pods.
        from support import folder_processes, wait_for

        wait_for(
            lambda: not folder_processes(self.folder),
            30,
            f"every process of node {self.name}'s pods to end",
            interval=0.05,
        )
        if remove_node:
            admin = self.plane.api_client()
            from kubernetes import client

            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(admin).delete_node(self.name, _preload_content=False)
