"""What the cluster's largest GPU could ever give one kernel pod, read from its nodes.

A start that asks for more GPU memory than any node could ever grant is refused at once, saying
the sizes, instead of waiting in the cluster's line for ever. Where a node carries HAMi's register
of its GPUs (``hami.io/node-nvidia-register``, written by HAMi's device plugin), the largest
single GPU counts, as HAMi places a pod on one GPU; elsewhere the node's allocatable amount of the
memory resource, as Kubernetes' default scheduler counts an extended resource per node.

Pure functions of the Node objects: no API calls here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.model import SliceLimits, format_size
from jupyter_vgpu.pods.manifest import MEMORY_UNITS, PodSettings

HAMI_REGISTER = "hami.io/node-nvidia-register"


@dataclass(frozen=True)
class LargestRoom:
    """The most memory-resource units one pod could be granted, and where."""

    units: int
    node: str
    per_gpu: bool  # from HAMi's register (one GPU), else the node's allocatable resource


def _matches(node: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _hami_gpus(annotations: dict[str, str]) -> list[int] | None:
    """The memory (MiB) of each healthy GPU in HAMi's register, or None where there is none."""
    text = annotations.get(HAMI_REGISTER)
    if not text:
        return None
    try:
        register = json.loads(text)
    except ValueError:
        return None
    if not isinstance(register, list):
        return None
    return [
        int(gpu.get("devmem", 0))
        for gpu in register
        if isinstance(gpu, dict) and gpu.get("health", True) and str(gpu.get("devmem", "")).isdigit()
    ]


def _units(quantity: Any) -> int:
    """An extended resource's quantity (whole units: Kubernetes allows no fractions of them)."""
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def largest_room(
    nodes: list[dict[str, Any]], memory_resource: str, node_selector: dict[str, str] | None = None
) -> LargestRoom | None:
    """The largest grant of ``memory_resource`` any node matching ``node_selector`` could give
    one pod; None where no node advertises the resource (nodes may yet come: an autoscaler)."""
    best: LargestRoom | None = None
    for node in nodes:
        if node_selector and not _matches(node, node_selector):
            continue
        name = (node.get("metadata") or {}).get("name", "")
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        gpus = _hami_gpus((node.get("metadata") or {}).get("annotations") or {})
        if memory_resource == "nvidia.com/gpumem" and gpus:
            candidate = LargestRoom(max(gpus), name, per_gpu=True)
        elif memory_resource in allocatable:
            candidate = LargestRoom(_units(allocatable[memory_resource]), name, per_gpu=False)
        else:
            continue
        if best is None or candidate.units > best.units:
            best = candidate
    return best


def never_fits(nodes: list[dict[str, Any]], settings: PodSettings, limits: SliceLimits) -> str | None:
    """The sentence that refuses a slice no node of ``nodes`` could ever grant (its sizes, and
    what to ask for instead), or None where one could, or where no node says (nodes may come)."""
    unit = MEMORY_UNITS[settings.memory_resource_unit]
    room = largest_room(nodes, settings.memory_resource, settings.node_selector)
    asked = settings.granted(limits).memory_limit // unit
    if room is None or asked <= room.units:
        return None
    where = (
        f"the largest GPU in the cluster (on node {room.node}) has"
        if room.per_gpu
        else f"the node with the most, {room.node}, has"
    )
    most = format_size(room.units * unit)
    return (
        f"Its {format_size(limits.memory_limit)} GPU slice can never fit: {where} {most} of "
        f"{settings.memory_resource}. Ask for {most} or less."
    )
