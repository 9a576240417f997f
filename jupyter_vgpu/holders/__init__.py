"""The holder seam: where a slice lives, and what the slice manager asks of it.

A holder turns the ledger's decisions into a place a kernel runs in: the local holder
(:class:`LocalHolder`) as a region file that ``libvgpu.so`` in every process of the kernel
obeys; a pod holder (with the Kubernetes backend) as a pod asking the cluster's GPU-sharing
scheduler for the slice. The manager drives holders through this protocol and knows no details
of either.
"""

from jupyter_vgpu.holders.base import Holder, SliceUsage
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.holders.pod import PodHolder
from jupyter_vgpu.holders.region import ProcessUsage

__all__ = ["Holder", "LocalHolder", "PodHolder", "ProcessUsage", "SliceUsage"]
