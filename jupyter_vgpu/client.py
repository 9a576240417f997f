"""The one REST client of ``/api/vgpu/``, for the CLI and for code running in a sliced kernel.

Both talk to the same handlers and differ only in who they are:

- the CLI is the user: it sends the Jupyter server's token (``Authorization: token ...``), found
  in Jupyter's runtime files like ``jupyter server list`` does, or ``--server URL`` with
  ``$JUPYTER_TOKEN``;
- a kernel is itself: the provisioner hands every sliced kernel three environment variables, the
  server's URL, the kernel's id and a per-kernel credential. The credential is not the server's
  token: the server accepts it only for reading devices and slices and for resizing this kernel's
  own slice (see server/handlers.py), so code in the kernel cannot start kernels, read files or
  act as the user. This module is the one place that reads those variables.

The client uses the standard library only (in a sliced kernel it also reads, from beside its
region, which server adopted the kernel after its own went away: holders/local.py), so it works
from any thread and in any kernel, and
the module also holds the names the %vgpu magic, the panel and the CLI show slices by.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from jupyter_vgpu.model.sizes import format_size, parse_policy, parse_size, parse_sm_share

SERVER_URL_VARIABLE = "JUPYTER_VGPU_SERVER_URL"
KERNEL_ID_VARIABLE = "JUPYTER_VGPU_KERNEL_ID"
CREDENTIAL_VARIABLE = "JUPYTER_VGPU_KERNEL_CREDENTIAL"
KERNEL_VARIABLES = (SERVER_URL_VARIABLE, KERNEL_ID_VARIABLE, CREDENTIAL_VARIABLE)
CREDENTIAL_HEADER = "X-VGPU-Kernel-Credential"
TOKEN_VARIABLE = "JUPYTER_TOKEN"  # what `--server URL` authenticates with, as in jupyter_server

NOT_IN_A_SERVER = (
    "this kernel was not started by a Jupyter server with jupyter-vgpu, so it has no GPU slice to "
    "show or resize; start it from a vGPU kernelspec (e.g. 'Python 3 (GPU slice)') in such a server"
)
NO_RUNNING_SERVER = "no running Jupyter server found; start one (jupyter lab) or pass --server URL"


class ServerUnavailable(RuntimeError):
    """There is no vGPU server to ask: none found, not started by one, or it does not answer."""


class RequestRefused(RuntimeError):
    """The server answered a request with an error; ``message`` is its reason, unchanged."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def kernel_environment(server_url: str, kernel_id: str, credential: str) -> dict[str, str]:
    """The variables a sliced kernel needs to reach its server (set by the provisioner)."""
    return {SERVER_URL_VARIABLE: server_url, KERNEL_ID_VARIABLE: kernel_id, CREDENTIAL_VARIABLE: credential}


@dataclass(frozen=True)
class ServerClient:
    """The REST API of one Jupyter server's jupyter-vgpu extension.

    Build it with :meth:`for_user` (the CLI) or :meth:`for_kernel` (the magic and the panel);
    ``kernel_id`` is the calling kernel's, empty for a user.
    """

    server_url: str
    # (header, value); out of the repr because a notebook that shows the client must not show it
    authorization: tuple[str, str] | None = field(default=None, repr=False)
    kernel_id: str = ""
    timeout: float = 5.0

    @classmethod
    def for_kernel(cls, environ: Mapping[str, str] = os.environ) -> ServerClient:
        """This kernel's server, with this kernel's credential (from the provisioner's variables)."""
        values = [environ.get(name, "") for name in KERNEL_VARIABLES]
        if not all(values):
            raise ServerUnavailable(NOT_IN_A_SERVER)
        server_url, kernel_id, credential = values
        # A kernel that outlived its server: the server that adopted it, which may listen elsewhere.
        from jupyter_vgpu.holders.local import REGION_VARIABLE, read_adopted_by

        region = environ.get(REGION_VARIABLE)
        adopter = read_adopted_by(region) if region else None
        if adopter and isinstance(adopter.get("url"), str) and adopter["url"]:
            server_url = adopter["url"]
        return cls(_reachable(server_url, "this kernel"), (CREDENTIAL_HEADER, credential), kernel_id)

    @classmethod
    def for_user(
        cls, server_url: str = "", environ: Mapping[str, str] = os.environ, timeout: float = 30.0
    ) -> ServerClient:
        """A server as its user: ``server_url`` with ``$JUPYTER_TOKEN``, or else the running server
        Jupyter's runtime files name, with the token they hold."""
        if server_url:
            token = environ.get(TOKEN_VARIABLE, "")
        else:
            servers = running_servers()
            if not servers:
                raise ServerUnavailable(NO_RUNNING_SERVER)
            server_url, token = servers[-1]["url"], servers[-1].get("token", "")
        # No header without a token: a server with password login then says 403 in its own words.
        return cls(
            _reachable(server_url, "jupyter vgpu"),
            ("Authorization", f"token {token}") if token else None,
            timeout=timeout,
        )

    # The replies' shapes are the server's API (jupyter_vgpu/server/api.yaml); they are not
    # checked here, so each is the JSON reply as its documented type.

    def devices(self) -> list[dict[str, Any]]:
        devices: list[dict[str, Any]] = self._request("GET", "devices")
        return devices

    def slices(self) -> list[dict[str, Any]]:
        slices: list[dict[str, Any]] = self._request("GET", "slices")
        return slices

    def slice(self, kernel_id: str | None = None) -> dict[str, Any]:
        model: dict[str, Any] = self._request("GET", "slices", kernel_id or self.kernel_id)
        return model

    def resize(self, kernel_id: str | None = None, **changes: str | int) -> dict[str, Any]:
        """PATCH a slice with ``memory`` (a size, or MiB), ``cores`` and/or ``policy``."""
        model: dict[str, Any] = self._request("PATCH", "slices", kernel_id or self.kernel_id, body=changes)
        return model

    def suspend(self, kernel_id: str) -> dict[str, Any]:
        """Suspend a kernel to host memory (its slice's room lent to others)."""
        model: dict[str, Any] = self._request("POST", "slices", kernel_id, "suspend", body={})
        return model

    def resume(self, kernel_id: str) -> dict[str, Any]:
        """Resume a suspended kernel: its room back first, then its memory."""
        model: dict[str, Any] = self._request("POST", "slices", kernel_id, "resume", body={})
        return model

    def _request(self, method: str, *path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.server_url.rstrip("/") + "/api/vgpu/" + "/".join(urllib.parse.quote(part, safe="") for part in path)
        headers = {"Content-Type": "application/json"}
        if self.authorization:
            headers[self.authorization[0]] = self.authorization[1]
        request = urllib.request.Request(
            url, method=method, data=None if body is None else json.dumps(body).encode(), headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise RequestRefused(error.code, _error_message(error)) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ServerUnavailable(f"cannot reach the vGPU server at {self.server_url}: {reason}") from None


def running_servers(runtime_dir: str | None = None) -> list[dict[str, Any]]:
    """The ``jpserver-*.json`` files of the Jupyter servers still running, as
    ``jupyter_server.serverapp.list_running_servers`` reads them, without importing
    jupyter_server (seconds of start-up for a command that makes one REST call). Unlike it, this
    leaves a dead server's file in place: that is the server's to clean up."""
    from jupyter_core.paths import jupyter_runtime_dir

    folder = runtime_dir or jupyter_runtime_dir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    servers = []
    for name in names:
        if not re.fullmatch(r"jpserver-(.+)\.json", name):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as file:
                info = json.load(file)
        except (OSError, ValueError):  # gone meanwhile, or being written
            continue
        if isinstance(info, dict) and isinstance(info.get("pid"), int) and info["pid"] > 0 and _alive(info["pid"]):
            servers.append(info)
    return servers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def _reachable(server_url: str, who: str) -> str:
    """``server_url`` if urllib can reach it; jupyter_server may also listen on a Unix socket."""
    if urllib.parse.urlsplit(server_url).scheme not in ("http", "https"):
        raise ServerUnavailable(
            f"the vGPU server listens at {server_url}, which {who} cannot reach "
            "(only http and https servers are supported, not Unix sockets)"
        )
    return server_url


def _error_message(error: urllib.error.HTTPError) -> str:
    """The ``{"message": ...}`` of a REST error, or the HTTP reason when the body is not one
    (a proxy's page, or Jupyter's own HTML 403)."""
    try:
        message = json.loads(error.read())["message"]
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {error.code} {error.reason}"
    return message if isinstance(message, str) else f"HTTP {error.code} {error.reason}"


def describe_limits(model: dict[str, Any]) -> str:
    """``memory cap 6GiB, SM share 40%, policy hard``: what a resize was granted."""
    limits = model["limits"]
    return f"memory cap {format_size(limits['memory_bytes'])}, SM share {limits['cores']}%, policy {limits['policy']}"


# States in which a slice holds no room on the GPU: its start waits in line, or its room is lent.
ROOMLESS_STATES = ("queued", "suspended", "lent")


def gpu_memory_used(model: dict[str, Any]) -> int:
    """Bytes a slice's processes hold on the GPU: none while it is suspended (``usage.memory_bytes``
    then still counts what they allocated, which is in host memory), lent or queued."""
    return 0 if model.get("state") in ROOMLESS_STATES else int(model["usage"]["memory_bytes"])


def in_host_memory(model: dict[str, Any]) -> str | None:
    """Where a suspended slice's memory is, ``12GiB in host memory (suspended)``; None for a slice
    that is not suspended."""
    if model.get("state") != "suspended":
        return None
    return f"{format_size(model.get('host_memory_bytes') or 0)} in host memory (suspended)"


def ordinal(position: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 111th."""
    suffix = "th" if 10 <= position % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(position % 10, "th")
    return f"{position}{suffix}"


def format_eta(seconds: float) -> str:
    """An estimate as precise as an estimate is, as libvgpu.so words it in a waiting cell's output
    (native/interposer/waiting.c) and the lab extension in its views: ``a few seconds``,
    ``about 40 s``, ``about 2 min``, ``about 3 h``."""
    s = max(0, int(seconds + 0.5))  # half up, as Math.round in the lab extension
    if s < 10:
        return "a few seconds"
    if s < 55:
        return f"about {(s + 5) // 10 * 10} s"
    if s < 99 * 60 + 30:
        return f"about {1 if s < 90 else (s + 30) // 60} min"
    return f"about {(s + 1800) // 3600} h"


def describe_queue(model: dict[str, Any]) -> str | None:
    """Where a waiting slice stands in the line and what it waits for, as every view says it
    (``jupyter vgpu status``, ``%vgpu``, the lab extension's describe.ts):
    ``2nd in line for GPU 0 · about 40 s · waiting for 6GiB more GPU memory (4GiB free)``; ``any
    GPU`` where it takes any, no estimate where the server has none (``eta_seconds`` null). None
    for a slice that waits for nothing (``queue`` null, or absent from an older server)."""
    queue = model.get("queue")
    if not queue:
        return None
    device = model.get("device")
    where = f"GPU {device['index']}" if device else "any GPU"
    parts = [f"{ordinal(int(queue['position']))} in line for {where}"]
    if queue.get("eta_seconds") is not None:
        parts.append(format_eta(float(queue["eta_seconds"])))
    waiting_for = (queue.get("waiting_for") or "").strip()
    if waiting_for:
        # A resume's reason is a sentence of its own ("waiting for 1GiB more GPU memory (1GiB free) on GPU 0, ...").
        parts.append(waiting_for if waiting_for.split(" ", 1)[0] == "waiting" else f"waiting for {waiting_for}")
    return " · ".join(parts)


class ResizeChanges(TypedDict, total=False):
    """The body of a resize (PATCH of a slice): only what changes."""

    memory: str
    cores: int
    policy: str


def resize_changes(memory: str | None, cores: str | None, policy: str | None) -> ResizeChanges:
    """The resize a person asked for (None: left as it is), each value checked with the server's
    own vocabulary so that a typo is refused (SliceValueError) before anything is sent. The
    memory goes as written (a bare number is MiB to the server too), the share and the policy
    as read."""
    changes = ResizeChanges()
    if memory is not None:
        parse_size(memory)
        changes["memory"] = memory.strip()
    if cores is not None:
        changes["cores"] = parse_sm_share(cores)
    if policy is not None:
        changes["policy"] = parse_policy(policy)
    return changes


def resize_waiting(model: dict[str, Any]) -> str | None:
    """What a resize that waits in line (the server answered 202: the slice as it is, with its
    ``queue``) says, as ``%vgpu resize`` and ``jupyter vgpu resize`` print it; None for a resize
    that was done."""
    place = describe_queue(model)
    if place is None:
        return None
    limits = model["limits"]
    return (
        f"resize waits in line: {place}. It happens by itself when room comes; until then the slice keeps "
        f"{format_size(limits['memory_bytes'])} and {limits['cores']} percent of the SMs. `%vgpu` or "
        "`jupyter vgpu status` shows where it stands; another resize replaces it, a smaller one leaves the line"
    )


# What a slice's state means where its name alone does not say it (server/api.yaml's wording),
# for the views that show states: jupyter vgpu status (under the table) and %vgpu.
STATE_MEANINGS = {
    "unused": "the slice is held, but no process of the kernel uses the GPU in it: none has made a CUDA call "
    "yet, or those that did have ended",
}


def state_meaning(state: str) -> str | None:
    """``unused: the slice is held, ...`` for a state that needs saying, else None."""
    meaning = STATE_MEANINGS.get(state)
    return f"{state}: {meaning}" if meaning else None


def slice_notice(model: dict[str, Any]) -> str | None:
    """What the server's idle policy says of the slice (``notice``), except where it is only what
    the slice waits for in the line, which :func:`describe_queue` says with its place."""
    notice = model.get("notice") or None
    if notice and notice == (model.get("queue") or {}).get("waiting_for"):
        return None
    return notice


def slice_name(model: dict[str, Any]) -> str:
    """What people call a slice: its notebook's file name, else its kernel's short id."""
    path = model.get("path") or ""
    return path.rsplit("/", 1)[-1] if path else f"kernel {model['kernel_id'][:8]}"


def device_label(model: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """``1 · Sim Large`` for a slice's device (the name from GET devices, when it lists it); for a
    pod's slice, where the cluster put it: ``pod jvgpu-… on node-a · GPU-8f2c (4GiB, 30%)``;
    ``any GPU`` for a start waiting in line for whichever GPU has room first."""
    if model.get("device") is None and model.get("state") == "queued" and model.get("holder") != "pod":
        return "any GPU"
    if model.get("device") is None:
        location = model.get("location") or {}
        where = " · ".join(filter(None, [location.get("node", ""), location.get("gpu", "")]))
        return f"pod {location.get('pod', '?')}" + (f" on {where}" if where else " (not placed yet)")
    index = model["device"]["index"]
    names = [device["name"] for device in devices if device["uuid"] == model["device"]["uuid"]]
    return f"{index} · {names[0]}" if names else str(index)
