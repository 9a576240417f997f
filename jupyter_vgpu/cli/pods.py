"""``jupyter vgpu pod-manifest``: the Pod and Secret a pod kernel's start would create, without a cluster."""

from __future__ import annotations

import sys
from typing import Any

from traitlets import TraitError, Unicode
from traitlets.config import Application

from jupyter_vgpu._version import __version__
from jupyter_vgpu.cli.base import _aliases, _StrictOptions
from jupyter_vgpu.model import SliceLimits, SliceValueError, decide_limits, parse_size


class PodManifestApp(_StrictOptions):
    name = "jupyter-vgpu-pod-manifest"
    version = __version__
    description = (
        "Print, as YAML, the Pod and Secret (key and credential redacted) that a pod kernel start would "
        "create with the current configuration (jupyter_server_config, the kernelspec), without a cluster. "
        "The kernel image: --image IMAGE here, or VGPUPodProvisioner.image in the kernelspec's config or "
        "jupyter_server_config.py. Any other pod option is set on the command line by its full name, "
        "--VGPUPodProvisioner.NAME=VALUE (`jupyter vgpu config` lists them)."
    )
    # traitlets strips, then dedents: every line starts at the margin
    examples = """
jupyter vgpu pod-manifest --image registry.example.org/kernels/torch:2.5 --memory 8GiB --cores 30
jupyter vgpu pod-manifest --kernel python3-vgpu-pod
jupyter vgpu pod-manifest --image IMAGE --VGPUPodProvisioner.namespace=students
"""
    image = Unicode(
        "",
        config=True,
        help="The kernel image (VGPUPodProvisioner.image): Python with ipykernel, and jupyter-vgpu for in-pod "
        "slices. Empty: the kernelspec's, else the server's config.",
    )
    kernel = Unicode(
        "",
        config=True,
        help="A pod kernelspec (vgpu-pod-provisioner) whose config to use. Empty: the server's config only.",
    )
    memory = Unicode(
        "",
        config=True,
        help="Memory cap of the slice, as the start would ask for it. Empty: the kernelspec's, else the server's default.",
    )
    cores = Unicode("", config=True, help="SM share in percent. Empty: the kernelspec's, else the server's default.")
    policy = Unicode("", config=True, help="hard or burst. Empty: the kernelspec's, else the server's default.")
    aliases = _aliases("PodManifestApp", "kernel", "image", "memory", "cores", "policy")

    def start(self) -> None:
        import uuid

        import yaml
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
        from jupyter_core.paths import jupyter_config_path

        from jupyter_vgpu.pods.manifest import ManifestError
        from jupyter_vgpu.provisioning.pod import POD_PROVISIONER_NAME, VGPUPodProvisioner
        from jupyter_vgpu.server.app import VGPUApp

        # The options a server would start pod kernels with: its config files, then the kernelspec.
        Application.load_config_file(self, "jupyter_server_config", path=jupyter_config_path())
        self.update_config(self.cli_config)  # this command's own options win over the files
        configured: dict[str, Any] = {}
        if self.kernel:
            try:
                spec = KernelSpecManager().get_kernel_spec(self.kernel)
            except NoSuchKernel:
                self._fail(f"no kernelspec named {self.kernel!r}")
            provisioner = spec.metadata.get("kernel_provisioner", {})
            if provisioner.get("provisioner_name") != POD_PROVISIONER_NAME:
                self._fail(
                    f"kernelspec {self.kernel!r} does not start pod kernels (its provisioner is {provisioner.get('provisioner_name') or 'the default'})"
                )
            configured = dict(provisioner.get("config", {}))
        if self.image.strip():  # the command line wins over the kernelspec and the files
            configured["image"] = self.image.strip()
        try:
            provisioner = VGPUPodProvisioner(config=self.config, kernel_id=str(uuid.uuid4()), **configured)
            server = VGPUApp(config=self.config)
            defaults = SliceLimits(parse_size(server.default_memory), server.default_cores, server.default_policy)
            size = {"memory": self.memory, "cores": self.cores, "policy": self.policy}
            limits = decide_limits(defaults, {k: configured.get(k, "") for k in size}, size)
            limits.check_within(server.largest_slice)  # as the server's ledger would refuse the start
            manifests = provisioner.planned_manifests(limits, kernel_name=self.kernel)
        except (ManifestError, SliceValueError, TraitError) as error:
            self._fail(str(error))
        print(
            f"# What a start of kernel {provisioner.kernel_id} would create ({limits.describe()}); no cluster was contacted."
        )
        print(yaml.safe_dump_all(manifests, sort_keys=False), end="")

    def _fail(self, message: str) -> None:
        print(f"jupyter vgpu pod-manifest: {message}", file=sys.stderr)
        self.exit(2)
