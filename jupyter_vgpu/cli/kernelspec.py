"""``jupyter vgpu kernelspec install``: kernelspecs whose kernels start in slices; and
``jupyter vgpu config``: the options of the server extension and of the provisioners."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from traitlets import Bool, Unicode
from traitlets.config import Configurable

from jupyter_vgpu._version import __version__
from jupyter_vgpu.cli.base import UsageError, _aliases, _CommandGroup, _GPUCommand, _StrictOptions
from jupyter_vgpu.model import SliceValueError, format_size, parse_policy, parse_size, parse_sm_share, select_device
from jupyter_vgpu.model.devices import DeviceError, list_devices, use_simulator
from jupyter_vgpu.native import NativeLibraryMissing

SHIPPED_KERNELSPEC = "python3-vgpu"  # kernels/python3-vgpu, installed with the package


def shipped_kernel_logos(kernelspecs: Any) -> list[Path]:
    """The logo files of the kernelspec installed with the package (none where it is missing)."""
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        folder = Path(kernelspecs.get_kernel_spec(SHIPPED_KERNELSPEC).resource_dir)
    except NoSuchKernel:
        return []
    return sorted(folder.glob("logo-*"))


class KernelspecInstallApp(_GPUCommand):
    name = "jupyter-vgpu-kernelspec-install"
    description = "Install a kernelspec whose kernels start in GPU slices of a given size."
    memory = Unicode("4GiB", config=True, help="Memory cap of each kernel's slice.")
    cores = Unicode("100", config=True, help="SM share of each kernel's slice in percent.")
    policy = Unicode("hard", config=True, help="hard or burst.")
    kernel_name = Unicode(
        "",
        config=True,
        help="Kernelspec name (letters, digits, '-', '_', '.'). Default: python3-vgpu-<memory>-<cores>.",
    )
    display_name = Unicode(
        "", config=True, help="Name shown in the launcher. Default: Python 3 (GPU <memory>, <cores>% SM)."
    )
    device = Unicode(
        "",
        config=True,
        help="GPU index or UUID of every kernel's slice. Empty: the ledger places it (GPU 0 in a batch run without one).",
    )
    user = Bool(False, config=True, help="Install for this user only (in ~/.local/share/jupyter/kernels).")
    prefix = Unicode(
        "",
        config=True,
        help="Install in PREFIX/share/jupyter/kernels, e.g. a virtual or conda environment's folder, as "
        "`jupyter kernelspec install --prefix` does. Empty: system-wide, or this user's with --user.",
    )
    aliases = _aliases(
        "KernelspecInstallApp", "prefix", "memory", "cores", "policy", "device", "name=kernel_name", "display_name"
    )
    flags = {  # noqa: RUF012 -- traitlets' class-level table
        "user": ({"KernelspecInstallApp": {"user": True}}, user.help),
        "sys-prefix": (
            {"KernelspecInstallApp": {"prefix": sys.prefix}},
            f"Install in this Python's environment ({sys.prefix}/share/jupyter/kernels): --prefix sys.prefix.",
        ),
        "simulate": (
            {"KernelspecInstallApp": {"simulate": True}},
            "Kernels started without a vGPU server (papermill, nbconvert) use the simulated GPU.",
        ),
    }

    def run(self) -> int:
        from ipykernel.kernelspec import get_kernel_dict
        from jupyter_client.kernelspec import KernelSpecManager

        from jupyter_vgpu.manager import SliceRefused
        from jupyter_vgpu.provisioning.local import checked_layer

        try:
            memory, cores, policy = (
                format_size(parse_size(self.memory)),
                parse_sm_share(self.cores),
                parse_policy(self.policy),
            )
            device = checked_layer({"device": self.device}, "--{name}").get("device", "").strip()
        except (SliceValueError, SliceRefused) as error:
            raise UsageError(error) from None
        config: dict[str, str | bool] = {"memory": memory, "cores": str(cores), "policy": policy}
        if device:
            config["device"] = device
        if self.simulate:
            config["simulate"] = True
        name = self.kernel_name or f"python3-vgpu-{memory.lower()}-{cores}"
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise UsageError(f"kernelspec name {name!r} may hold only letters, digits, '-', '_' and '.'")
        if self.user and self.prefix:
            raise UsageError("--user and --prefix (or --sys-prefix) name two places; give one of them")
        self.warn_where_it_cannot_start(parse_size(memory), device)
        # What the installed ipykernel declares of itself (debugger, supported_encryption: a server
        # with transport_encryption="required" starts only kernels that say "curve"; the
        # protocol version), as its own `python -m ipykernel install` writes it.
        ipykernel_spec = get_kernel_dict()
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": self.display_name or f"Python 3 (GPU {memory}, {cores}% SM)",
            "language": "python",
            "metadata": {
                **ipykernel_spec.get("metadata", {}),
                "kernel_provisioner": {
                    "provisioner_name": "vgpu-provisioner",
                    "config": config,
                },
            },
        }
        if "kernel_protocol_version" in ipykernel_spec:
            spec["kernel_protocol_version"] = ipykernel_spec["kernel_protocol_version"]
        # Its own logger, which shows warnings only: the manager's "Installed kernelspec" line
        # would repeat the one below.
        kernelspecs = KernelSpecManager(log=logging.getLogger("jupyter_vgpu.kernelspec"))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "kernel.json"), "w") as file:
                json.dump(spec, file, indent=2)
            for logo in shipped_kernel_logos(kernelspecs):  # the launcher shows them, not a letter
                shutil.copy(logo, folder)
            path = kernelspecs.install_kernel_spec(folder, name, user=self.user, prefix=self.prefix or None)
        print(f"installed kernelspec {Path(path).name} in {path}")  # Jupyter lower-cases the name
        return 0

    def warn_where_it_cannot_start(self, memory: int, device: str) -> None:
        """A warning on stderr where no GPU here (the one --device names) has the slice's memory:
        its kernels would be refused on this machine. The GPUs are this machine's, or with
        --simulate, or where it has no NVIDIA driver, the simulated ones."""
        try:
            devices, kind = self.devices(), "simulated GPU" if self.simulate else "GPU"
        except (DeviceError, NativeLibraryMissing):
            if self.simulate:
                return
            try:  # no driver: the GPU of a server started with --VGPUApp.simulate=True
                use_simulator()
                devices, kind = list_devices(), "simulated GPU"
            except (DeviceError, NativeLibraryMissing, OSError):
                return
        if device:
            try:
                devices = [select_device(devices, device)]
            except SliceValueError as error:
                print(f"jupyter vgpu kernelspec install: warning: --device: {error}", file=sys.stderr)
                return
        if not devices:
            return
        largest = max(devices, key=lambda each: each.memory_total)
        if memory > largest.memory_total:
            has = format_size(largest.memory_total)
            which = (
                f"{kind} {largest.index} has ({has})"
                if device
                else f"any {kind} here has (the largest, {kind} {largest.index}, has {has})"
            )
            print(
                f"jupyter vgpu kernelspec install: warning: a {format_size(memory)} slice is more than {which}; its "
                "kernels will be refused on this machine (installed anyway, for a machine with a larger GPU)",
                file=sys.stderr,
            )


class KernelspecApp(_CommandGroup):
    name = "jupyter-vgpu-kernelspec"
    description = "Install kernelspecs whose kernels start in GPU slices of a given size."
    subcommands = {"install": (KernelspecInstallApp, KernelspecInstallApp.description)}  # noqa: RUF012 -- traitlets' class-level table

    def usage(self) -> str:
        return "jupyter vgpu kernelspec install [options]  (jupyter vgpu kernelspec install --help)"


def own_options_help(cls: type[Configurable]) -> str:
    """``--Class.name=<Type>`` and the help of every option ``cls`` itself defines, as
    ``--help-all`` shows them: jupyter_server's own help lists no extension's options, and the
    options an extension app inherits (``open_browser``, ``default_url``, ...) are not ours."""
    traits = cls.class_own_traits(config=True)
    return "\n".join(cls.class_get_trait_help(traits[name]) for name in sorted(traits))


class ConfigApp(_StrictOptions):
    name = "jupyter-vgpu-config"
    version = __version__
    description = "Print the options of the server extension (VGPUApp) and of the kernel provisioner, with their help."

    def start(self) -> None:
        # Imported here: the server extension pulls in jupyter_server, which `run` never needs.
        from jupyter_vgpu.provisioning.local import VGPUProvisioner
        from jupyter_vgpu.provisioning.pod import VGPUPodProvisioner
        from jupyter_vgpu.server.app import VGPUApp

        print("VGPUApp: the server extension. Set on the command line (jupyter lab --VGPUApp.simulate=True)")
        print("or in jupyter_server_config.py (c.VGPUApp.simulate = True).\n")
        print(own_options_help(VGPUApp))
        print("\nVGPUProvisioner: the slice of each kernel a vGPU kernelspec starts. Set in the kernelspec's")
        print(
            'metadata, {"kernel_provisioner": {"provisioner_name": "vgpu-provisioner", "config": {"memory": "8GiB"}}},'
        )
        print("which wins over the server's config (c.VGPUProvisioner.memory = '8GiB'). In a batch run without a")
        print("server (jupyter nbconvert --execute --VGPUProvisioner.memory=3GiB ...) the run's own value wins.\n")
        print(own_options_help(VGPUProvisioner))
        print(
            "\nVGPUPodProvisioner: kernels as Kubernetes pods (provisioner_name vgpu-pod-provisioner; docs/kubernetes.md)."
        )
        print("Set like VGPUProvisioner: in the kernelspec's config, or c.VGPUPodProvisioner.* for the server.\n")
        print(own_options_help(VGPUPodProvisioner))
