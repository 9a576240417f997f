"""The slice vocabulary at the edge: memory sizes, SM shares and policies.

Every entry point (CLI flags, REST bodies, config values, the %vgpu magic) parses through these
functions, so they accept and refuse the same things with the same messages.
"""

from __future__ import annotations

import re

MIB = 1 << 20

_UNITS = {
    "": MIB,  # a bare number is MiB, HAMi's unit for nvidia.com/gpumem
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)

SIZE_HELP = "a size like 512MiB, 4GiB, 4G or a bare number of MiB"
SM_SHARE_HELP = "a whole percentage from 1 to 100"
POLICIES = ("hard", "burst")
POLICY_HELP = "'hard' (never above the share) or 'burst' (may use idle capacity)"


class SliceValueError(ValueError):
    """A slice parameter that is not accepted; the message says what is."""


def parse_size(value: str | int) -> int:
    """Bytes from a size: ``512MiB``, ``4GiB``, ``4G``, ``1.5GiB`` or a bare number of MiB.

    Units are binary (``G`` and ``GB`` mean GiB, as nvidia-smi and Kubernetes' ``Gi`` do).
    """
    if isinstance(value, bool):
        raise SliceValueError(f"memory size {value!r} is not {SIZE_HELP}")
    if isinstance(value, int):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise SliceValueError(f"memory size {value!r} is not {SIZE_HELP}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise SliceValueError(f"memory size {value!r} has an unknown unit {match.group(2)!r}; use {SIZE_HELP}")
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise SliceValueError(f"memory size {value!r} must be more than zero; use {SIZE_HELP}")
    return size


def format_size(size: int) -> str:
    """A size in the unit people read, the inverse of :func:`parse_size` where it is exact."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size}B"


def parse_sm_share(value: str | int) -> int:
    """An SM share in percent: an integer 1..100 (a trailing ``%`` is allowed)."""
    text = str(value).strip().rstrip("%").strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= 100:
        raise SliceValueError(f"SM share {value!r} is not {SM_SHARE_HELP}")
    return int(text)


def parse_policy(value: str) -> str:
    """A pacing policy: ``hard`` or ``burst``."""
    policy = str(value).strip().lower()
    if policy not in POLICIES:
        raise SliceValueError(f"policy {value!r} is not {POLICY_HELP}")
    return policy


def select_device(devices, selector: str | int):
    """The device named by an index (``0``) or a UUID (``GPU-...``; a unique prefix is enough).

    ``devices`` are any objects with ``index`` and ``uuid`` (NVML devices, ledger capacities).
    """
    text = str(selector).strip()
    if isinstance(selector, int) or text.isdigit():
        matches = [device for device in devices if device.index == int(text)]
    else:
        matches = [device for device in devices if text and device.uuid.lower().startswith(text.lower())]
    if len(matches) == 1:
        return matches[0]
    choices = ", ".join(f"{device.index} ({device.uuid})" for device in devices) or "none"
    raise SliceValueError(f"device {selector!r} matches no single GPU; use an index or UUID of: {choices}")
