"""The pod kernel provisioner: each kernel a Kubernetes pod that asks the cluster's GPU-sharing
scheduler (HAMi or alike) for its slice as extended resources.

A kernelspec selects it with::

    "interrupt_mode": "message",
    "metadata": {"kernel_provisioner": {"provisioner_name": "vgpu-pod-provisioner",
                                        "config": {"image": "...", "memory": "8GiB", "cores": 30}}}

Every setting below is a traitlet, set in the server's config (``c.VGPUPodProvisioner.*``) or per
kernelspec (its ``config``). A start admits the slice in the server's ledger (its own limits on
slices apply; the cluster decides where it fits), creates the pod and then its Secret (the
connection file and the kernel's credential, owned by the pod), waits until the pod runs, saying
what it waits for, and connects to the pod's IP. Nothing in the pod calls back. A restart is a new
pod; shutdown deletes the pod and its Secret.

A pod the scheduler finds no room for waits in the server's line (``queued``, with its place and
the scheduler's reason) until the cluster places it; a start that no node could ever hold is
refused at once. A restarted server adopts its predecessor's live kernel pods (``vgpu_adopt``,
server/adopt.py): their connection comes from their Secret, nothing is created.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import uuid
from dataclasses import fields
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, validate

from jupyter_vgpu.holders.pod import GRANT_KEY, POD_KEY, PodHolder
from jupyter_vgpu.line import LeftLine, Request
from jupyter_vgpu.manager import SliceManager, SliceRefused
from jupyter_vgpu.model import DEFAULT_LIMITS, SliceLimits, decide_limits
from jupyter_vgpu.model.sizes import SIZE_HELP, SM_SHARE_HELP
from jupyter_vgpu.pods.capacity import never_fits
from jupyter_vgpu.pods.cluster import Cluster, ClusterError, Forbidden, default_namespace
from jupyter_vgpu.pods.manifest import (
    CONNECTION_FILE,
    PORT_NAMES,
    REDACTED,
    KernelPod,
    ManifestError,
    PodSettings,
    pod_manifest,
    redacted,
    secret_manifest,
)
from jupyter_vgpu.pods.phases import WAITING_STATES, PodState, pod_state
from jupyter_vgpu.provisioning.base import ADOPT_ARGUMENT, ServerLinked, forget_refused_start, slice_owner

POD_PROVISIONER_NAME = "vgpu-pod-provisioner"
# PodSettings' fields are the provisioner's traits of the same name, but for these.
TRAIT_OF_SETTING = {
    "labels": "extra_labels",
    "annotations": "extra_annotations",
    "env": "extra_env",
    "ports": "kernel_ports",
}
STRING_MAPS = {"node_selector", "labels", "annotations", "env"}  # label values and variables are text
FIRST_POLL = 0.05  # seconds before the first re-reading of a starting pod; doubled up to poll_interval


# The owner label of kernel pods: the same owner as the slices'.
default_owner = slice_owner


class PodStartFailed(SliceRefused):
    """A pod kernel that did not come up: the scheduler, the image, the container or the API
    said no, or the start timed out; the message says what it waited for."""

    def __init__(self, message: str):
        super().__init__(message, kind="cluster")


class VGPUPodProvisioner(ServerLinked, KernelProvisionerBase):
    """Starts a kernel as a pod in a GPU slice the cluster grants."""

    # -- the slice, as for local kernels ------------------------------------------------------
    memory = Unicode(
        "", config=True, help=f"Memory cap of the kernel's slice: {SIZE_HELP}. Empty: the server's default."
    )
    cores = Unicode(
        "", config=True, help=f"SM share of the kernel's slice, {SM_SHARE_HELP}. Empty: the server's default."
    )
    policy = Unicode(
        "", config=True, help="hard: never above the SM share; burst: may use idle SMs. Empty: the server's default."
    )

    # -- the pod ------------------------------------------------------------------------------
    namespace = Unicode(
        "", config=True, help="Namespace of kernel pods. Empty: the server pod's own namespace, else 'default'."
    )
    image = Unicode(
        "",
        config=True,
        help="Kernel image: Python with ipykernel, and jupyter-vgpu for in-pod slices (no public image has it: "
        "build the one of docs/kubernetes.md). Must be set: a start without one is refused, saying so.",
    )
    image_pull_policy = Unicode("IfNotPresent", config=True, help="Always, IfNotPresent or Never.")
    image_pull_secrets = List(Unicode(), config=True, help="Names of Secrets to pull the image with.")
    service_account = Unicode(
        "",
        config=True,
        help="Service account of kernel pods (its token is not mounted). Empty: the namespace's default.",
    )
    scheduler_name = Unicode(
        "", config=True, help="schedulerName of kernel pods, e.g. hami-scheduler. Empty: the cluster's default."
    )
    node_selector = Dict(config=True, help="nodeSelector of kernel pods.")
    tolerations = List(Dict(), config=True, help="tolerations of kernel pods.")
    extra_labels = Dict(config=True, help="Labels added to kernel pods (ours win on a clash).")
    extra_annotations = Dict(config=True, help="Annotations of kernel pods.")
    extra_env = Dict(
        config=True, help="Environment of the kernel container. Nothing of the server's environment is copied."
    )
    cpu_request = Unicode(
        "", config=True, help="CPU request of the kernel container (a quantity like 500m). Empty: none."
    )
    cpu_limit = Unicode("", config=True, help="CPU limit of the kernel container. Empty: none.")
    memory_request = Unicode(
        "", config=True, help="RAM request of the kernel container (a quantity like 4Gi). Empty: none."
    )
    memory_limit = Unicode("", config=True, help="RAM limit of the kernel container. Empty: none.")
    gpu_resource = Unicode(
        "nvidia.com/gpu", config=True, help="Extended resource for one (virtual) GPU; 1 is asked for."
    )
    memory_resource = Unicode(
        "nvidia.com/gpumem", config=True, help="Extended resource for GPU memory (e.g. aliyun.com/gpu-mem)."
    )
    memory_resource_unit = Unicode("MiB", config=True, help="Unit of memory_resource: MiB (HAMi) or GiB (gpushare).")
    cores_resource = Unicode(
        "nvidia.com/gpucores", config=True, help="Extended resource for the SM share in percent. Empty: not asked for."
    )
    pod_template = Dict(
        config=True, help="Merged into the generated pod: mappings merge, other values replace, null removes."
    )
    python = Unicode("python", config=True, help="The Python of the kernel image.")
    in_pod_slices = Bool(
        True,
        config=True,
        help="Run the kernel under jupyter-vgpu's interposer in the pod (the image must carry jupyter-vgpu): usage reports and live resizes within the pod's grant.",
    )
    simulate = Bool(
        False, config=True, help="The kernel uses the simulated GPU in its pod (trying and testing without GPUs)."
    )
    kernel_ports = List(
        Int(),
        default_value=list(PodSettings.ports),
        config=True,
        help=f"The kernel's five ports in its pod ({', '.join(PORT_NAMES)}).",
    )

    # -- the start ----------------------------------------------------------------------------
    start_timeout = Float(
        300.0,
        config=True,
        help="Seconds a start waits for its pod to run once the scheduler placed it (pulling the image, starting "
        "the container); then the pod is deleted and the start fails saying what it waited for. Time in line "
        "does not count: see line_timeout.",
    )
    line_timeout = Float(
        0.0,
        config=True,
        help="Seconds a kernel pod may wait in line for the cluster's room (the scheduler found none yet); then "
        "the pod is deleted and the start fails saying what it waited for. 0: no limit, the start waits until "
        "the cluster has room, as a local kernel waits for its GPU.",
    )
    poll_interval = Float(
        0.5, config=True, help="Most seconds between readings of a starting pod (the first come sooner)."
    )
    report_interval = Float(
        1.0, config=True, help="Seconds between the in-pod agent's usage reports (which also carry resizes to the pod)."
    )
    server_url = Unicode(
        "",
        config=True,
        help="URL of this Jupyter server as kernel pods reach it. Empty: the server's own connection URL (often localhost, which a pod cannot reach).",
    )
    owner = Unicode(
        "",
        config=True,
        help="Owner label of kernel pods; a restarted server deletes the pods its predecessor of the same owner left. Empty: $JUPYTERHUB_USER or the Unix user.",
    )

    @validate("start_timeout", "poll_interval", "report_interval")
    def _positive(self, proposal):
        if proposal["value"] <= 0:
            raise TraitError(f"VGPUPodProvisioner.{proposal['trait'].name} must be more than 0 seconds")
        return proposal["value"]

    @validate("line_timeout")
    def _not_negative(self, proposal):
        if proposal["value"] < 0:
            raise TraitError("VGPUPodProvisioner.line_timeout must be 0 (no limit) or more seconds")
        return proposal["value"]

    _pod: KernelPod | None = None
    _starts = 0
    _namespace = ""
    _state: PodState | None = None
    _state_at = 0.0
    _standalone_cluster: Cluster | None = None
    _adopted = False
    _nodes_forbidden = False  # said once: without the nodes ClusterRole no start is refused as never fitting

    # -- configuration ------------------------------------------------------------------------

    def pod_settings(self) -> PodSettings:
        """The traits as one checked PodSettings; ManifestError names a wrong one."""
        values: dict[str, Any] = {}
        for setting in fields(PodSettings):
            value = getattr(self, TRAIT_OF_SETTING.get(setting.name, setting.name))
            if isinstance(value, dict) and setting.name in STRING_MAPS:
                value = {str(key): str(item) for key, item in value.items()}
            values[setting.name] = tuple(value) if setting.name in ("image_pull_secrets", "ports") else value
        values["namespace"] = self.namespace or default_namespace()
        settings = PodSettings(**values)
        settings.check()
        return settings

    def _configured(self) -> dict[str, str]:
        return {"memory": self.memory, "cores": self.cores, "policy": self.policy}

    def _holder(self) -> PodHolder | None:
        manager = self.slice_manager()
        holder = manager.holders.get(PodHolder.kind) if manager is not None else None
        return holder if isinstance(holder, PodHolder) else None

    def _cluster(self) -> Cluster:
        holder = self._holder()
        if holder is not None:
            return holder.cluster
        if self._standalone_cluster is None:
            self._standalone_cluster = Cluster.from_environment()
        return self._standalone_cluster

    def _server_instance(self) -> str:
        holder = self._holder()
        return holder.server_instance if holder is not None else f"standalone-{os.getpid()}"

    async def _k8s(self, method, *args, **kwargs):
        return await asyncio.to_thread(method, *args, **kwargs)

    def _observe(self, state: PodState) -> None:
        if self._state is None or (state.state, state.message) != (self._state.state, self._state.message):
            self.log.info("kernel %s: %s", self.kernel_id, state.message)
        self._state, self._state_at = state, time.monotonic()
        holder = self._holder()
        if holder is not None:
            holder.observe(self.kernel_id, state)

    # -- start ----------------------------------------------------------------------------------

    @property
    def has_process(self) -> bool:
        return self._pod is not None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        adoption = kwargs.pop(ADOPT_ARGUMENT, None)
        if adoption and not self._adopted:
            return await self._adopt(adoption, kwargs)
        self._adopted = False  # a restart of an adopted kernel starts a new pod
        requested = kwargs.pop("vgpu_slice", None) or {}
        size = {key: requested.get(key) for key in ("memory", "cores", "policy")}
        manager = self.slice_manager()
        try:
            try:
                settings = self.pod_settings()
            except ManifestError as error:
                raise SliceRefused(f"The pod kernel is misconfigured: {error}.", kind="invalid") from None
            if manager is None:
                try:
                    limits = decide_limits(DEFAULT_LIMITS, self._configured(), size)
                except ValueError as error:
                    raise SliceRefused(str(error), kind="invalid") from None
            else:
                allocation = manager.held(self.kernel_id)
                if allocation is None:  # a restart keeps the slice, resized or not
                    allocation = manager.admit(
                        self.kernel_id,
                        manager.decide_limits(size, self._configured()),
                        owner=slice_owner(),
                        metadata={"kernelspec": getattr(self.kernel_spec, "display_name", "")},
                        holder=PodHolder.kind,
                    )
                limits = allocation.limits
        except SliceRefused as refusal:
            forget_refused_start(self)
            raise (manager.start_error(refusal) if manager else refusal) from None
        self._settings, self._limits = settings, limits
        # Interrupts travel as messages on the control channel: no signal reaches a pod.
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        kwargs = await super().pre_launch(**kwargs)
        kwargs.pop("env", None)  # nothing of the server's environment goes into the pod
        kwargs["cmd"] = []  # the pod's command comes from the settings (manifest.kernel_command)
        return kwargs

    async def _adopt(self, adoption: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Take over a kernel pod a previous server started and that still runs: nothing is
        created. Its ports and HMAC key come from its Secret, its address from the pod; its
        slice stays as the ledger holds it. A later restart of the kernel is a new pod."""
        info = adoption["provisioner_info"]
        self._pod = KernelPod(
            self.kernel_id, self.owner or default_owner(), self._server_instance(), info.get("starts", 1)
        )
        self._namespace, self._starts = info["namespace"], info.get("starts", 1)
        cluster = await self._k8s(self._cluster)
        pod = await self._k8s(cluster.read_pod, self._namespace, info["pod"])
        state = pod_state(pod)
        self._observe(state)
        if not state.ready:
            raise PodStartFailed(f"The kernel's pod {info['pod']} cannot be adopted: {state.message}.")
        secret = await self._k8s(cluster.read_secret, self._namespace, info["pod"])
        encoded = ((secret or {}).get("data") or {}).get(CONNECTION_FILE)
        if not encoded:
            raise PodStartFailed(
                f"The kernel's pod {info['pod']} cannot be adopted: its Secret holds no connection file."
            )
        connection = json.loads(base64.b64decode(encoded))
        self.connection_info = cast(
            KernelConnectionInfo, {**connection, "ip": state.ip, "key": connection["key"].encode()}
        )
        # Into the kernel manager now, as a local adoption reads the connection file: jupyter_client
        # loads what the provisioner returns only where no connection file of the same kernel exists.
        self.parent.load_connection_info(self.connection_info)
        self._adopted = True
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        return {**kwargs, "cmd": []}

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        if self._adopted:
            return self.connection_info
        manager = self.slice_manager()
        try:
            return await self._launch_pod(manager)
        except (SliceRefused, ClusterError) as error:
            refusal = error if isinstance(error, SliceRefused) else PodStartFailed(f"{error}.")
            if manager is not None:
                manager.release(self.kernel_id)
            forget_refused_start(self)
            raise (manager.start_error(refusal) if manager else refusal) from None

    def _secret_files(
        self,
        settings: PodSettings,
        limits: SliceLimits,
        *,
        key: str,
        signature_scheme: str,
        kernel_name: str,
        credential: str,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The kernel's connection file and slice file, as its Secret holds them."""
        connection = {
            **dict(zip((f"{name}_port" for name in PORT_NAMES), settings.ports, strict=True)),
            "ip": "0.0.0.0",  # the kernel listens on the pod's network; the server connects to its IP
            "key": key,
            "transport": "tcp",
            "signature_scheme": signature_scheme,
            "kernel_name": kernel_name,
        }
        server_app = self._server_app()
        slice_file = {
            "kernel_id": self.kernel_id,
            "server_url": self.server_url or (server_app.connection_url if server_app is not None else ""),
            "credential": credential,
            "limits": {"memory_bytes": limits.memory_limit, "cores": limits.sm_share, "policy": limits.policy},
            "report_interval": self.report_interval,
            "simulate": self.simulate,
        }
        return connection, slice_file

    def planned_manifests(self, limits: SliceLimits, kernel_name: str = "") -> list[dict[str, Any]]:
        """The Pod and Secret (key and credential redacted) a start of ``limits`` would create now,
        for ``jupyter vgpu pod-manifest``; raises ManifestError for settings Kubernetes refuses."""
        settings = self.pod_settings()
        kernel = KernelPod(self.kernel_id, self.owner or default_owner(), "<server-instance>")
        connection, slice_file = self._secret_files(
            settings, limits, key=REDACTED, signature_scheme="hmac-sha256", kernel_name=kernel_name, credential=REDACTED
        )
        pod = pod_manifest(settings, kernel, limits)
        return [pod, redacted(secret_manifest(settings, kernel, connection, slice_file, "<the pod's uid>"))]

    async def _launch_pod(self, manager: SliceManager | None) -> KernelConnectionInfo:
        settings, limits, km = self._settings, self._limits, self.parent
        self._starts += 1
        kernel = KernelPod(self.kernel_id, self.owner or default_owner(), self._server_instance(), self._starts)
        session = km.session
        connection, slice_file = self._secret_files(
            settings,
            limits,
            key=session.key.decode(),
            signature_scheme=session.signature_scheme,
            kernel_name=getattr(km, "kernel_name", ""),
            credential=manager.issue_kernel_credential(self.kernel_id) if manager is not None else "",
        )
        cluster, namespace = await self._k8s(self._cluster), settings.namespace  # the first use imports the client
        await self._refuse_if_never_fits(cluster, settings, limits)
        if manager is not None:
            grant = settings.granted(limits)
            manager.ledger.update_metadata(
                self.kernel_id,
                **{
                    POD_KEY: {"name": kernel.name, "namespace": namespace, "report_interval": self.report_interval},
                    GRANT_KEY: {"memory_bytes": grant.memory_limit, "cores": grant.sm_share},
                },
            )
        created = await self._k8s(cluster.create_pod, namespace, pod_manifest(settings, kernel, limits))
        self._pod, self._namespace, self._state = kernel, namespace, None
        try:
            uid = (created.get("metadata") or {}).get("uid", "")
            await self._k8s(
                cluster.create_secret, namespace, secret_manifest(settings, kernel, connection, slice_file, uid)
            )
            state = await self._wait_until_running(cluster, kernel, namespace)
        except BaseException:
            await self._delete_pod(grace_seconds=0)
            raise
        self.connection_info = cast(KernelConnectionInfo, {**connection, "ip": state.ip, "key": session.key})
        if manager is not None:
            manager.record_kernel(
                self.kernel_id, await self.get_provisioner_info(), kernel_name=getattr(km, "kernel_name", "")
            )
        return self.connection_info

    async def _refuse_if_never_fits(self, cluster: Cluster, settings: PodSettings, limits: SliceLimits) -> None:
        """Refuse a slice larger than any node could ever grant (SliceRefused, at once, with the
        sizes). Without the right to list nodes (the optional ClusterRole of docs/kubernetes.md)
        nothing is refused here: such a start waits in line with the scheduler's reason."""
        try:
            nodes = await self._k8s(cluster.list_nodes)
        except Forbidden as error:
            if not VGPUPodProvisioner._nodes_forbidden:
                VGPUPodProvisioner._nodes_forbidden = True
                self.log.warning(
                    "jupyter_vgpu: starts that can never fit wait in line instead of being refused: %s", error
                )
            return
        refusal = never_fits(nodes, settings, limits)
        if refusal is not None:
            raise SliceRefused(refusal, kind="capacity")

    async def _read_state(self, cluster: Cluster, kernel: KernelPod, namespace: str) -> PodState:
        """The pod's state now (its events read only where the status alone does not say why it waits)."""
        pod = await self._k8s(cluster.read_pod, namespace, kernel.name)
        state = pod_state(pod)
        if pod is not None and state.state in WAITING_STATES and not state.reason:
            state = pod_state(pod, await self._k8s(cluster.pod_events, namespace, kernel.name))
        self._observe(state)
        return state

    async def _wait_until_running(self, cluster: Cluster, kernel: KernelPod, namespace: str) -> PodState:
        deadline = time.monotonic() + self.start_timeout
        # Quick readings first (a pod on a warm node with its image runs within a fraction of a
        # second), then every poll_interval: a fixed interval made every start wait most of one.
        pause = min(FIRST_POLL, self.poll_interval)
        while True:
            state = await self._read_state(cluster, kernel, namespace)
            if state.ready:
                return state
            if state.over or state.state == "stopping":
                raise PodStartFailed(f"The kernel's pod {kernel.name} did not start: {state.message}.")
            if state.state == "queued":
                await self._wait_in_line(cluster, kernel, namespace, state)
                # start_timeout counts from the pod's placement: time in line is not a failing start.
                deadline, pause = time.monotonic() + self.start_timeout, min(FIRST_POLL, self.poll_interval)
                continue
            if time.monotonic() >= deadline:
                raise PodStartFailed(
                    f"The kernel's pod {kernel.name} was not running after {self.start_timeout:g} seconds and was "
                    f"deleted. It was {state.message}."
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.poll_interval)

    async def _wait_in_line(self, cluster: Cluster, kernel: KernelPod, namespace: str, state: PodState) -> None:
        """Wait in the server's line until the scheduler places the pod (or it ends): its place
        among this server's waiting kernel pods and the scheduler's reason show as for any queued
        start, shutting the kernel down takes it out, and ``line_timeout`` (if set) gives up."""
        latest = state

        async def placed() -> bool:
            nonlocal latest
            # At most one reading per poll_interval, however often the line passes.
            if time.monotonic() - self._state_at >= self.poll_interval:
                latest = await self._read_state(cluster, kernel, namespace)
            else:
                latest = self._state or latest
            request.waiting_for = latest.reason or latest.message
            return latest.state != "queued"

        limits = self._limits
        request = Request(
            self.kernel_id,
            "start",
            limits.memory_limit,
            limits.sm_share,
            None,
            placed,
            policy=limits.policy,
            waiting_for=state.reason or state.message,
            labels={"kernelspec": getattr(self.kernel_spec, "display_name", ""), "owner": slice_owner()},
            placed_by_cluster=True,
        )
        manager = self.slice_manager()
        waited = manager.line.wait(request) if manager is not None else self._poll_until(placed)
        try:
            if self.line_timeout > 0:
                await asyncio.wait_for(waited, self.line_timeout)
            else:
                await waited
        except LeftLine as left:
            raise PodStartFailed(
                f"The kernel's pod {kernel.name} left the line for room in the cluster: {left}."
            ) from None
        except asyncio.TimeoutError:
            raise PodStartFailed(
                f"The kernel's pod {kernel.name} waited in line {self.line_timeout:g} seconds "
                f"(VGPUPodProvisioner.line_timeout) and was deleted. It was {latest.message}."
            ) from None

    async def _poll_until(self, done) -> None:
        """Without a server (no line): read until ``done()``."""
        while not await done():
            await asyncio.sleep(self.poll_interval)

    # -- running ------------------------------------------------------------------------------

    async def poll(self) -> int | None:
        if self._pod is None:
            return 0
        if self._state is not None and time.monotonic() - self._state_at < self.poll_interval:
            state = self._state
        else:
            try:
                cluster = await self._k8s(self._cluster)
                pod = await self._k8s(cluster.read_pod, self._namespace, self._pod.name)
            except ClusterError as error:
                self.log.warning("kernel %s: cannot read its pod (%s); taking it as running", self.kernel_id, error)
                return None
            previous = self._state
            state = pod_state(pod)
            self._observe(state)
            if state.over and (previous is None or not previous.over):
                self.log.warning("kernel %s ended: %s", self.kernel_id, state.message)
        if state.over:
            return 0 if state.state == "exited" else 1
        return None

    async def wait(self) -> int | None:
        deadline = time.monotonic() + self.get_shutdown_wait_time()
        while True:
            status = await self.poll()
            if status is not None or time.monotonic() >= deadline:
                return status
            await asyncio.sleep(self.poll_interval)

    async def send_signal(self, signum: int) -> None:
        if signum in (signal.SIGKILL, signal.SIGTERM):
            await self._delete_pod(grace_seconds=0 if signum == signal.SIGKILL else None)
        elif signum != 0:
            self.log.warning(
                "kernel %s runs in a pod: signal %d is not delivered (interrupts go by message)", self.kernel_id, signum
            )

    async def kill(self, restart: bool = False) -> None:
        await self._delete_pod(grace_seconds=0)

    async def terminate(self, restart: bool = False) -> None:
        await self._delete_pod(grace_seconds=None)

    async def cleanup(self, restart: bool = False) -> None:
        await self._delete_pod(grace_seconds=0)
        self._pod = None
        if restart:
            return
        manager = self.slice_manager()
        if manager is not None:
            manager.release(self.kernel_id)

    async def _delete_pod(self, *, grace_seconds: int | None) -> None:
        """Delete the kernel's pod and its Secret (the Secret goes with the pod in a real cluster
        too, by its owner reference; deleting it here does not wait for the garbage collector)."""
        if self._pod is None:
            return
        name = self._pod.name
        try:
            cluster = await self._k8s(self._cluster)
            await self._k8s(cluster.delete_pod, self._namespace, name, grace_seconds=grace_seconds)
            await self._k8s(cluster.delete_secret, self._namespace, name)
        except ClusterError as error:
            self.log.error("kernel %s: cannot delete its pod %s: %s", self.kernel_id, name, error)

    # -- persistence ------------------------------------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info["connection_info"] = {**(info.get("connection_info") or {}), "key": ""}  # the key stays in the Secret
        if self._pod is not None:
            info.update({"pod": self._pod.name, "namespace": self._namespace, "starts": self._starts})
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        if provisioner_info.get("pod"):
            kernel_id = provisioner_info["kernel_id"]
            self._starts = provisioner_info.get("starts", 1)
            self._pod = KernelPod(kernel_id, self.owner or default_owner(), self._server_instance(), self._starts)
            self._namespace = provisioner_info["namespace"]

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, self.start_timeout)


def new_server_instance() -> str:
    return uuid.uuid4().hex[:12]
