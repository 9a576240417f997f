"""What a ledger holds, as Prometheus gauges: the one definition of the device and suspend
metrics that the server's ``GET /api/vgpu/metrics`` and the broker's ``metrics`` both export, so
a dashboard reads either the same way."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge

from jupyter_vgpu.ledger.base import SUSPEND_TIMINGS_KEY, Allocation, DeviceUsage

DEVICE_LABELS = ["device", "uuid"]


def gauges(registry: CollectorRegistry, labels: list[str], **documented: str) -> list[Gauge]:
    """Gauges with one set of labels, in the order given: each metric's name, then its help."""
    return [Gauge(name, text, labels, registry=registry) for name, text in documented.items()]


def add_device_gauges(registry: CollectorRegistry, usages: Iterable[DeviceUsage]) -> None:
    """Capacity, promised memory and promised SM share of each device, labelled by index and UUID."""
    capacity, allocated, shares = gauges(
        registry,
        DEVICE_LABELS,
        vgpu_device_memory_capacity_bytes="Device memory slices may hold",
        vgpu_device_memory_allocated_bytes="Device memory promised to slices",
        vgpu_device_sm_share_allocated_percent="SM share promised to slices",
    )
    for usage in usages:
        device = (str(usage.device.index), usage.device.uuid)
        capacity.labels(*device).set(usage.memory_capacity)
        allocated.labels(*device).set(usage.memory_allocated)
        shares.labels(*device).set(usage.total_share)


def add_suspend_gauges(registry: CollectorRegistry, allocations: list[Allocation]) -> None:
    """Suspended slices and the host memory they hold, per device; each slice's last suspend and
    resume durations (seconds), where it has been suspended."""
    count, host = gauges(
        registry,
        DEVICE_LABELS,
        vgpu_device_suspended_slices="Suspended slices",
        vgpu_device_suspended_host_memory_bytes="Host memory holding suspended slices' device memory",
    )
    seconds = {
        step: Gauge(
            f"vgpu_slice_last_{step}_seconds",
            f"Seconds the slice's last {step} took (lock, copy and release; or room, copy back and unlock)",
            ["kernel_id", "device"],
            registry=registry,
        )
        for step in ("suspend", "resume")
    }
    for allocation in allocations:
        if allocation.holder != "local":
            continue
        device = (str(allocation.device_index), allocation.device_uuid)
        count.labels(*device).inc(1 if allocation.suspended else 0)
        host.labels(*device).inc(allocation.host_memory)
        timings = allocation.metadata.get(SUSPEND_TIMINGS_KEY)
        for step, gauge in seconds.items():
            if isinstance(timings, dict) and isinstance(timings.get(step), (int, float)):
                gauge.labels(allocation.kernel_id, str(allocation.device_index)).set(timings[step])
