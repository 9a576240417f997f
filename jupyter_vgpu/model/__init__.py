"""The model: the words every layer shares (sizes, a slice's limits, devices). Imports nothing
of jupyter_vgpu above it."""

from jupyter_vgpu.model.devices import Device, DeviceError, list_devices, select_device, use_simulator
from jupyter_vgpu.model.limits import DEFAULT_LIMITS, FULL_SHARE, NOTEBOOK_DEFAULTS, SliceLimits, decide_limits
from jupyter_vgpu.model.sizes import (
    SliceValueError,
    format_size,
    parse_device,
    parse_policy,
    parse_size,
    parse_sm_share,
)

__all__ = [
    "DEFAULT_LIMITS",
    "FULL_SHARE",
    "NOTEBOOK_DEFAULTS",
    "Device",
    "DeviceError",
    "SliceLimits",
    "SliceValueError",
    "decide_limits",
    "format_size",
    "list_devices",
    "parse_device",
    "parse_policy",
    "parse_size",
    "parse_sm_share",
    "select_device",
    "use_simulator",
]
