"""What the largest GPU could ever give a kernel pod, from Node objects alone: HAMi's register
counts one GPU (HAMi places a pod on one), a plain node its allocatable resource (the default
scheduler counts per node); nodes outside the pods' nodeSelector do not count; where no node says,
nothing is refused (nodes may yet come)."""

from __future__ import annotations

import json

from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.pods.capacity import largest_room, never_fits
from jupyter_vgpu.pods.manifest import PodSettings

GIB = 1 << 30


def node(name, *, labels=None, gpumem=None, register=None):
    annotations = {"hami.io/node-nvidia-register": json.dumps(register)} if register is not None else {}
    allocatable = {"cpu": "8"} | ({"nvidia.com/gpumem": str(gpumem)} if gpumem is not None else {})
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "status": {"allocatable": allocatable},
    }


def gpu(mib, health=True):
    return {"id": "GPU-x", "devmem": mib, "devcore": 100, "count": 10, "health": health}


def test_hami_places_on_one_gpu_so_its_largest_gpu_counts_not_the_nodes_sum():
    nodes = [node("a", gpumem=49152, register=[gpu(24576), gpu(24576)])]
    room = largest_room(nodes, "nvidia.com/gpumem")
    assert (room.units, room.node, room.per_gpu) == (24576, "a", True)
    refusal = never_fits(nodes, PodSettings(), SliceLimits(30 * GIB, 30, "burst"))
    assert refusal == (
        "Its 30GiB GPU slice can never fit: the largest GPU in the cluster (on node a) has 24GiB of "
        "nvidia.com/gpumem. Ask for 24GiB or less."
    )


def test_an_unhealthy_gpu_does_not_count():
    nodes = [node("a", register=[gpu(81920, health=False), gpu(16384)])]
    assert largest_room(nodes, "nvidia.com/gpumem").units == 16384


def test_without_hamis_register_the_nodes_allocatable_counts():
    nodes = [node("a", gpumem=8192), node("b", gpumem=16384)]
    room = largest_room(nodes, "nvidia.com/gpumem")
    assert (room.units, room.node, room.per_gpu) == (16384, "b", False)
    assert never_fits(nodes, PodSettings(), SliceLimits(16 * GIB, 30, "burst")) is None
    assert "the node with the most, b, has 16GiB" in never_fits(
        nodes, PodSettings(), SliceLimits(17 * GIB, 30, "burst")
    )


def test_only_nodes_the_pods_may_go_to_count():
    nodes = [node("big", gpumem=81920, labels={"pool": "other"}), node("small", gpumem=8192, labels={"pool": "class"})]
    settings = PodSettings(node_selector={"pool": "class"})
    assert "on node" not in never_fits(nodes, settings, SliceLimits(12 * GIB, 30, "burst"))
    assert "small" in never_fits(nodes, settings, SliceLimits(12 * GIB, 30, "burst"))


def test_where_no_node_advertises_the_resource_nothing_is_refused():
    assert never_fits([node("cpu-only")], PodSettings(), SliceLimits(80 * GIB, 30, "burst")) is None
    assert never_fits([], PodSettings(), SliceLimits(80 * GIB, 30, "burst")) is None


def test_gib_units_as_gpushare_counts_them():
    settings = PodSettings(memory_resource="aliyun.com/gpu-mem", memory_resource_unit="GiB", cores_resource="")
    nodes = [{"metadata": {"name": "a"}, "status": {"allocatable": {"aliyun.com/gpu-mem": "16"}}}]
    assert never_fits(nodes, settings, SliceLimits(16 * GIB, 30, "burst")) is None
    assert "has 16GiB of aliyun.com/gpu-mem" in never_fits(nodes, settings, SliceLimits(17 * GIB, 30, "burst"))
