"""The ledger seam: which slices each GPU holds and whether one more fits.

Two implementations of one protocol (:class:`Ledger`): :class:`EmbeddedLedger`, an SQLite file
in the server (the default, one server), and :class:`RemoteLedger`, a client of a ledger served
over HTTP by :mod:`jupyter_vgpu.ledger.service` (one ledger for a node's many servers). Both pass
the same contract tests (tests/ledger).
"""

from jupyter_vgpu.ledger.base import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    SUSPEND_TIMINGS_KEY,
    SUSPENDED_KEY,
    TAKE_BACK_KEY,
    Allocation,
    CapacityError,
    DeviceUsage,
    Ledger,
    LedgerError,
    LedgerFileError,
    NotSupported,
    OwnerBudget,
    SliceExists,
    UnknownSlice,
)
from jupyter_vgpu.ledger.embedded import EmbeddedLedger

__all__ = [
    "ACTIVITY_KEY",
    "BORROWING_KEY",
    "SUSPENDED_KEY",
    "SUSPEND_REQUESTED_KEY",
    "SUSPEND_REQUEST_TIMEOUT_S",
    "SUSPEND_TIMINGS_KEY",
    "TAKE_BACK_KEY",
    "Allocation",
    "CapacityError",
    "DeviceUsage",
    "EmbeddedLedger",
    "Ledger",
    "LedgerError",
    "LedgerFileError",
    "NotSupported",
    "OwnerBudget",
    "SliceExists",
    "UnknownSlice",
]
