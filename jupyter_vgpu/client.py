"""How a kernel reaches the Jupyter server that holds its slice.

The provisioner hands every sliced kernel three environment variables: the server's URL, the
kernel's id and a per-kernel credential. The credential is not the server's token: the server
accepts it only for reading devices and slices and for resizing this kernel's own slice (see
handlers.py), so code running in the kernel cannot start kernels, read files or act as the user.
This module is the one place that reads those variables; it holds the REST client the %vgpu
magic and the panel share, and the names both show slices by. The client uses the standard
library only, so it works from any thread.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.model.sizes import format_size

SERVER_URL_VARIABLE = "JUPYTER_VGPU_SERVER_URL"
KERNEL_ID_VARIABLE = "JUPYTER_VGPU_KERNEL_ID"
CREDENTIAL_VARIABLE = "JUPYTER_VGPU_KERNEL_CREDENTIAL"
KERNEL_VARIABLES = (SERVER_URL_VARIABLE, KERNEL_ID_VARIABLE, CREDENTIAL_VARIABLE)
CREDENTIAL_HEADER = "X-VGPU-Kernel-Credential"

NOT_IN_A_SERVER = (
    "this kernel was not started by a Jupyter server with jupyter-vgpu, so it has no GPU slice to "
    "show or resize; start it from a vGPU kernelspec (e.g. 'Python 3 (GPU slice)') in such a server"
)


class ServerUnavailable(RuntimeError):
    """The kernel cannot talk to a vGPU server: not started by one, or the server is unreachable."""


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
    """The REST API of this kernel's server, authenticated with the kernel's own credential."""

    server_url: str
    kernel_id: str
    credential: str = field(repr=False)  # a notebook that shows the client must not show the secret
    timeout: float = 5.0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> ServerClient:
        values = [environ.get(name, "") for name in KERNEL_VARIABLES]
        if not all(values):
            raise ServerUnavailable(NOT_IN_A_SERVER)
        server_url, kernel_id, credential = values
        scheme = urllib.parse.urlsplit(server_url).scheme
        if scheme not in ("http", "https"):
            raise ServerUnavailable(
                f"the vGPU server listens at {server_url}, which this kernel cannot reach "
                "(only http and https servers are supported, not Unix sockets)"
            )
        return cls(server_url, kernel_id, credential)

    def devices(self) -> list[dict[str, Any]]:
        return self._request("GET", "devices")

    def slices(self) -> list[dict[str, Any]]:
        return self._request("GET", "slices")

    def slice(self, kernel_id: str | None = None) -> dict[str, Any]:
        return self._request("GET", "slices", kernel_id or self.kernel_id)

    def resize(self, kernel_id: str | None = None, **changes: str) -> dict[str, Any]:
        """PATCH a slice with ``memory``, ``cores`` and/or ``policy`` as the REST API takes them."""
        return self._request("PATCH", "slices", kernel_id or self.kernel_id, body=changes)

    def _request(self, method: str, *path: str, body: dict | None = None) -> Any:
        url = self.server_url.rstrip("/") + "/api/vgpu/" + "/".join(urllib.parse.quote(part) for part in path)
        request = urllib.request.Request(
            url,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={CREDENTIAL_HEADER: self.credential, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise RequestRefused(error.code, _error_message(error)) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ServerUnavailable(f"cannot reach the vGPU server at {self.server_url}: {reason}") from None


def _error_message(error: urllib.error.HTTPError) -> str:
    """The ``{"message": ...}`` of a REST error, or the HTTP reason when the body is not one."""
    try:
        return json.loads(error.read())["message"]
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {error.code} {error.reason}"


def describe_limits(model: dict[str, Any]) -> str:
    """``memory cap 6GiB, SM share 40%, policy hard``: what a resize was granted."""
    limits = model["limits"]
    return f"memory cap {format_size(limits['memory_bytes'])}, SM share {limits['cores']}%, policy {limits['policy']}"


def slice_name(model: dict[str, Any]) -> str:
    """What people call a slice: its notebook's file name, else its kernel's short id."""
    path = model.get("path") or ""
    return path.rsplit("/", 1)[-1] if path else f"kernel {model['kernel_id'][:8]}"


def device_label(model: dict[str, Any], devices: list[dict[str, Any]]) -> str:
    """``1 · Sim Large`` for a slice's device (the name from GET devices, when it lists it)."""
    index = model["device"]["index"]
    names = [device["name"] for device in devices if device["uuid"] == model["device"]["uuid"]]
    return f"{index} · {names[0]}" if names else str(index)
