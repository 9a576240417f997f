"""The kernel provisioner: every kernel started through a vGPU kernelspec runs in its own slice.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner",
                                         "config": {"memory": "4GiB", "cores": 30, "policy": "hard"}}}

Inside a Jupyter server with the jupyter_vgpu extension, slices come from the server's ledger
(placement, capacity, live resize over REST). Started by plain jupyter_client (nbclient, jupyter
console), a kernel still gets a slice of the configured size on the configured device, with no
ledger to arbitrate between kernels.
"""

from __future__ import annotations

from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

from jupyter_vgpu.server.errors import VGPUHTTPError
from jupyter_vgpu.model.devices import list_devices, use_simulator
from jupyter_vgpu.client import KERNEL_VARIABLES, kernel_environment
from jupyter_vgpu.ledger.embedded import CapacityError, SliceRequest
from jupyter_vgpu.holders.local import SliceSpec, create_region, slice_environment
from jupyter_vgpu.model.sizes import SliceValueError, select_device
from jupyter_vgpu.manager import SliceManager

PROVISIONER_NAME = "vgpu-provisioner"
# Loads the %vgpu magic in IPython kernels. extra_extensions, not extensions, so that the
# extensions a user configured still load.
LOAD_MAGIC_ARGUMENT = "--IPKernelApp.extra_extensions=jupyter_vgpu"


def with_vgpu_magic(cmd: list[str]) -> list[str]:
    """The kernel command with the %vgpu magic loaded, if it starts ipykernel (other kernels
    would refuse the unknown argument)."""
    if any("ipykernel" in part for part in cmd) and LOAD_MAGIC_ARGUMENT not in cmd:
        return [*cmd, LOAD_MAGIC_ARGUMENT]
    return cmd


class SliceAdmissionError(VGPUHTTPError):
    """A kernel that cannot be admitted. An HTTP error so that jupyter_server answers the kernel
    start with 409 (or 400) and the message, which JupyterLab shows in its error dialog."""


class VGPUProvisioner(LocalProvisioner):
    """Starts a kernel with libvgpu.so preloaded, in a slice admitted before launch."""

    memory = Unicode("4GiB", config=True, help="Memory cap of the kernel's slice: 512MiB, 4GiB, 4G or MiB.")
    cores = Unicode("100", config=True, help="SM share of the kernel's slice in percent, 1..100.")
    policy = Unicode("hard", config=True, help="hard: never above the SM share; burst: may use idle SMs.")
    device = Unicode("", config=True, help="GPU index or UUID; empty lets the server place the slice.")
    simulate = Bool(False, config=True, help="Outside a vGPU server: use the simulated GPU.")

    _standalone_region = None

    def slice_request(self, override: dict | None) -> SliceRequest:
        values = {"memory": self.memory, "cores": self.cores, "policy": self.policy, **(override or {})}
        try:
            return SliceRequest(memory_limit=values["memory"], sm_share=values["cores"], policy=values["policy"])
        except SliceValueError as error:
            raise SliceAdmissionError(400, f"kernel slice not started: {error}") from None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        override = kwargs.pop("vgpu_slice", None)
        device = (override or {}).get("device", self.device) or None
        manager = SliceManager.current()
        if manager is None:
            kwargs = await super().pre_launch(**kwargs)
            kwargs["env"] = self._standalone_environment(self.slice_request(override), device, kwargs["env"])
            # No server holds this slice: a kernel must not inherit the server link of the
            # sliced kernel that started this one, or it would resize that kernel's slice.
            for name in KERNEL_VARIABLES:
                kwargs["env"].pop(name, None)
            kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
            return kwargs
        # A restart reuses the provisioner and keeps the kernel's slice.
        if manager.ledger.get(self.kernel_id) is None:
            request = self.slice_request(override)
            try:
                manager.admit(
                    self.kernel_id,
                    request,
                    owner=(override or {}).get("owner", ""),
                    device=device,
                    metadata={"kernelspec": getattr(self.kernel_spec, "display_name", "")},
                )
            except CapacityError as error:
                raise SliceAdmissionError(409, f"kernel not started, its GPU slice does not fit: {error}") from None
            except SliceValueError as error:
                raise SliceAdmissionError(400, f"kernel not started: {error}") from None
        try:
            kwargs = await super().pre_launch(**kwargs)
        except BaseException:
            manager.release(self.kernel_id)
            raise
        kwargs["env"] = manager.environment(self.kernel_id, kwargs["env"])
        server_url = self._server_url()
        if server_url:
            credential = manager.issue_kernel_credential(self.kernel_id)
            kwargs["env"].update(kernel_environment(server_url, self.kernel_id, credential))
        kwargs["cmd"] = with_vgpu_magic(kwargs["cmd"])
        return kwargs

    def _server_url(self) -> str | None:
        """The URL of the Jupyter server that starts this kernel: the first owner up the chain
        (kernel manager, multi-kernel manager, server app) that has one."""
        owner = self.parent
        while owner is not None:
            url = getattr(owner, "connection_url", None)
            if isinstance(url, str):
                return url
            owner = getattr(owner, "parent", None)
        return None

    def _standalone_environment(self, request: SliceRequest, device, env: dict[str, str]) -> dict[str, str]:
        if self._standalone_region is None:
            if self.simulate:
                use_simulator()
            chosen = select_device(list_devices(), device or 0)
            spec = SliceSpec(request.memory_limit, request.sm_share, request.policy)
            self._standalone_region = create_region(spec, chosen)
        return slice_environment(self._standalone_region, simulate=self.simulate, base_env=env)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        connection_info = await super().launch_kernel(cmd, **kwargs)
        manager = SliceManager.current()
        if manager is not None:
            manager.record_kernel_process(self.kernel_id, self.pid)
        return connection_info

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if restart:
            return
        manager = SliceManager.current()
        if manager is not None:
            manager.release(self.kernel_id)
        if self._standalone_region is not None:
            self._standalone_region.close()
            self._standalone_region.path.unlink(missing_ok=True)
            self._standalone_region = None
