"""A stand-in for a Kubernetes cluster, for tests of pod kernels (fixtures in tests/pods/conftest.py).

No Kubernetes API server can be installed here, so tests talk to kmock's ``KubernetesEmulator``
(PyPI): a stateful in-memory API the official client talks to over HTTP. Where it is less than a
cluster, this module does what the cluster would, from outside the product code: ``StandIn``
gives created objects a uid and a creation time (the API server does), ``Scheduler`` leaves pods
waiting the way a full cluster does, and ``Kubelet`` plays scheduler and node: it runs a pod's
command as a local process with its Secret's files in a folder. kmock ignores label selectors;
the product filters lists itself, so that gap is left open on purpose.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import threading
import uuid
from datetime import datetime, timezone
from pathlib import Path

import kmock
from kmock._internal import apps
from support import folder_processes, wait_for

from jupyter_vgpu.pods.manifest import SECRET_DIR

RESOURCES = ("v1/pods", "v1/secrets", "v1/events")


class StandInEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with what an API server adds to every object it creates."""

    async def _handle(self, request):
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        try:
            return await super()._handle(request)
        finally:
            # kmock keeps every request it served and looks through them all for each new one, so
            # it answers slower and slower (about 0.07 ms more per earlier request; a Kubelet lists
            # pods 20 times a second). Forgotten once answered, each request costs the same.
            self._requests.remove(request)


class StandIn:
    """The stand-in API on 127.0.0.1, served from a thread of its own, with a kubeconfig naming it
    and a client for the test to play the cluster's own parts with."""

    emulator_class = StandInEmulator

    def __init__(self, folder: Path):
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        self._started.wait(30)
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "standin", "user": {"token": "standin-token"}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
                    "current-context": "standin",
                }
            )
        )
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        self.api = client.CoreV1Api(client.ApiClient(configuration))

    async def _serve(self):
        async with self.emulator_class() as emulator, apps.Server(emulator) as server:
            for resource in RESOURCES:
                emulator.resources[resource] = {}
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            await self._stop.wait()

    def close(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def forbid(self, verb: str, plural: str):
        """Answer ``verb`` on ``plural`` with RBAC's 403, as a cluster whose Role lacks it does.
        (kmock still records an object whose creation it refused: tests do not look for one.)"""
        action = {
            "create": kmock.action.CREATE,
            "list": kmock.action.LIST,
            "get": kmock.action.FETCH,
            "delete": kmock.action.DELETE,
        }[verb]
        refusal = kmock.KubernetesError(
            status=403,
            reason="Forbidden",
            message=f'{plural} is forbidden: User "system:serviceaccount:jupyter:jupyter" cannot {verb} resource '
            f'"{plural}" in API group "" in the namespace "default"',
        )
        done = threading.Event()

        def react():
            self.emulator[action, kmock.resource("", "v1", plural)] << refusal
            done.set()

        self._loop.call_soon_threadsafe(react)
        done.wait(10)

    # -- reading and playing the cluster -------------------------------------------------------

    def pods(self, namespace: str = "default") -> list[dict]:
        return json.loads(self.api.list_namespaced_pod(namespace, _preload_content=False).data)["items"]

    def pod(self, name: str, namespace: str = "default") -> dict | None:
        return self._read_or_none(self.api.read_namespaced_pod, name, namespace)

    def secret(self, name: str, namespace: str = "default") -> dict | None:
        return self._read_or_none(self.api.read_namespaced_secret, name, namespace)

    @staticmethod
    def _read_or_none(read, name: str, namespace: str) -> dict | None:
        """The object ``read`` (an API client's read_namespaced_*) finds, or None where there is none."""
        from kubernetes.client import ApiException

        try:
            return json.loads(read(name, namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def set_status(self, name: str, status: dict, namespace: str = "default", **metadata):
        body = {"status": status}
        if metadata:
            body["metadata"] = metadata
        self.api.patch_namespaced_pod_status(name, namespace, body, _preload_content=False)

    def event(self, pod: str, reason: str, message: str, namespace: str = "default"):
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.api.create_namespaced_event(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:8]}", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                "reason": reason,
                "message": message,
                "type": "Warning" if reason.startswith("Failed") else "Normal",
                "lastTimestamp": now,
            },
            _preload_content=False,
        )


def kernel_status(phase: str, state: dict, **pod_status) -> dict:
    """A pod status of ``phase`` whose one container, the kernel, is in ``state`` (``{"running":
    ...}``, ``{"waiting": ...}``, ``{"terminated": ...}``) and ready only while it runs."""
    container = {"name": "kernel", "ready": "running" in state, "restartCount": 0, "image": "i", "imageID": ""}
    return {"phase": phase, **pod_status, "containerStatuses": [{**container, "state": state}]}


def running_status(ip: str = "127.0.0.1", node: str = "node-a") -> dict:
    return kernel_status(
        "Running",
        {"running": {"startedAt": "2026-11-23T00:00:00Z"}},
        podIP=ip,
        hostIP=ip,
        conditions=[{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
    )


class Kubelet(threading.Thread):
    """Plays scheduler and node for the stand-in: each new pod is bound to ``node`` (with HAMi's
    annotations), its Secret's files are written into a folder, its command runs as a local
    process with that folder where the Secret is mounted, and the pod is set Running at
    127.0.0.1; a deleted pod's process is stopped, and an exited process ends its pod."""

    def __init__(self, standin: StandIn, folder: Path, extra_env: dict[str, str]):
        super().__init__(daemon=True)
        self.standin, self.folder, self.extra_env = standin, folder, extra_env
        self.processes: dict[str, subprocess.Popen] = {}
        self.stopped = threading.Event()
        self.errors: list[str] = []

    def run(self):
        while not self.stopped.is_set():
            try:
                self.step()
            except Exception as error:  # noqa: BLE001  (a failing kubelet is reported by the test)
                self.errors.append(repr(error))
            self.stopped.wait(0.05)

    def step(self):
        present = {pod["metadata"]["name"]: pod for pod in self.standin.pods()}
        for name, pod in present.items():
            if name not in self.processes and not pod["metadata"].get("deletionTimestamp"):
                secret = self.standin.secret(name)
                if secret is None:
                    continue  # a kubelet waits for the Secret it mounts
                self.processes[name] = self.run_pod(pod, secret)
                status = running_status()
                annotations = {
                    "hami.io/vgpu-node": "node-a",
                    "hami.io/vgpu-devices-allocated": "GPU-standin-0,NVIDIA,4096,30:;",
                }
                self.standin.api.patch_namespaced_pod(
                    name,
                    "default",
                    {"metadata": {"annotations": annotations}, "spec": {"nodeName": "node-a"}},
                    _preload_content=False,
                )
                self.standin.set_status(name, status)
        for name, process in list(self.processes.items()):
            if name not in present and process.poll() is None:
                process.terminate()
            elif (
                name in present
                and process.poll() is not None
                and present[name].get("status", {}).get("phase") == "Running"
            ):
                code = process.returncode
                ended = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}
                self.standin.set_status(name, kernel_status("Succeeded" if code == 0 else "Failed", ended))

    def run_pod(self, pod: dict, secret: dict) -> subprocess.Popen:
        mounted = self.folder / pod["metadata"]["name"]
        mounted.mkdir(parents=True)
        data = secret.get("data") or {}
        for name, text in (secret.get("stringData") or {}).items():
            (mounted / name).write_text(text)
        for name, encoded in data.items():
            (mounted / name).write_bytes(base64.b64decode(encoded))
        container = pod["spec"]["containers"][0]
        command = [
            str(mounted) if part == SECRET_DIR else part.replace(SECRET_DIR, str(mounted))
            for part in container["command"]
        ]
        env = {**os.environ, **self.extra_env, **{item["name"]: item["value"] for item in container.get("env", [])}}
        for name in (
            "JUPYTER_VGPU_SERVER_URL",
            "JUPYTER_VGPU_KERNEL_ID",
            "JUPYTER_VGPU_KERNEL_CREDENTIAL",
            "LD_PRELOAD",
            "VGPU_REGION",
        ):
            env.pop(name, None)  # a pod starts clean, not with this test process's variables
        with open(self.folder / f"{pod['metadata']['name']}.log", "w") as log:  # the child keeps its own descriptor
            # A session of its own, as a container: stopping the pod ends every process in it.
            return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self):
        """Ends every pod's processes, the kernel its agent started included (it outlived its
        agent's SIGKILL before), and waits until none is left."""
        self.stopped.set()
        self.join(10)
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        wait_for(lambda: not folder_processes(self.folder), 30, "every pod's processes to end", interval=0.05)


class Scheduler(threading.Thread):
    """Plays a cluster that leaves new pods waiting: ``act(standin, pod_name)`` runs once for each
    new pod (set a status, add events)."""

    def __init__(self, standin: StandIn, act):
        super().__init__(daemon=True)
        self.standin, self.act, self.seen, self.errors = standin, act, set(), []
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            try:
                for pod in self.standin.pods():
                    name = pod["metadata"]["name"]
                    if name not in self.seen:
                        self.seen.add(name)
                        self.act(self.standin, name)
            except Exception as error:  # noqa: BLE001
                self.errors.append(repr(error))
            self.stopped.wait(0.05)


POD_KERNEL = "vgpu-pod-test"
OWNER = "ada"
POD_SIM_DEVICES = "name=Sim Pod GPU,memory=8GiB,sms=100,context_memory=0"
