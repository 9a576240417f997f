"""What a ledger holds, as Prometheus gauges: the one definition of the device metrics that the
server's ``GET /api/vgpu/metrics`` and the broker's ``metrics`` both export, so a dashboard reads
either the same way."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge

from jupyter_vgpu.ledger.base import DeviceUsage


def add_device_gauges(registry: CollectorRegistry, usages: Iterable[DeviceUsage]) -> None:
    """Capacity, promised memory and promised SM share of each device, labelled by index and UUID."""
    labels = ["device", "uuid"]
    capacity = Gauge("vgpu_device_memory_capacity_bytes", "Device memory slices may hold", labels, registry=registry)
    allocated = Gauge(
        "vgpu_device_memory_allocated_bytes", "Device memory promised to slices", labels, registry=registry
    )
    shares = Gauge("vgpu_device_sm_share_allocated_percent", "SM share promised to slices", labels, registry=registry)
    for usage in usages:
        device = (str(usage.device.index), usage.device.uuid)
        capacity.labels(*device).set(usage.memory_capacity)
        allocated.labels(*device).set(usage.memory_allocated)
        shares.labels(*device).set(usage.total_share)
