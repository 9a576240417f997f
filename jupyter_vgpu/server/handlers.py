"""REST API under /api/vgpu/: devices, slices, kernel starts with a chosen slice, live resize,
Prometheus metrics. Every handler is authenticated and authorised as jupyter_server does it, and
answers bad input with a JSON ``{"message": ...}`` 4xx, never a 500.

A sliced kernel calls this API for %vgpu and its panel with its own credential (a per-kernel
secret from the provisioner, in the X-VGPU-Kernel-Credential header) rather than the server's
token, which would let code in the kernel do anything the user can. That credential reads
devices and slices and resizes the kernel's own slice; everything else is refused with 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_server.auth import Authorizer, User
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.services.sessions.sessionmanager import ModelName
from jupyter_server.utils import url_path_join
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import web

from jupyter_vgpu.client import CREDENTIAL_HEADER
from jupyter_vgpu.holders.checkpoint import CheckpointError
from jupyter_vgpu.holders.pod import PROCESS_REPORT_FIELDS
from jupyter_vgpu.ledger import CapacityError, DeviceUsage, LedgerError, NotSupported, UnknownSlice
from jupyter_vgpu.ledger.metrics import add_device_gauges, add_suspend_gauges, gauges
from jupyter_vgpu.ledger.remote import SliceForbidden
from jupyter_vgpu.line import Place, Request
from jupyter_vgpu.manager import BATCH_KEY, BelowHeld, SliceManager, SliceRefused, SliceStatus, orphan_notice
from jupyter_vgpu.model import SliceValueError, parse_device, parse_policy
from jupyter_vgpu.model.sizes import MAX_SIZE, POLICIES
from jupyter_vgpu.provisioning.base import MANAGER_SETTING
from jupyter_vgpu.provisioning.local import PROVISIONER_NAME
from jupyter_vgpu.provisioning.pod import POD_PROVISIONER_NAME
from jupyter_vgpu.server.errors import VGPUHTTPError
from jupyter_vgpu.server.idle import IDLE_SETTING, idle_notice
from jupyter_vgpu.server.sessions import session_paths
from jupyter_vgpu.server.suspend import SUSPEND_LOCK_TIMEOUT_SETTING, SUSPEND_SETTING, SuspendedKernels

AUTH_RESOURCE = "vgpu"
SLICE_FIELDS = {"memory", "cores", "policy"}
KERNEL_FIELDS = SLICE_FIELDS | {"name", "device", "path"}
# What each field of a request body may be (JSON types); the values themselves are checked by
# the model's parsers, which say what is accepted.
FIELD_TYPES = {
    "memory": (str, int, float),
    "cores": (str, int, float),
    "policy": (str,),
    "name": (str,),
    "device": (str, int, float),
    "path": (str,),
    "processes": (list,),
    "sm_util": (int, float),
    "limits": (dict,),
}
MAX_BODY = 64 * 1024
# The kernelspec jupyter-vgpu installs (kernels/ in the repository).
SHIPPED_KERNELSPEC = "python3-vgpu"
REPORT_FIELDS = {"processes", "sm_util", "limits"}
# The largest figure a usage report may carry (api.yaml's UsageReport says the same): every count
# of a region stays an exact int64.
MAX_REPORTED = 1 << 62


def device_model(usage: DeviceUsage) -> dict[str, Any]:
    device = usage.device
    return {
        "index": device.index,
        "uuid": device.uuid,
        "name": device.name,
        "sm_count": device.sm_count,
        "memory_total_bytes": device.memory_total,
        "memory_capacity_bytes": usage.memory_capacity,
        "memory_allocated_bytes": usage.memory_allocated,
        "memory_free_bytes": usage.memory_free,
        "memory_outside_bytes": usage.memory_outside,
        "memory_over_cap_bytes": usage.memory_over_cap,
        "sm_share_allocated": usage.total_share,
        "sm_share_hard_allocated": usage.hard_share,
        "sm_share_capacity": usage.share_capacity,
        "slices": usage.slices,
    }


def slice_model(
    status: SliceStatus,
    session_paths: dict[str, str],
    place: Place | None = None,
    moving: str | None = None,
    execution_state: str | None = None,
) -> dict[str, Any]:
    """A slice in the API. Memory is in bytes and says so; ``cores`` is the SM share in percent
    (HAMi's word for it); ``place``: where its request for room stands in the line, if it waits;
    ``moving``: "suspending" or "resuming" while its memory is on its way (holders/suspender.py);
    ``execution_state``: its kernel's, as this server's kernel manager knows it (None: not one
    of this server's kernels)."""
    allocation, usage = status.allocation, status.usage
    return {
        "kernel_id": allocation.kernel_id,
        "kernelspec": allocation.metadata.get("kernelspec", ""),
        "path": session_paths.get(allocation.kernel_id, ""),
        "command": (allocation.metadata.get(BATCH_KEY) or {}).get("command", ""),
        "pid": (allocation.metadata.get("provisioner_info") or {}).get("pid"),
        "owner": allocation.owner,
        "holder": allocation.holder,
        "state": moving or (("lent" if allocation.lent else "suspended") if allocation.suspended else usage.state),
        "execution_state": execution_state,
        "host_memory_bytes": allocation.host_memory,
        "message": usage.message,
        "location": usage.location,
        # A pod's slice is on no device of this machine: where it is, is in ``location``.
        "device": {"index": allocation.device_index, "uuid": allocation.device_uuid}
        if allocation.device_uuid
        else None,
        "limits": {"memory_bytes": allocation.memory_limit, "cores": allocation.sm_share, "policy": allocation.policy},
        "usage": {
            "memory_bytes": usage.memory_used,
            "sm_util": usage.sm_util_percent,
            "processes": [
                {
                    "pid": p.pid,
                    "memory_bytes": p.used,
                    "sm_util": p.sm_util_permille / 10,
                    "oom_refusals": p.oom_refusals,
                }
                for p in usage.processes
            ],
        },
        "warnings": status.warnings,
        # What the idle policy did to the kernel's slice (lowered, suspended, not restored), or
        # that the kernel outlived a server restart while suspended; else null.
        "notice": orphan_notice(allocation) or idle_notice(allocation),
        "queue": queue_model(place),
    }


def queue_model(place: Place | None) -> dict[str, Any] | None:
    if place is None:
        return None
    return {"position": place.position, "eta_seconds": place.eta_seconds, "waiting_for": place.waiting_for}


def queued_start_model(
    request: Request, place: Place | None, session_paths: dict[str, str], execution_state: str | None = None
) -> dict[str, Any]:
    """A kernel whose start waits in the line: no slice yet, only what it asked for."""
    device = request.labels.get("device")
    return {
        "kernel_id": request.kernel_id,
        "kernelspec": request.labels.get("kernelspec", ""),
        "path": session_paths.get(request.kernel_id, ""),
        "command": "",
        "pid": None,
        "owner": request.labels.get("owner", ""),
        "holder": "local",
        "state": "queued",
        "execution_state": execution_state,
        "host_memory_bytes": 0,
        "message": f"waiting in line for room on a GPU: {request.waiting_for}" if request.waiting_for else "",
        "location": {},
        "device": device if isinstance(device, dict) else None,
        "limits": {"memory_bytes": request.memory, "cores": request.sm_share, "policy": request.policy},
        "usage": {"memory_bytes": 0, "sm_util": 0, "processes": []},
        "warnings": [],
        "notice": None,
        "queue": queue_model(place),
    }


class KernelScope(Authorizer):
    """What a kernel's own credential allows: the handler's ``kernel_actions``, and writing only
    to the kernel's own slice."""

    def is_authorized(self, handler: JupyterHandler, user: User, action: str, resource: str) -> bool:
        # Only the vGPU handlers authorise a kernel's credential with this.
        if not isinstance(handler, VGPUHandler) or action not in handler.kernel_actions:
            return False
        return action == "read" or handler.path_kwargs.get("kernel_id") == handler.calling_kernel


KERNEL_SCOPE = KernelScope()


class VGPUHandler(APIHandler):
    auth_resource = AUTH_RESOURCE
    kernel_actions: frozenset[str] = frozenset()  # what a kernel's credential may do here
    calling_kernel: str | None = None  # the kernel whose credential authenticated this request

    # JupyterHandler's signature; APIHandler.prepare, called here, takes no _redirect_to_login
    # (an API answers 403, never a redirect to the login page).
    async def prepare(self, *, _redirect_to_login: bool = True) -> None:
        credential = self.request.headers.get(CREDENTIAL_HEADER)
        if credential is None:
            await super().prepare()
            return
        if not self.check_host():
            raise VGPUHTTPError(403, "requests from this host are not accepted")
        self.calling_kernel = self.slices.kernel_with_credential(credential)
        if self.calling_kernel is None:
            raise VGPUHTTPError(403, "the kernel credential belongs to no running sliced kernel")
        # A header a browser cannot send cross-origin without CORS, like a token: no XSRF check.
        self.current_user = self._jupyter_current_user = User(username=f"kernel-{self.calling_kernel}")

    @property
    def authorizer(self) -> Authorizer:
        return KERNEL_SCOPE if self.calling_kernel else super().authorizer

    @property
    def slices(self) -> SliceManager:
        manager: SliceManager = self.settings[MANAGER_SETTING]
        return manager

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Whatever escapes a handler still answers JSON the client can show.
        exception = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exception, VGPUHTTPError):
            self.finish(json.dumps({"message": exception.message}))
        elif isinstance(exception, SliceForbidden):
            # The node's broker keeps the slice for another user: a refusal, not an outage.
            self.set_status(403)
            self.finish(json.dumps({"message": str(exception)}))
        elif isinstance(exception, LedgerError):
            # The ledger itself (its file, or the node's broker) did not decide: nothing the
            # client sent was wrong, and the slices in force keep their limits.
            self.set_status(503)
            self.finish(json.dumps({"message": f"GPU slices cannot be read or changed right now: {exception}"}))
        else:
            super().write_error(status_code, **kwargs)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, (LedgerError, SliceForbidden)):
            self.log.warning("%s %s: %s", self.request.method, self.request.path, value)
        else:
            super().log_exception(typ, value, tb)

    def json_body(self, allowed: set[str]) -> dict[str, Any]:
        if len(self.request.body or b"") > MAX_BODY:
            raise VGPUHTTPError(400, f"the request body is larger than {MAX_BODY // 1024} KiB")
        try:
            body = json.loads(self.request.body or b"{}")
        except (ValueError, RecursionError):
            raise VGPUHTTPError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise VGPUHTTPError(
                400, f"the request body must be a JSON object with the fields {', '.join(sorted(allowed))}"
            )
        unknown = set(body) - allowed
        if unknown:
            shown = ", ".join(sorted(str(key)[:40] for key in unknown)[:5])
            raise VGPUHTTPError(400, f"unknown field(s) {shown}; accepted: {', '.join(sorted(allowed))}")
        for key, value in body.items():
            if not isinstance(value, FIELD_TYPES[key]) or isinstance(value, bool):
                names = {str: "a string", int: "a number", float: "a number", list: "a list", dict: "an object"}
                kinds = " or ".join(dict.fromkeys(names[kind] for kind in FIELD_TYPES[key]))
                raise VGPUHTTPError(400, f"field {key!r} must be {kinds}, not {json.dumps(value)[:40]}")
        for key in ("cores", "device"):
            # A whole float is an integer to JSON Schema (api.yaml's): 10.0 is 10, 1.5 is refused
            # by the field's own parser, which says what is accepted.
            if isinstance(body.get(key), float) and body[key].is_integer():
                body[key] = int(body[key])
        if "policy" in body:  # api.yaml's Policy is an enum: "HARD" and " hard" are not in it
            try:
                parse_policy(body["policy"], exact=True)
            except SliceValueError as error:
                raise VGPUHTTPError(400, str(error)) from None
        return body

    def model(self, status: SliceStatus, session_paths: dict[str, str]) -> dict[str, Any]:
        """A slice in the API, with its place in the line where it waits in it, and whether it is
        being suspended or resumed."""
        kernel_id = status.allocation.kernel_id
        moving = None
        if status.allocation.holder == "local":
            with contextlib.suppress(NotSupported):
                moving = self.slices.suspender.moving(kernel_id)
        place = self.slices.line.place(kernel_id)
        return slice_model(status, session_paths, place, moving, self.execution_state(kernel_id))

    def queued_model(self, request: Request, session_paths: dict[str, str]) -> dict[str, Any]:
        """A kernel whose start waits in the line, with its place."""
        kernel_id = request.kernel_id
        return queued_start_model(
            request, self.slices.line.place(kernel_id), session_paths, self.execution_state(kernel_id)
        )

    def execution_state(self, kernel_id: str) -> str | None:
        """The kernel's execution state as this server's kernel manager knows it (Jupyter's
        ``idle``, ``busy``, ``starting``, ...; an adopted kernel reads ``busy`` until it said what
        it does, server/adopt.py); None where the kernel is not this server's."""
        kernels = self.kernel_manager
        if kernel_id not in kernels:
            return None
        state = getattr(kernels.get_kernel(kernel_id), "execution_state", None)
        return state if isinstance(state, str) else None

    async def session_paths(self) -> dict[str, str]:
        return await session_paths(self.session_manager)


class DevicesHandler(VGPUHandler):
    kernel_actions = frozenset({"read"})

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps([device_model(usage) for usage in self.slices.ledger.devices_usage()]))


class SlicesHandler(VGPUHandler):
    kernel_actions = frozenset({"read"})

    @web.authenticated
    @authorized
    async def get(self):
        paths = await self.session_paths()
        listed = [self.model(status, paths) for status in self.slices.statuses()]
        held = {entry["kernel_id"] for entry in listed}
        queued = [
            self.queued_model(request, paths)
            for request in self.slices.line.requests()
            if request.kind == "start" and request.kernel_id not in held
        ]
        self.finish(json.dumps(queued + listed))


class SliceHandler(VGPUHandler):
    kernel_actions = frozenset({"read", "write"})

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str):
        paths = await self.session_paths()
        request = self.slices.line.get(kernel_id)
        try:
            status = self.slices.status(self.slices.get(kernel_id))
        except UnknownSlice as error:
            if request is None:
                raise VGPUHTTPError(404, str(error)) from None
            self.finish(json.dumps(self.queued_model(request, paths)))
            return
        self.finish(json.dumps(self.model(status, paths)))

    @web.authenticated
    @authorized
    async def patch(self, kernel_id: str):
        body = self.json_body(SLICE_FIELDS)
        if not body:
            raise VGPUHTTPError(400, "nothing to change; send memory, cores and/or policy")
        try:
            # A growth that does not fit makes room (idle kernels suspended), else waits in line.
            await self.slices.resize_in_line(
                kernel_id, memory=body.get("memory"), cores=body.get("cores"), policy=body.get("policy")
            )
        except UnknownSlice as error:
            raise VGPUHTTPError(404, str(error)) from None
        except ValueError as error:
            raise VGPUHTTPError(400, str(error)) from None
        except (CapacityError, BelowHeld) as error:
            raise VGPUHTTPError(409, str(error)) from None
        status = self.slices.status(self.slices.get(kernel_id))
        waiting = self.slices.line.get(kernel_id)
        # Accepted, not done: the slice keeps its size until the resize's turn (its ``queue``).
        self.set_status(202 if waiting is not None and waiting.kind == "resize" else 200)
        self.finish(json.dumps(self.model(status, await self.session_paths())))


class SuspendHandler(VGPUHandler):
    """POST: suspend the kernel to host memory (issue 18). The checkpoint blocks, so it runs in
    a worker thread."""

    kernel_actions = frozenset({"write"})

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        await self._change(kernel_id, lambda: self.slices.suspend(kernel_id, lock_timeout=self.lock_timeout))

    @property
    def lock_timeout(self) -> float:
        return float(self.settings.get(SUSPEND_LOCK_TIMEOUT_SETTING, 5.0))

    async def _change(self, kernel_id: str, change: Callable[[], Any]) -> None:
        try:
            await asyncio.to_thread(change)
        except UnknownSlice as error:
            raise VGPUHTTPError(404, str(error)) from None
        except (CapacityError, NotSupported, CheckpointError) as error:
            raise VGPUHTTPError(409, str(error)) from None
        status = self.slices.status(self.slices.get(kernel_id))
        self.finish(json.dumps(self.model(status, await self.session_paths())))


class ResumeHandler(SuspendHandler):
    """POST: resume a suspended kernel: its room first, then its memory."""

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        await self._change(kernel_id, lambda: self.slices.resume(kernel_id))


class WakeHandler(VGPUHandler):
    """POST: the user turned to this kernel (opened or focused its notebook, edited or ran a
    cell): resume it ahead of its next cell, through the line, without waiting for it here."""

    kernel_actions = frozenset({"write"})

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        suspended: SuspendedKernels = self.settings[SUSPEND_SETTING]
        try:
            allocation = suspended.wake(kernel_id)
        except UnknownSlice as error:
            raise VGPUHTTPError(404, str(error)) from None
        await asyncio.sleep(0)  # the line's pass, kicked by the wake, takes the request first
        status = self.slices.status(self.slices.get(kernel_id))
        self.set_status(202 if allocation.suspended else 200)
        self.finish(json.dumps(self.model(status, await self.session_paths())))


def _whole(value: Any, name: str, lowest: int = 0, highest: int = MAX_REPORTED) -> int:
    """An integer of a usage report; a float that is a whole number (JSON ``3.2e18``) counts, as
    it does in JSON Schema's ``integer``. The bounds are api.yaml's."""
    if isinstance(value, float) and value.is_integer() and lowest <= value <= highest:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        raise VGPUHTTPError(
            400, f"{name} must be a whole number from {lowest} to {highest}, not {json.dumps(value)[:40]}"
        )
    return value


def usage_report(body: dict[str, Any]) -> dict[str, Any]:
    """A pod agent's usage report, checked field by field (see UsageReport in api.yaml)."""
    processes = body.get("processes", [])
    if not isinstance(processes, list) or len(processes) > 1024:
        raise VGPUHTTPError(400, "processes must be a list of at most 1024 process reports")
    checked = []
    for process in processes:
        if not isinstance(process, dict) or set(process) - set(PROCESS_REPORT_FIELDS):
            raise VGPUHTTPError(
                400, f"each process report is an object with the fields {', '.join(PROCESS_REPORT_FIELDS)}"
            )
        checked.append(
            {name: _whole(process.get(name, 0), f"process field {name!r}") for name in PROCESS_REPORT_FIELDS}
        )
    sm_util = body.get("sm_util", 0.0)
    if isinstance(sm_util, bool) or not isinstance(sm_util, (int, float)) or not 0 <= sm_util <= 100:
        raise VGPUHTTPError(400, "sm_util must be a number from 0 to 100 (percent)")
    limits = body.get("limits")
    if limits is not None:
        if not isinstance(limits, dict) or set(limits) != {"memory_bytes", "cores", "policy"}:
            raise VGPUHTTPError(
                400, "limits must be an object with memory_bytes, cores and policy (the limits the pod has in force)"
            )
        limits = {
            "memory_bytes": _whole(limits["memory_bytes"], "limits.memory_bytes", 1, MAX_SIZE),
            "cores": _whole(limits["cores"], "limits.cores", 1, 100),
            "policy": limits["policy"],
        }
        if limits["policy"] not in POLICIES:
            raise VGPUHTTPError(400, "limits.policy must be hard or burst")
    return {"processes": checked, "sm_util": float(sm_util), "limits": limits}


class UsageReportHandler(VGPUHandler):
    """Where a pod kernel's in-pod agent reports its usage; the reply is the slice, whose limits
    the agent puts in force (so a resize reaches a pod without the server reaching into it)."""

    kernel_actions = frozenset({"write"})

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        body = self.json_body(REPORT_FIELDS)
        try:
            self.slices.report_usage(kernel_id, usage_report(body))
            status = self.slices.status(self.slices.get(kernel_id))
        except UnknownSlice as error:
            raise VGPUHTTPError(404, str(error)) from None
        except ValueError as error:
            raise VGPUHTTPError(409, str(error)) from None
        self.finish(json.dumps(self.model(status, {})))


class KernelsHandler(VGPUHandler):
    """Start a kernel with a chosen slice: the standard POST /api/kernels carries only a name."""

    @web.authenticated
    @authorized
    async def post(self):
        body = self.json_body(KERNEL_FIELDS)
        if "device" in body:
            try:
                parse_device(body["device"])
            except SliceValueError as error:
                raise VGPUHTTPError(400, str(error)) from None
        name = body["name"] if "name" in body else self.default_vgpu_kernelspec()
        try:
            spec = self.kernel_spec_manager.get_kernel_spec(name)
        except Exception:  # noqa: BLE001 - a kernelspec missing, unreadable or malformed is a 404, never a 500
            raise VGPUHTTPError(404, f"no kernelspec named {name!r}") from None
        provisioner = spec.metadata.get("kernel_provisioner", {}).get("provisioner_name")
        if provisioner not in (PROVISIONER_NAME, POD_PROVISIONER_NAME):
            raise VGPUHTTPError(
                400,
                f"kernelspec {name!r} does not start kernels in GPU slices (its provisioner is {provisioner or 'the default'}); choose a vGPU kernelspec",
            )
        requested: dict[str, Any] = {key: body[key] for key in ("memory", "cores", "policy", "device") if key in body}
        kernel_id = str(uuid.uuid4())
        try:
            # Answers once the kernel runs, waits in line, or was refused (server/app.py's _line_aware).
            await self.kernel_manager.start_kernel(
                kernel_id=kernel_id, kernel_name=name, path=body.get("path"), vgpu_slice=requested
            )
        except SliceRefused as refusal:
            if isinstance(refusal, VGPUHTTPError):
                raise
            raise VGPUHTTPError(409 if refusal.kind == "capacity" else 400, str(refusal)) from None
        path = body.get("path") or ""
        if path.endswith(".ipynb") and kernel_id in self.kernel_manager:
            # A session names the kernel after its notebook in every view, as POST /api/sessions
            # does, and JupyterLab opening that notebook finds this kernel. A folder is only where
            # the kernel runs (JupyterLab's "New notebook on a GPU slice..." opens its own session).
            await self.session_manager.create_session(
                path=path, name=ModelName(path.rsplit("/", 1)[-1]), type="notebook", kernel_id=kernel_id
            )
        model = self.kernel_manager.kernel_model(kernel_id)
        paths = await self.session_paths()
        request = self.slices.line.get(kernel_id)
        if request is not None and self.slices.ledger.get(kernel_id) is None:
            slice_ = self.queued_model(request, paths)
        else:
            slice_ = self.model(self.slices.status(self.slices.get(kernel_id)), paths)
        self.set_status(201)
        self.set_header("Location", url_path_join(self.base_url, "api", "kernels", kernel_id))
        self.finish(json.dumps({"kernel": model, "slice": slice_}, default=str))

    def default_vgpu_kernelspec(self) -> str:
        """The kernelspec of a start that names none: the server's default kernelspec if it
        starts kernels in slices (Jupyter's default, python3, does not), else the one
        jupyter-vgpu ships, else the only vGPU kernelspec there is."""
        try:
            specs = self.kernel_spec_manager.get_all_specs()
        except Exception:  # noqa: BLE001 - an unreadable kernelspec folder is no reason for a 500
            specs = {}
        vgpu = sorted(
            name
            for name, entry in specs.items()
            if (entry.get("spec") or {}).get("metadata", {}).get("kernel_provisioner", {}).get("provisioner_name")
            in (PROVISIONER_NAME, POD_PROVISIONER_NAME)
        )
        for name in (self.kernel_manager.default_kernel_name, SHIPPED_KERNELSPEC):
            if name in vgpu:
                return name
        if len(vgpu) == 1:
            return vgpu[0]
        choices = f"one of {', '.join(vgpu)}" if vgpu else "none is installed (jupyter-vgpu installs python3-vgpu)"
        raise VGPUHTTPError(400, f"name the kernelspec to start: a vGPU kernelspec, {choices}")


class DefaultsHandler(VGPUHandler):
    """The slice a start gets for each field that neither its request nor its kernelspec sets
    (VGPUApp.default_memory, default_cores, default_policy): what a start form shows as defaults."""

    kernel_actions = frozenset({"read"})

    @web.authenticated
    @authorized
    async def get(self):
        defaults = self.slices.defaults
        self.finish(
            json.dumps({"memory_bytes": defaults.memory_limit, "cores": defaults.sm_share, "policy": defaults.policy})
        )


class NoticesHandler(VGPUHandler):
    """Why kernels of this server were stopped as idle (kernel id -> notice), for a notebook
    whose kernel is no longer listed among the slices; kept for a day."""

    kernel_actions = frozenset({"read"})

    @web.authenticated
    @authorized
    async def get(self):
        idle = self.settings.get(IDLE_SETTING)
        self.finish(json.dumps(idle.notices() if idle is not None else {}))


class MetricsHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self):
        registry = CollectorRegistry()
        add_device_gauges(registry, self.slices.ledger.devices_usage())
        limit, used, share, util = gauges(
            registry,
            ["kernel_id", "device", "policy"],
            vgpu_slice_memory_limit_bytes="Memory cap of a slice",
            vgpu_slice_memory_used_bytes=(
                "GPU memory a slice's processes hold (none while it is suspended: its memory is in host memory)"
            ),
            vgpu_slice_sm_share_percent="SM share of a slice",
            vgpu_slice_sm_utilization_percent="Measured SM utilisation of a slice",
        )
        statuses = self.slices.statuses()
        add_suspend_gauges(registry, [status.allocation for status in statuses])
        for status in statuses:
            allocation = status.allocation
            labels = (allocation.kernel_id, str(allocation.device_index), allocation.policy)
            limit.labels(*labels).set(allocation.memory_limit)
            used.labels(*labels).set(0 if allocation.suspended else status.usage.memory_used)
            share.labels(*labels).set(allocation.sm_share)
            util.labels(*labels).set(status.usage.sm_util_percent)
        self.finish(generate_latest(registry), set_content_type=CONTENT_TYPE_LATEST)


class IndexHandler(VGPUHandler):
    """``GET /api/vgpu``: what the API has, for someone trying it by hand (not Jupyter's HTML
    404)."""

    kernel_actions = frozenset({"read"})

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(
            json.dumps(
                {
                    "api": "jupyter-vgpu",
                    "version": API_VERSION,
                    "description": "GPU slices of Jupyter kernels; jupyter_vgpu/server/api.yaml describes every path",
                    "paths": [url_path_join(self.base_url, path) for path in api_paths()],
                }
            )
        )


class NotFoundHandler(VGPUHandler):
    """Any other path under /api/vgpu/ (a kernel id like ``..``): a JSON 404, not Jupyter's page."""

    kernel_actions = frozenset({"read", "write"})

    async def prepare(self, *, _redirect_to_login: bool = True) -> None:
        raise VGPUHTTPError(
            404,
            f"no such vGPU API path {self.request.path[:80]!r}; the paths are {', '.join(api_paths())}"
            " (api.yaml describes them)",
        )


_KERNEL_ID = r"(?P<kernel_id>[\w-]+)"
API_VERSION = "1"  # api.yaml's info.version
HANDLERS = [
    (r"/api/vgpu", IndexHandler),
    (r"/api/vgpu/devices", DevicesHandler),
    (r"/api/vgpu/slices", SlicesHandler),
    (rf"/api/vgpu/slices/{_KERNEL_ID}", SliceHandler),
    (rf"/api/vgpu/slices/{_KERNEL_ID}/usage", UsageReportHandler),
    (rf"/api/vgpu/slices/{_KERNEL_ID}/suspend", SuspendHandler),
    (rf"/api/vgpu/slices/{_KERNEL_ID}/resume", ResumeHandler),
    (rf"/api/vgpu/slices/{_KERNEL_ID}/wake", WakeHandler),
    (r"/api/vgpu/kernels", KernelsHandler),
    (r"/api/vgpu/defaults", DefaultsHandler),
    (r"/api/vgpu/notices", NoticesHandler),
    (r"/api/vgpu/metrics", MetricsHandler),
    (r"/api/vgpu/.*", NotFoundHandler),
]


def api_paths() -> list[str]:
    """The routes under /api/vgpu/ as path templates (``/api/vgpu/slices/{kernel_id}``)."""
    return [
        re.sub(r"\(\?P<(\w+)>[^()]*\)", r"{\1}", regex)
        for regex, handler in HANDLERS
        if handler not in (IndexHandler, NotFoundHandler)
    ]
