"""The Pod and the Secret a pod kernel start creates, as plain Kubernetes manifests.

Pure functions of a :class:`PodSettings` (the provisioner's configuration), the kernel and its
slice: ``jupyter vgpu pod-manifest`` prints exactly what a start would create. The kernel's
connection file (HMAC key, fixed ports) and its credential for the server's API go into a Secret
owned by the pod, mounted read-only; nothing in the pod calls back to open a connection.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.model import SliceLimits

MIB, GIB = 1 << 20, 1 << 30
MEMORY_UNITS = {"MiB": MIB, "GiB": GIB}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
PORT_NAMES = ("shell", "iopub", "stdin", "control", "hb")  # jupyter_client's order of ports
SECRET_DIR = "/var/run/jupyter-vgpu"
CONNECTION_FILE = "connection.json"
SLICE_FILE = "slice.json"
CONTAINER = "kernel"
REDACTED = "<redacted>"

MANAGED_BY = ("app.kubernetes.io/managed-by", "jupyter-vgpu")
COMPONENT = ("app.kubernetes.io/component", "kernel")
OWNER_LABEL = "jupyter-vgpu.io/owner"
KERNEL_LABEL = "jupyter-vgpu.io/kernel-id"
SERVER_LABEL = "jupyter-vgpu.io/server"

# https://kubernetes.io/docs/concepts/overview/working-with-objects/names/ and labels/
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


class ManifestError(ValueError):
    """Configuration that would make a pod the API server refuses; the message names the setting."""


def label_value(text: str) -> str:
    """``text`` as a valid label value (owner names may hold '@', spaces, ...): other characters
    become '-', and it is cut to 63 characters with alphanumeric ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.") or "unknown"


@dataclass(frozen=True)
class PodSettings:
    """Everything configurable about a kernel's pod (see ``VGPUPodProvisioner`` for each one's help)."""

    namespace: str = "default"
    image: str = "quay.io/jupyter/pytorch-notebook:latest"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str = ""
    scheduler_name: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cpu_request: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    memory_limit: str = ""
    gpu_resource: str = "nvidia.com/gpu"
    memory_resource: str = "nvidia.com/gpumem"
    memory_resource_unit: str = "MiB"
    cores_resource: str = "nvidia.com/gpucores"
    pod_template: dict[str, Any] = field(default_factory=dict)
    python: str = "python"
    in_pod_slices: bool = True
    ports: tuple[int, ...] = (52101, 52102, 52103, 52104, 52105)

    def check(self) -> None:
        """Raise ManifestError for a value Kubernetes would refuse, saying what is accepted."""
        if not _DNS_LABEL.match(self.namespace):
            raise ManifestError(f"namespace {self.namespace!r} is not a DNS label (lower-case letters, digits, '-')")
        if not self.image.strip():
            what = (
                "ipykernel and jupyter-vgpu (no public image has jupyter-vgpu: build the kernel image of "
                "docs/kubernetes.md from this repository's wheel), or set in_pod_slices = False for any image "
                "with ipykernel"
                if self.in_pod_slices
                else "ipykernel"
            )
            raise ManifestError(f"image is not set; name the kernel image (VGPUPodProvisioner.image), one with {what}")
        if self.image_pull_policy not in PULL_POLICIES:
            raise ManifestError(
                f"image_pull_policy {self.image_pull_policy!r} is not one of {', '.join(PULL_POLICIES)}"
            )
        if self.memory_resource_unit not in MEMORY_UNITS:
            raise ManifestError(
                f"memory_resource_unit {self.memory_resource_unit!r} is not one of {', '.join(MEMORY_UNITS)}"
            )
        for setting in ("gpu_resource", "memory_resource", "cores_resource"):
            name = getattr(self, setting)
            if name and not _QUALIFIED_NAME.match(name):
                raise ManifestError(f"{setting} {name!r} is not a resource name like nvidia.com/gpumem")
        if not self.gpu_resource:
            raise ManifestError("gpu_resource is empty; name the resource that gives a pod a GPU (nvidia.com/gpu)")
        for setting in ("cpu_request", "cpu_limit", "memory_request", "memory_limit"):
            quantity = getattr(self, setting)
            if quantity and not _QUANTITY.match(quantity):
                raise ManifestError(f"{setting} {quantity!r} is not a Kubernetes quantity like 500m, 2 or 4Gi")
        for setting in ("labels", "node_selector"):
            for key, value in getattr(self, setting).items():
                if not _QUALIFIED_NAME.match(str(key)) or not _LABEL_VALUE.match(str(value)):
                    raise ManifestError(f"{setting} entry {key!r}: {value!r} is not a valid label key and value")
        for key in self.annotations:
            if not _QUALIFIED_NAME.match(str(key)):
                raise ManifestError(f"annotations key {key!r} is not a valid annotation key")
        for name in self.env:
            if not re.match(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", str(name)):
                raise ManifestError(f"env name {name!r} is not a valid environment variable name")
        if len(self.ports) != len(PORT_NAMES) or len(set(self.ports)) != len(PORT_NAMES):
            raise ManifestError(
                f"ports must be {len(PORT_NAMES)} different ports (for {', '.join(PORT_NAMES)}), not {list(self.ports)}"
            )
        if not all(1024 <= port <= 65535 for port in self.ports):
            raise ManifestError(f"ports must be between 1024 and 65535, not {list(self.ports)}")
        for secret in self.image_pull_secrets:
            if not _DNS_LABEL.match(secret) and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", secret):
                raise ManifestError(f"image_pull_secrets entry {secret!r} is not a Secret name")
        for toleration in self.tolerations:
            if not isinstance(toleration, dict):
                raise ManifestError(
                    f"tolerations entry {toleration!r} is not a mapping like {{'key': ..., 'operator': 'Exists'}}"
                )

    def resources(self, limits: SliceLimits) -> dict[str, dict[str, str]]:
        """The container's resources: the slice as the scheduler's extended resources (requests
        equal limits for extended resources), and CPU and RAM as configured."""
        unit = MEMORY_UNITS[self.memory_resource_unit]
        gpu = {self.gpu_resource: "1", self.memory_resource: str(math.ceil(limits.memory_limit / unit))}
        if self.cores_resource:
            gpu[self.cores_resource] = str(limits.sm_share)
        requests = {
            name: value for name, value in (("cpu", self.cpu_request), ("memory", self.memory_request)) if value
        }
        ceilings = {name: value for name, value in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if value}
        return {"limits": {**gpu, **ceilings}, "requests": requests}

    def granted(self, limits: SliceLimits) -> SliceLimits:
        """The largest slice the pod made for ``limits`` holds (the scheduler grants whole units)."""
        unit = MEMORY_UNITS[self.memory_resource_unit]
        return SliceLimits(math.ceil(limits.memory_limit / unit) * unit, limits.sm_share, limits.policy)


@dataclass(frozen=True)
class KernelPod:
    """What one start of one kernel is: names and labels of its pod and Secret."""

    kernel_id: str
    owner: str
    server: str  # this server's instance, so a restarted server knows its predecessor's pods
    start: int = 1  # a restart is a new pod with a new name

    @property
    def name(self) -> str:
        return f"jvgpu-{self.kernel_id}-{self.start}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            MANAGED_BY[0]: MANAGED_BY[1],
            COMPONENT[0]: COMPONENT[1],
            OWNER_LABEL: label_value(self.owner),
            KERNEL_LABEL: label_value(self.kernel_id),
            SERVER_LABEL: label_value(self.server),
        }


def kernel_command(settings: PodSettings) -> list[str]:
    """The pod's command: the in-pod agent (slice + usage reports) or a plain ipykernel."""
    if settings.in_pod_slices:
        return [settings.python, "-m", "jupyter_vgpu.pod_agent", SECRET_DIR]
    return [settings.python, "-m", "ipykernel_launcher", "-f", f"{SECRET_DIR}/{CONNECTION_FILE}"]


def pod_manifest(settings: PodSettings, kernel: KernelPod, limits: SliceLimits) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": kernel_command(settings),
        "env": [{"name": name, "value": str(value)} for name, value in sorted(settings.env.items())],
        "ports": [{"name": name, "containerPort": port} for name, port in zip(PORT_NAMES, settings.ports, strict=True)],
        "resources": settings.resources(limits),
        "volumeMounts": [{"name": "kernel-connection", "mountPath": SECRET_DIR, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if limits.policy == "hard":
        # HAMi-core in the container then holds the SM share even when the pod is alone on its GPU.
        container["env"].append({"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a restart is a new pod, made by the provisioner
        "automountServiceAccountToken": False,  # the kernel has no business with the API
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "kernel-connection", "secret": {"secretName": kernel.name, "defaultMode": 0o400}}],
    }
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.scheduler_name:
        spec["schedulerName"] = settings.scheduler_name
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = copy.deepcopy(settings.tolerations)
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in settings.image_pull_secrets]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": kernel.name,
            "namespace": settings.namespace,
            "labels": {**settings.labels, **kernel.labels},
            "annotations": dict(settings.annotations),
        },
        "spec": spec,
    }
    return merge(pod, settings.pod_template)


def secret_manifest(
    settings: PodSettings, kernel: KernelPod, connection: dict[str, Any], slice_file: dict[str, Any], pod_uid: str = ""
) -> dict[str, Any]:
    """The kernel's Secret, owned by its pod (``pod_uid``) so the cluster deletes it with the pod."""
    metadata: dict[str, Any] = {"name": kernel.name, "namespace": settings.namespace, "labels": kernel.labels}
    if pod_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": kernel.name, "uid": pod_uid, "blockOwnerDeletion": False}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "stringData": {
            CONNECTION_FILE: json.dumps(connection, indent=1),
            SLICE_FILE: json.dumps(slice_file, indent=1),
        },
    }


def redacted(secret: dict[str, Any]) -> dict[str, Any]:
    """A Secret as it may be shown: the HMAC key and the kernel credential replaced."""
    shown = copy.deepcopy(secret)
    for name, secret_field in ((CONNECTION_FILE, "key"), (SLICE_FILE, "credential")):
        content = json.loads(shown["stringData"][name])
        if content.get(secret_field):
            content[secret_field] = REDACTED
        shown["stringData"][name] = json.dumps(content, indent=1)
    return shown


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged into a copy of ``base``: mappings merge key by key, anything else
    (lists included) replaces, and ``None`` removes the key."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
