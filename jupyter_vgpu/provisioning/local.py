"""The local kernel provisioner: every kernel started through a vGPU kernelspec runs in its own
slice on this machine.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner"}}

and may set a size (``"config": {"memory": "8GiB", "cores": 30, "policy": "hard"}``). Inside a
Jupyter server with the jupyter_vgpu extension, slices come from the server's ledger (placement,
capacity, live resize over REST), sized by what the start asked for, else the kernelspec, else
the server's ``VGPUApp.default_*``. Started by plain jupyter_client (nbclient, nbconvert, jupyter
console), a kernel still gets a slice of the configured size on the configured device, with no
ledger to arbitrate between kernels.
"""

from __future__ import annotations

from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

from jupyter_vgpu.client import KERNEL_VARIABLES, kernel_environment
from jupyter_vgpu.holders.local import LocalHolder, default_region_dir, slice_environment
from jupyter_vgpu.manager import SliceManager, SliceRefused
from jupyter_vgpu.holders.region import process_start_time
from jupyter_vgpu.model import DEFAULT_LIMITS, decide_limits, list_devices, select_device, use_simulator
from jupyter_vgpu.model.sizes import SIZE_HELP, SM_SHARE_HELP

PROVISIONER_NAME = "vgpu-provisioner"
MANAGER_SETTING = "vgpu_slice_manager"
# Loads the %vgpu magic in IPython kernels. extra_extensions, not extensions, so that the
# extensions a user configured still load.
LOAD_MAGIC_ARGUMENT = "--IPKernelApp.extra_extensions=jupyter_vgpu"


def with_vgpu_magic(cmd: list[str]) -> list[str]:
    """The kernel command with the %vgpu magic loaded, if it starts ipykernel (other kernels
    would refuse the unknown argument)."""
    if any("ipykernel" in part for part in cmd) and LOAD_MAGIC_ARGUMENT not in cmd:
        return [*cmd, LOAD_MAGIC_ARGUMENT]
    return cmd


def _forget_refused_start(provisioner: LocalProvisioner) -> None:
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


class VGPUProvisioner(LocalProvisioner):
    """Starts a kernel with libvgpu.so preloaded, in a slice admitted before launch."""

    memory = Unicode("", config=True, help=f"Memory cap of the kernel's slice: {SIZE_HELP}. Empty: the server's default.")
    cores = Unicode("", config=True, help=f"SM share of the kernel's slice, {SM_SHARE_HELP}. Empty: the server's default.")
    policy = Unicode("", config=True, help="hard: never above the SM share; burst: may use idle SMs. Empty: the server's default.")
    device = Unicode("", config=True, help="GPU index or UUID; empty lets the server place the slice (GPU 0 without a server).")
    simulate = Bool(False, config=True, help="Outside a vGPU server: use the simulated GPU.")

    _standalone: LocalHolder | None = None
    _standalone_region = None

    def _configured(self) -> dict[str, str]:
        return {"memory": self.memory, "cores": self.cores, "policy": self.policy}

    def _server_app(self):
        """The Jupyter server that starts this kernel, found up the parent chain (kernel manager,
        multi-kernel manager, server app); None when plain jupyter_client starts it."""
        owner = self.parent
        while owner is not None:
            if hasattr(owner, "web_app") and hasattr(owner, "connection_url"):
                return owner
            owner = getattr(owner, "parent", None)
        return None

    def slice_manager(self) -> SliceManager | None:
        server = self._server_app()
        web_app = getattr(server, "web_app", None)
        return web_app.settings.get(MANAGER_SETTING) if web_app is not None else None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        requested = kwargs.pop("vgpu_slice", None) or {}
        size = {key: requested.get(key) for key in ("memory", "cores", "policy")}
        manager = self.slice_manager()
        try:
            if manager is None:
                return await self._standalone_launch(size, requested.get("device"), kwargs)
            # A restart reuses the provisioner and keeps the kernel's slice.
            if manager.ledger.get(self.kernel_id) is None:
                manager.admit(
                    self.kernel_id,
                    manager.decide_limits(size, self._configured()),
                    owner=requested.get("owner", ""),
                    device=requested.get("device") or self.device or None,
                    metadata={"kernelspec": getattr(self.kernel_spec, "display_name", "")},
                )
        except SliceRefused as refusal:
            _forget_refused_start(self)
            raise (manager.start_error(refusal) if manager else refusal) from None
        try:
            kwargs = await super().pre_launch(**kwargs)
            allocation = manager.get(self.kernel_id)
            kwargs["env"] = manager.holder(allocation).environment(allocation, kwargs["env"])
        except BaseException:
            manager.release(self.kernel_id)
            raise
        server_url = self._server_app().connection_url
        credential = manager.issue_kernel_credential(self.kernel_id)
        kwargs["env"].update(kernel_environment(server_url, self.kernel_id, credential))
        kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
        return kwargs

    async def _standalone_launch(self, requested: dict, device, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A slice with no server: the configured size on the configured device, no ledger."""
        try:
            limits = decide_limits(DEFAULT_LIMITS, self._configured(), requested)
        except ValueError as error:
            raise SliceRefused(str(error), kind="invalid") from None
        kwargs = await super().pre_launch(**kwargs)
        if self._standalone_region is None:
            if self.simulate:
                use_simulator()
            device = select_device(list_devices(), device or self.device or 0)
            self._standalone = LocalHolder(default_region_dir(standalone=True), simulate=self.simulate)
            self._standalone_region = self._standalone.new_region(self.kernel_id, limits, device)
        kwargs["env"] = slice_environment(self._standalone_region, simulate=self.simulate, base_env=kwargs["env"])
        # No server holds this slice: a kernel must not inherit the server link of the sliced
        # kernel that started this one, or it would resize that kernel's slice.
        for name in KERNEL_VARIABLES:
            kwargs["env"].pop(name, None)
        kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        connection_info = await super().launch_kernel(cmd, **kwargs)
        manager = self.slice_manager()
        if manager is not None:
            manager.record_kernel(self.kernel_id, await self._process_identity())
        return connection_info

    async def get_provisioner_info(self) -> dict[str, Any]:
        """jupyter_client's record of this kernel (its pid, ...) plus what tells the process apart
        from a later one that got the same pid; kept in the ledger so a restarted server finds
        the kernel again (see :meth:`load_provisioner_info`)."""
        info = await super().get_provisioner_info()
        if self.pid:
            info["pid_start_time"] = process_start_time(self.pid)
        return info

    async def _process_identity(self) -> dict[str, Any]:
        """The JSON part of the provisioner info that identifies the kernel's process."""
        info = await self.get_provisioner_info()
        return {key: info[key] for key in ("pid", "pgid", "ip", "pid_start_time") if key in info}

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if restart:
            return
        manager = self.slice_manager()
        if manager is not None:
            manager.release(self.kernel_id)
        if self._standalone_region is not None:
            self._standalone_region.close()
            self._standalone.release(self.kernel_id)
            self._standalone_region = None
