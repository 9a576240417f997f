"""Kernel provisioners (jupyter_client's ``jupyter_client.kernel_provisioners`` entry points):
where and how a kernel of a vGPU kernelspec starts in its slice."""

from jupyter_vgpu.provisioning.local import PROVISIONER_NAME, VGPUProvisioner

__all__ = ["PROVISIONER_NAME", "VGPUProvisioner"]
