"""The words of a slice at the edge: memory sizes, SM shares and policies, parsed from text.

Every entry point (CLI flags, REST bodies, config values, the %vgpu magic) parses through these
functions, so they accept and refuse the same things with the same messages.
"""

from __future__ import annotations

import math
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
# ASCII only: str.isdigit() and \d also take "²" and other digits int() refuses, and with
# IGNORECASE [a-z] matches the Kelvin sign (U+212A), which lower() turns into "k".
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
_SHARE = re.compile(r"^\s*([0-9]{1,3})\s*%?\s*$", re.ASCII)
# Larger than any GPU for decades, small enough that every size stays an exact int64 in the
# region, the ledger and JSON.
MAX_SIZE = 1 << 60
# No CUDA program runs in less, and a cap below it is a typo (0.0001 for 0.1 GiB), not a wish.
MIN_SIZE = MIB

SIZE_HELP = "a size like 512MiB, 4GiB, 4G or a bare number of MiB"
SM_SHARE_HELP = "a whole percentage from 1 to 100"
DEVICE_HELP = "a GPU index (0, 1, ...) or UUID (GPU-...)"
_DEVICE = re.compile(r"^\s*(?:[0-9]+|(?:GPU|MIG)-[0-9A-Za-z-]+)\s*$", re.IGNORECASE | re.ASCII)
POLICIES = ("hard", "burst")
POLICY_HELP = "'hard' (never above the share) or 'burst' (may use idle capacity)"


class SliceValueError(ValueError):
    """A slice parameter that is not accepted; the message says what is."""


def parse_size(value: str | float) -> int:
    """Bytes from a size: ``512MiB``, ``4GiB``, ``4G``, ``1.5GiB`` or a bare number of MiB.

    A bare number means MiB whether it comes as text, an int or a float (JSON ``2048`` and
    ``2048.0`` alike), as HAMi's ``nvidia.com/gpumem`` does. A number (not text) must be a whole
    number of MiB, as api.yaml's ``MemorySize`` says: JSON ``1.9999`` is refused, not made a cap
    of 2,097,047 bytes. Text may have a fraction (``1.5GiB``, ``0.5``); the size is then rounded
    down to whole bytes. Units are binary (``G`` and ``GB`` mean GiB, as nvidia-smi and
    Kubernetes' ``Gi`` do).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SliceValueError(f"memory size {value!r} is not {SIZE_HELP}")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise SliceValueError(f"memory size {value!r} is not {SIZE_HELP}")
    if isinstance(value, float) and not value.is_integer():
        raise SliceValueError(
            f"memory size {value!r} is a number of MiB with a fraction; give a whole number of MiB, or text with a "
            "unit such as '1.5GiB'"
        )
    if isinstance(value, (int, float)):
        # A float of a huge int overflows (JSON has ints of any length); any such int is beyond
        # MAX_SIZE anyway.
        number, unit = (float(value) if abs(value) <= MAX_SIZE else float("inf")), ""
    else:
        match = _SIZE.match(value)
        if not match:
            raise SliceValueError(f"memory size {value[:40]!r} is not {SIZE_HELP}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise SliceValueError(
                f"memory size {value[:40]!r} has an unknown unit {match.group(2)[:10]!r}; use {SIZE_HELP}"
            )
    shown = _shown(value)
    if number * _UNITS[unit] > MAX_SIZE:
        raise SliceValueError(f"memory size {shown} is larger than any GPU; use {SIZE_HELP}")
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise SliceValueError(f"memory size {shown} must be more than zero; use {SIZE_HELP}")
    if size < MIN_SIZE:
        raise SliceValueError(f"memory size {shown} is less than the smallest slice, 1MiB; use {SIZE_HELP}")
    return size


def _shown(value: str | float) -> str:
    """The start of a value for a message; an int of thousands of digits is never made text
    (Python refuses past 4300 digits)."""
    if isinstance(value, int) and abs(value) > MAX_SIZE:
        return f"(a number of more than {len(str(MAX_SIZE))} digits)"
    return repr(str(value)[:40])


def format_size(size: int) -> str:
    """A size in the unit people read, the inverse of :func:`parse_size` where it is exact."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if size >= factor:
            value = size / factor
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size}B"


def exact_size(size: int) -> str:
    """A size as text that parses back to exactly ``size`` bytes: ``1GiB`` where
    :func:`format_size` is exact (it rounds to 0.1), else whole MiB, else bytes."""
    text = format_size(size)
    try:
        exact = parse_size(text) == size
    except SliceValueError:
        exact = False
    if exact:
        return text
    return f"{size // MIB}MiB" if size % MIB == 0 else f"{size}B"


def parse_sm_share(value: str | float) -> int:
    """An SM share in percent: an integer 1..100 (a trailing ``%`` is allowed in text). A float
    that is a whole number (JSON ``10.0``, an integer to JSON Schema) is that integer."""
    if isinstance(value, float) and value.is_integer() and 1 <= value <= 100:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SliceValueError(f"SM share {value!r} is not {SM_SHARE_HELP}")
    match = _SHARE.match(str(value))
    if not match or not 1 <= int(match.group(1)) <= 100:
        raise SliceValueError(f"SM share {str(value)[:40]!r} is not {SM_SHARE_HELP}")
    return int(match.group(1))


def parse_policy(value: object, *, exact: bool = False) -> str:
    """A pacing policy: ``hard`` or ``burst``; from people (the CLI, the magic, config) in any case
    and with spaces around, ``exact``: (the REST API, whose schema is an enum) as written there."""
    policy = (value if exact else value.strip().lower()) if isinstance(value, str) else None
    if policy is None or policy not in POLICIES:
        written = ", written exactly so (lower case, no spaces)" if exact else ""
        raise SliceValueError(f"policy {str(value)[:40]!r} is not {POLICY_HELP}{written}")
    return policy


def parse_device(value: object) -> str:
    """A device selector: a GPU index or a GPU or MIG UUID, as text without spaces."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not _DEVICE.match(str(value)):
        raise SliceValueError(f"device {str(value)[:40]!r} is not {DEVICE_HELP}")
    return str(value).strip()
