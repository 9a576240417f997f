"""What every vGPU provisioner needs of the Jupyter server that starts its kernels (if any)."""

from __future__ import annotations

import getpass
import os
from typing import Any

from jupyter_vgpu.manager import SliceManager

MANAGER_SETTING = "vgpu_slice_manager"  # where the server keeps its SliceManager (web_app.settings)
# The kernel manager's start_kernel argument with which a restarted server adopts a kernel its
# predecessor left running (server/adopt.py): each provisioner then launches nothing.
ADOPT_ARGUMENT = "vgpu_adopt"
# The server's own hub token (JupyterHub hands one to every single-user server; with it the server
# speaks to the node's broker). A sliced kernel never gets it: it speaks to its own server only,
# with its per-kernel credential.
HUB_TOKEN_VARIABLES = ("JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")


class ServerLinked:
    """A provisioner mixin: the server up the parent chain (kernel manager, multi-kernel manager,
    server app) and its slice manager; both None when plain jupyter_client starts the kernel."""

    parent: Any

    def _server_app(self):
        owner = self.parent
        while owner is not None:
            if hasattr(owner, "web_app") and hasattr(owner, "connection_url"):
                return owner
            owner = getattr(owner, "parent", None)
        return None

    def slice_manager(self) -> SliceManager | None:
        manager: SliceManager | None = self._server_setting(MANAGER_SETTING)
        return manager

    def _server_setting(self, name: str) -> Any:
        """One of the server's web application settings; None without a server."""
        web_app = getattr(self._server_app(), "web_app", None)
        return web_app.settings.get(name) if web_app is not None else None


def slice_owner() -> str:
    """Whom a kernel's slice is counted against, whatever started the kernel (a notebook, the
    REST API, a batch run): the hub user whose server this is, else this Unix account. (A node's
    broker counts it against the user its token names, whatever this says.)"""
    if os.environ.get("JUPYTERHUB_USER"):
        return os.environ["JUPYTERHUB_USER"]
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return str(os.getuid())


def forget_refused_start(provisioner) -> None:
    """Leave nothing of a refused start in jupyter_client's multi-kernel manager.

    jupyter_client (8.10) files every start under ``_pending_kernels`` and removes the entry only
    when the start succeeds; a failed start stays there, and jupyter_server's ``shutdown_all``
    then trips over it (``404 Kernel does not exist``) and the server never stops. No public
    method removes it, so this one place does, for every start path (sessions, kernels, ours).
    """
    kernel_manager = provisioner.parent
    multi_kernel_manager = getattr(kernel_manager, "parent", None)
    pending = getattr(multi_kernel_manager, "_pending_kernels", None)
    if isinstance(pending, dict):
        pending.pop(provisioner.kernel_id, None)
