"""``jupyter vgpu``: run programs in slices, list devices, diagnose a machine.

The command group is here; its commands are in one module per room: ``gpu`` (run, devices),
``doctor``, ``server`` (status, resize, suspend, resume: the running server's API), ``kernelspec``
(kernelspec install, config), ``pods`` (pod-manifest), ``hub`` (broker, hub profiles), and what
they share in ``base``. Each imports the heavier parts of jupyter_vgpu and of Jupyter only when
it runs (tests/cli/test_cli_imports.py)."""

from __future__ import annotations

from jupyter_vgpu.cli.base import UsageError, _CommandGroup
from jupyter_vgpu.cli.doctor import DoctorApp
from jupyter_vgpu.cli.gpu import DevicesApp, RunApp
from jupyter_vgpu.cli.hub import BrokerApp, HubApp, HubProfilesApp
from jupyter_vgpu.cli.kernelspec import ConfigApp, KernelspecApp, KernelspecInstallApp
from jupyter_vgpu.cli.pods import PodManifestApp
from jupyter_vgpu.cli.server import ResizeApp, ResumeApp, StatusApp, SuspendApp

__all__ = [
    "BrokerApp",
    "ConfigApp",
    "DevicesApp",
    "DoctorApp",
    "HubApp",
    "HubProfilesApp",
    "KernelspecApp",
    "KernelspecInstallApp",
    "PodManifestApp",
    "ResizeApp",
    "ResumeApp",
    "RunApp",
    "StatusApp",
    "SuspendApp",
    "UsageError",
    "VGPUCommand",
    "main",
]


class VGPUCommand(_CommandGroup):
    name = "jupyter-vgpu"
    description = "GPU slices for Jupyter kernels and any program."
    # Each command in one whole sentence (its --help has the rest).
    subcommands = {  # noqa: RUF012 -- traitlets' class-level table
        "run": (RunApp, "Run a command in a fresh GPU slice and return its exit status."),
        "devices": (DevicesApp, DevicesApp.description),
        "doctor": (DoctorApp, DoctorApp.description),
        "status": (StatusApp, StatusApp.description),
        "resize": (ResizeApp, "Resize a running kernel's slice: its memory cap, SM share or policy."),
        "suspend": (SuspendApp, "Suspend a kernel: its GPU memory moves to host memory and its room is lent."),
        "resume": (ResumeApp, "Resume a suspended kernel: its room on the GPU first, then its memory."),
        "kernelspec": (KernelspecApp, "Install kernelspecs whose kernels start in GPU slices of a given size."),
        "config": (ConfigApp, ConfigApp.description),
        "pod-manifest": (
            PodManifestApp,
            "Print the Pod and Secret a pod kernel's start would create, without a cluster.",
        ),
        "broker": (BrokerApp, "The node's GPU ledger for a JupyterHub's users, which the hub runs as a service."),
        "hub": (HubApp, HubApp.description),
    }

    def usage(self) -> str:
        return "jupyter vgpu {" + ",".join(self.subcommands) + "} ...  (jupyter vgpu COMMAND --help)"


main = VGPUCommand.launch_instance
