"""A restarted server adopts the sliced kernels its predecessor left running (issue 26).

A sliced kernel outlives its server for ``VGPUApp.kernel_survival`` seconds
(notebook/survive.py); the restarted server's ``SliceManager.reconcile`` keeps those that still
run and can be reached (``SliceManager.survivors``). Each is put into jupyter_server's kernel
manager through its public ``start_kernel``, with the kernel's own id and kernelspec and the
vGPU provisioner's ``vgpu_adopt`` argument: the provisioner then launches nothing, the kernel
manager reads the kernel's connection file, and the provisioner watches the kernel's process by
pid (provisioning/local.py). From then on it is a kernel of this server like any other: listed by
``GET /api/kernels`` (and, its session row kept, ``/api/sessions``), reached over the websocket,
restarted, interrupted and shut down as usual, under the idle policy and the line. This runs
before the server answers its first request, so no session row is read before its kernel is
back.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyter_vgpu.manager import KERNEL_NAME_KEY, SliceManager, this_process
from jupyter_vgpu.provisioning.base import ADOPT_ARGUMENT


def this_server(url: str) -> dict[str, Any]:
    """What names this server beside an adopted kernel's region: its process and URL."""
    return {**this_process(), "url": url}


async def adopt_survivors(slices: SliceManager, kernels: Any, server: dict[str, Any], log: logging.Logger) -> list[str]:
    """Adopt every survivor into ``kernels`` (jupyter_server's MappingKernelManager); the ids
    adopted. One that cannot be is kept suspended, or stopped (``SliceManager.not_adopted``)."""
    adopted = []
    for allocation in slices.survivors():
        kernel_id = allocation.kernel_id
        if kernel_id in kernels:
            continue
        try:
            await kernels.start_kernel(
                kernel_id=kernel_id,
                kernel_name=allocation.metadata[KERNEL_NAME_KEY],
                **{ADOPT_ARGUMENT: slices.adoption(allocation)},
            )
            # With pending kernels start_kernel returns before the (instant) start has run.
            await kernels.get_kernel(kernel_id).ready
        except Exception as error:  # noqa: BLE001 -- any failure leaves the kernel where it was: not adopted
            if kernel_id in kernels:
                kernels.remove_kernel(kernel_id)  # out of the map, its process untouched
            slices.not_adopted(allocation, f"{type(error).__name__}: {error}")
            continue
        slices.adopted(kernel_id, server)
        log.info("jupyter_vgpu: adopted kernel %s, which outlived the last server", kernel_id)
        adopted.append(kernel_id)
    return adopted


__all__ = ["adopt_survivors", "this_server"]
