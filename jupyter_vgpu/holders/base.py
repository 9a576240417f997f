"""The holder seam: the protocol every holder implements (:class:`Holder`) and what a holder
reads of a slice (:class:`SliceUsage`). A module of its own, below the holders (``local.py``,
``pod.py``) that import it; the package's ``__init__`` only gathers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from jupyter_vgpu.holders.region import ProcessUsage
from jupyter_vgpu.ledger import Allocation
from jupyter_vgpu.model import SliceLimits


@dataclass(frozen=True)
class SliceUsage:
    """What a slice's processes use now, as its holder reads it.

    ``state``: ``running`` (a process of the kernel uses the GPU in the slice), ``unused`` (none
    has made a CUDA call yet, or those that did have ended), ``lost``
    (the holder cannot find the slice); a pod's slice also ``scheduling``, ``pulling``,
    ``starting``, ``stopping``, ``failed``, ``exited``, ``gone``. ``message``: that state in a
    sentence, where there is more to say (the scheduler's reason). ``location``: where the slice
    is beyond this machine (``node``, ``gpu``). ``warnings``: sentences for people, e.g. limits
    someone changed that the holder restored.
    """

    state: str
    processes: list[ProcessUsage] = field(default_factory=list)
    sm_util_percent: float = 0.0
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    location: dict[str, str] = field(default_factory=dict)

    @property
    def memory_used(self) -> int:
        return sum(process.used for process in self.processes)


@runtime_checkable
class Holder(Protocol):
    kind: str  # the Allocation.holder value this holder serves

    def create(self, allocation: Allocation) -> None:
        """Make the place the slice lives in, with the allocation's limits."""

    def check_limits(self, allocation: Allocation, wanted: SliceLimits) -> None:
        """Raise CapacityError if the slice's place cannot hold ``wanted`` (a pod holds at most
        what the cluster granted it); called before the ledger decides a resize."""

    def apply_limits(self, allocation: Allocation) -> None:
        """Make the allocation's (new) limits the ones in force."""

    def usage(self, allocation: Allocation) -> SliceUsage:
        """Read what the slice uses; re-assert its limits where they drifted from the ledger's."""

    def is_alive(self, allocation: Allocation) -> bool:
        """Whether the kernel that holds the slice still runs (after a server restart)."""

    def stop(self, allocation: Allocation) -> list[str]:
        """Stop a kernel that is gone or outlived the server that started it, and every other
        process of its slice; returns why one could not be stopped (the slice is then kept)."""

    def release(self, kernel_id: str) -> None:
        """Remove what the slice left behind; idempotent."""

    def sweep(self, kept: set[str]) -> list[str]:
        """Remove what slices not in ``kept`` left behind (after a crash); returns their ids."""
