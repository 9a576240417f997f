"""The pod holder: a slice held by a Kubernetes pod that the cluster's GPU-sharing scheduler
placed and gave the slice as extended resources.

The pod itself is made by the pod provisioner (it needs the kernel manager's connection details);
this holder keeps what the server knows of each pod slice: the pod's state as last read (the
provisioner reports every reading here), and the usage the kernel's in-pod agent last reported.
A resize is held to what the pod was granted and reaches the pod on the agent's next report.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.holders.base import SliceUsage
from jupyter_vgpu.holders.region import PROCESS_FIELDS, ProcessUsage
from jupyter_vgpu.ledger import Allocation, CapacityError
from jupyter_vgpu.model import SliceLimits, format_size
from jupyter_vgpu.pods.cluster import Cluster, ClusterError
from jupyter_vgpu.pods.manifest import KERNEL_LABEL, MANAGED_BY, OWNER_LABEL, SERVER_LABEL, label_value
from jupyter_vgpu.pods.phases import PodState, pod_state

POD_KEY, GRANT_KEY = "pod", "grant"  # the allocation's metadata: {"name", "namespace"}, {"memory_bytes", "cores"}
# What an in-pod agent reports of each process: the region's per-process figures, by name.
PROCESS_REPORT_FIELDS = PROCESS_FIELDS  # what a pod agent reports of each process


def grant_of(allocation: Allocation) -> SliceLimits | None:
    grant = allocation.metadata.get(GRANT_KEY)
    if not grant:
        return None
    return SliceLimits(grant["memory_bytes"], grant["cores"], allocation.policy)


@dataclass
class _Report:
    at: float
    processes: list[ProcessUsage]
    sm_util_percent: float
    limits: SliceLimits | None


@dataclass(frozen=True)
class PodScope:
    """Where one server's kernel pods are: their namespace and owner label."""

    namespace: str
    owner: str

    def labels(self) -> dict[str, str]:
        return {MANAGED_BY[0]: MANAGED_BY[1], OWNER_LABEL: label_value(self.owner)}


class PodHolder:
    kind = "pod"

    def __init__(
        self,
        server_instance: str,
        scopes: list[PodScope] | None = None,
        *,
        cluster_factory=Cluster.from_environment,
        log=None,
    ):
        """``server_instance``: this server's id in its pods' labels; ``scopes``: where
        :meth:`sweep` looks for pods an earlier server left."""
        self.server_instance = server_instance
        self._cluster_factory = cluster_factory
        self._cluster: Cluster | None = None
        self.scopes = list(scopes or [])
        self.log = log
        self._lock = threading.Lock()
        self._states: dict[str, PodState] = {}
        self._reports: dict[str, _Report] = {}

    @property
    def cluster(self) -> Cluster:
        """The cluster, connected on first use (a server without pod kernels never connects)."""
        if self._cluster is None:
            self._cluster = self._cluster_factory()
        return self._cluster

    # -- what the provisioner and the in-pod agent tell it ---------------------------------------

    def observe(self, kernel_id: str, state: PodState) -> None:
        with self._lock:
            self._states[kernel_id] = state

    def state(self, kernel_id: str) -> PodState | None:
        with self._lock:
            return self._states.get(kernel_id)

    def record_report(self, allocation: Allocation, report: dict[str, Any]) -> None:
        """Keep a usage report of the kernel's in-pod agent (validated by the handler)."""
        limits = report.get("limits")
        in_force = SliceLimits(limits["memory_bytes"], limits["cores"], limits["policy"]) if limits else None
        processes = [
            ProcessUsage(**{name: int(process.get(name, 0)) for name in PROCESS_REPORT_FIELDS})
            for process in report.get("processes", [])
        ]
        with self._lock:
            self._reports[allocation.kernel_id] = _Report(
                time.monotonic(), processes, float(report.get("sm_util", 0.0)), in_force
            )

    # -- the Holder protocol -------------------------------------------------------------------

    def create(self, allocation: Allocation) -> None:
        """Nothing to make yet: the provisioner creates the pod, with the kernel's connection."""

    def check_limits(self, allocation: Allocation, wanted: SliceLimits) -> None:
        grant = grant_of(allocation)
        if grant is None:
            return
        over = []
        if wanted.memory_limit > grant.memory_limit:
            over.append(f"{format_size(grant.memory_limit)} of GPU memory")
        if wanted.sm_share > grant.sm_share:
            over.append(f"{grant.sm_share} percent of the SMs")
        if over:
            raise CapacityError(
                f"kernel {allocation.kernel_id!r} runs in a pod the cluster granted {' and '.join(over)}; "
                "a pod cannot grow in place. Ask for at most that, or restart the kernel with the new size: "
                "it starts on a new pod, which may wait for the scheduler again",
                resource="grant",
                requested=wanted.memory_limit if wanted.memory_limit > grant.memory_limit else wanted.sm_share,
                available=grant.memory_limit if wanted.memory_limit > grant.memory_limit else grant.sm_share,
            )

    def apply_limits(self, allocation: Allocation) -> None:
        """Nothing to push: the in-pod agent reads the ledger's limits in the reply to its next report."""

    def usage(self, allocation: Allocation) -> SliceUsage:
        with self._lock:
            state = self._states.get(allocation.kernel_id)
            report = self._reports.get(allocation.kernel_id)
        pod = allocation.metadata.get(POD_KEY, {})
        location = {"pod": pod.get("name", ""), "namespace": pod.get("namespace", "")}
        if state is None:
            return SliceUsage("scheduling", message="the kernel's pod is being created", location=location)
        location.update(state.location())
        # A report three intervals old is from an agent that stopped: show no usage rather than old usage.
        if report is None or time.monotonic() - report.at > 3 * pod.get("report_interval", 1.0):
            return SliceUsage(state.state, message=state.message, location=location)
        message = state.message
        if report.limits is not None and report.limits != allocation.limits:
            message += "; the pod applies the slice's new limits on its next report"
        return SliceUsage(state.state, report.processes, report.sm_util_percent, message=message, location=location)

    def is_alive(self, allocation: Allocation) -> bool:
        pod = allocation.metadata.get(POD_KEY)
        if not pod:
            return False
        # What this server last read of the pod, if it started it: no API call (the slice watcher
        # asks on the event loop). Only a slice left by an earlier server is looked up.
        known = self.state(allocation.kernel_id)
        if known is not None:
            return not known.over
        try:
            found = pod_state(self.cluster.read_pod(pod["namespace"], pod["name"]))
        except ClusterError as error:
            self._warn("cannot tell whether the pod of kernel %s still runs: %s", allocation.kernel_id, error)
            return False
        self.observe(allocation.kernel_id, found)  # why it is gone, where it is, for the log and the listing
        return not found.over and found.state != "stopping"

    def stop(self, allocation: Allocation) -> list[str]:
        pod = allocation.metadata.get(POD_KEY)
        if pod:
            self._delete(pod["namespace"], pod["name"])
        return []  # the cluster frees what a deleted pod held

    def release(self, kernel_id: str) -> None:
        with self._lock:
            self._states.pop(kernel_id, None)
            self._reports.pop(kernel_id, None)

    def sweep(self, kept: set[str]) -> list[str]:
        """Delete the kernel pods (and Secrets) of this owner that no slice of the ledger knows
        (a start cut short before it was recorded, a ledger lost): nothing can adopt them, as
        nothing knows their kernelspec. The pods of the ledger's kernels are adopted instead."""
        swept = []
        for scope in self.scopes:
            try:
                pods = self.cluster.list_pods(scope.namespace, scope.labels())
            except ClusterError as error:
                self._warn(
                    "cannot look for kernel pods left by an earlier server in namespace %s: %s", scope.namespace, error
                )
                continue
            for pod in pods:
                labels = pod["metadata"].get("labels", {})
                kernel_id = labels.get(KERNEL_LABEL, "")
                if kernel_id in kept or labels.get(SERVER_LABEL) == label_value(self.server_instance):
                    continue
                self._delete(scope.namespace, pod["metadata"]["name"])
                swept.append(kernel_id)
        return swept

    def _delete(self, namespace: str, name: str) -> None:
        try:
            self.cluster.delete_pod(namespace, name, grace_seconds=0)
            self.cluster.delete_secret(namespace, name)
        except ClusterError as error:
            self._warn("cannot delete kernel pod %s/%s: %s", namespace, name, error)

    def _warn(self, message: str, *args: Any) -> None:
        if self.log is not None:
            self.log.warning(message, *args)
