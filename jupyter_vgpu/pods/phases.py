"""A kernel pod's state in the words a user needs: what it waits for, where it runs, why it failed.

Read from the pod's status and its events only (the scheduler's reason is in the PodScheduled
condition or a FailedScheduling event; pulling in a Pulling event; the node and GPU HAMi chose in
its annotations), so it holds for any scheduler and any cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.model.sizes import MIB, format_size

HAMI_NODE = "hami.io/vgpu-node"
HAMI_DEVICES = "hami.io/vgpu-devices-allocated"
# Container waiting reasons that do not get better by themselves within a kernel start.
FAILING_REASONS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}
# queued: the scheduler found no room for the pod yet (it waits in the cluster's line); scheduling:
# the scheduler has not decided yet.
WAITING_STATES = ("queued", "scheduling", "pulling", "starting")


@dataclass(frozen=True)
class PodState:
    """``state``: queued, scheduling, pulling, starting (waiting states), running, stopping,
    failed, exited or gone; ``message``: one sentence for people; ``reason``: the scheduler's own
    words while the pod is queued."""

    state: str
    message: str
    node: str = ""
    gpu: str = ""
    ip: str = ""
    reason: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "running" and bool(self.ip)

    @property
    def over(self) -> bool:
        return self.state in ("failed", "exited", "gone")

    def location(self) -> dict[str, str]:
        return {"node": self.node, "gpu": self.gpu}


def hami_gpu(annotations: dict[str, str]) -> str:
    """The GPU HAMi gave the pod, from ``hami.io/vgpu-devices-allocated``
    (``GPU-UUID,NVIDIA,<MiB>,<cores>:;`` per container): ``GPU-UUID (4GiB, 30%)``, the size as every
    view writes it (format_size)."""
    text = annotations.get(HAMI_DEVICES, "")
    for container in text.split(";"):
        for device in container.split(":"):
            parts = device.split(",")
            if parts and parts[0].strip():
                if len(parts) >= 4 and parts[2].strip().isdigit() and parts[3].strip().isdigit():
                    return f"{parts[0].strip()} ({format_size(int(parts[2]) * MIB)}, {parts[3].strip()}%)"
                return parts[0].strip()
    return ""


def _latest(events: Sequence[dict[str, Any]], *reasons: str) -> dict[str, Any] | None:
    matching = [event for event in events if event.get("reason") in reasons]
    if not matching:
        return None
    return max(matching, key=lambda event: str(event.get("lastTimestamp") or event.get("eventTime") or ""))


def pod_state(pod: dict[str, Any] | None, events: Sequence[dict[str, Any]] = ()) -> PodState:
    if pod is None:
        return PodState("gone", "the kernel's pod no longer exists (it was deleted)")
    metadata, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    annotations = metadata.get("annotations") or {}
    node = spec.get("nodeName") or annotations.get(HAMI_NODE, "")
    where = {"node": node, "gpu": hami_gpu(annotations), "ip": status.get("podIP", "")}
    on_node = f" on node {node}" if node else ""
    if metadata.get("deletionTimestamp"):
        return PodState("stopping", "the kernel's pod is being deleted", **where)
    phase = status.get("phase", "Pending")
    containers = status.get("containerStatuses") or []
    for container in containers:
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        if waiting.get("reason") in FAILING_REASONS:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return PodState(
                "failed", f"the kernel's container cannot start{on_node} ({waiting['reason']}){detail}", **where
            )
        if terminated:
            reason = terminated.get("reason") or f"exit code {terminated.get('exitCode')}"
            detail = f": {terminated['message']}" if terminated.get("message") else ""
            exited = phase == "Succeeded" or terminated.get("exitCode") == 0
            verb = "exited" if exited else "failed"
            return PodState(verb, f"the kernel's container {verb}{on_node} ({reason}){detail}", **where)
    if phase == "Failed":
        reason = status.get("reason") or "Failed"
        detail = f": {status['message']}" if status.get("message") else ""
        return PodState("failed", f"the kernel's pod failed{on_node} ({reason}){detail}", **where)
    if phase == "Succeeded":
        return PodState("exited", f"the kernel's pod finished{on_node}", **where)
    if phase == "Running":
        running = containers and all((c.get("state") or {}).get("running") is not None for c in containers)
        if running and where["ip"]:
            gpu = f", GPU {where['gpu']}" if where["gpu"] else ""
            return PodState("running", f"the kernel runs{on_node}{gpu}", **where)
        return PodState("starting", f"the kernel's container is starting{on_node}", **where)
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if not node and (scheduled is None or scheduled.get("status") != "True"):
        failed = _latest(events, "FailedScheduling")
        reason = (scheduled or {}).get("message") or (failed or {}).get("message", "")
        if (scheduled or {}).get("reason") == "Unschedulable" or failed is not None:
            # The scheduler looked and found no room: the pod waits until the cluster has some.
            return PodState(
                "queued",
                f"waiting in line for room in the cluster: {reason or 'no node has room'}",
                reason=reason,
                **where,
            )
        because = f": {reason}" if reason else ""
        return PodState("scheduling", f"waiting for the scheduler to place the kernel's pod{because}", **where)
    pulling, pulled = _latest(events, "Pulling"), _latest(events, "Pulled")
    if pulling is not None and (
        pulled is None or str(pulled.get("lastTimestamp", "")) < str(pulling.get("lastTimestamp", ""))
    ):
        image = next((c.get("image") for c in spec.get("containers", [])), "")
        return PodState("pulling", f"pulling the kernel image {image}{on_node}".rstrip(), **where)
    return PodState("starting", f"the kernel's container is being created{on_node}", **where)
