"""What every ledger speaks: its records, its refusals and the protocol both implementations
(the embedded SQLite ledger and the client of a remote one) follow.

A ledger decides; it knows nothing of kernels, provisioners, regions or pods. The slice
manager tells it which kernels are alive (:meth:`Ledger.reconcile`) and carries out its
decisions through the holders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from jupyter_vgpu.model import FULL_SHARE, Device, SliceLimits

# An allocation's metadata key while its slice is suspended (its processes checkpointed to host
# memory): {"host_memory": bytes moved to host memory, "at": epoch seconds, ...what the suspender
# needs to resume it}. A suspended slice keeps its claim and counts against its owner's budget,
# but takes no room on its device: its memory and SM share are lent to other slices until
# Ledger.resume admits it there again.
SUSPENDED_KEY = "suspended"
# An allocation's metadata key: {"suspend": seconds, "resume": seconds} the slice's last suspend
# and resume took, written by the suspender, exported as metrics by a server and a broker.
SUSPEND_TIMINGS_KEY = "suspend_timings"
# Making room across a node's users (a broker): a user's server reports each kernel's activity,
# {"last_activity": epoch seconds, "busy": whether a cell runs, "uses_gpu": whether its processes
# hold GPU memory (a kernel that holds none is only lent: no host memory)}; where a start or a resume does
# not fit, the broker records {"at": epoch seconds} under SUSPEND_REQUESTED_KEY on the
# longest-idle kernels that run no cell, and the owning server suspends them at its next check
# (server/room.py). Only the broker sets or clears a request (never a metadata update); it
# withdraws one whose kernel ran again, and counts on one for SUSPEND_REQUEST_TIMEOUT_S seconds.
ACTIVITY_KEY = "activity"
SUSPEND_REQUESTED_KEY = "suspend_requested"
SUSPEND_REQUEST_TIMEOUT_S = 60.0
# Guarantees and borrowing in a classroom (a broker): a slice admitted or resumed while its owner
# holds more than their guarantee (OwnerBudget.guaranteed_*) is marked {"at": epoch seconds} under
# BORROWING_KEY. Where a request within its owner's guarantee does not fit, the broker takes
# borrowed room back: its suspend request on the most recent borrowing kernel carries
# TAKE_BACK_KEY (True), and the kernel's server suspends it even while it runs a cell.
BORROWING_KEY = "borrowing"
TAKE_BACK_KEY = "take_back"
# A suspend request made to make room for a suspended kernel's resume names that kernel under
# ROOM_FOR_KEY: the swap. Its suspend may take the node's host memory past the broker's cap by at
# most the resumer's host memory (which the resume gives back), while the resumer is still
# suspended and the request has not timed out.
ROOM_FOR_KEY = "for_kernel"


class LedgerError(RuntimeError):
    """A ledger that cannot be used: an unreadable file, an unreachable or refusing broker."""


class LedgerFileError(LedgerError):
    """A ledger file this version cannot use: not a database, or of an unknown schema version."""


class CapacityError(Exception):
    """A slice that does not fit; the message says what is free and what to ask for instead.

    ``resource`` names what ran out: ``memory`` or ``sm_share`` (on a device), ``server_memory`` or
    ``slices`` (this server's limits), ``user_memory``, ``user_sm_share`` or ``user_slices`` (the
    owner's budget), ``devices`` (none to place on), ``host_memory`` (a broker's host memory cap leaves
    no room to take a borrowing slice back). ``requested`` and ``available`` are in that
    resource's unit (bytes, percent, slices). ``making_room``: where a broker is asking idle
    kernels to suspend so that it fits, a sentence that says so (else empty).
    """

    def __init__(self, message: str, *, resource: str, requested: int, available: int, making_room: str = ""):
        super().__init__(message)
        self.resource = resource
        self.requested = requested
        self.available = available
        self.making_room = making_room


class NotSupported(RuntimeError):
    """What this ledger cannot do (a broker's ledger and suspending slices); the message says so."""


class _MessageKeyError(KeyError):
    # KeyError's str() is the repr of its argument; these carry sentences for people.
    def __str__(self) -> str:
        return str(self.args[0])


class UnknownSlice(_MessageKeyError):
    """No slice is held for this kernel id."""


class SliceExists(_MessageKeyError):
    """A slice is already held for this kernel id."""


@dataclass(frozen=True)
class OwnerBudget:
    """What all the slices of one owner may hold together, checked in the same decision that
    admits or grows one of them (a classroom size: the broker reads it from the hub).

    ``None`` is no limit. ``sm_share`` bounds the sum of the owner's shares; ``policy`` is the
    strongest policy the owner may ask for (a ``burst`` budget refuses ``hard`` slices, whose
    share is a promise to the owner that others pay for). ``label`` names the budget in refusals
    (``"alice's size 'small'"``). ``guaranteed_memory`` and ``guaranteed_sm_share``: where set
    (every classroom size), what of ``memory`` and ``sm_share`` is guaranteed: borrowers give that
    room back when its owner asks for it; the rest, where a size may borrow, is borrowed from room
    nobody within a guarantee needs. None (a budget with no guarantee): nothing is taken back for it.
    """

    memory: int | None = None
    sm_share: int | None = None
    slices: int | None = None
    policy: str = "hard"
    label: str = "this budget"
    guaranteed_memory: int | None = None
    guaranteed_sm_share: int | None = None


@dataclass(frozen=True)
class Allocation:
    """A slice the ledger holds. ``holder`` says where the slice lives (``local``: a region file
    on this machine; ``pod``: a Kubernetes pod on ``node``)."""

    kernel_id: str
    device_uuid: str
    device_index: int
    memory_limit: int
    sm_share: int
    policy: str
    owner: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    holder: str = "local"
    node: str = ""

    @property
    def limits(self) -> SliceLimits:
        return SliceLimits(self.memory_limit, self.sm_share, self.policy)

    @property
    def suspended(self) -> bool:
        """Whether the slice is suspended: its processes' memory is in host memory, and its room
        on the device is lent to others (see SUSPENDED_KEY)."""
        return isinstance(self.metadata.get(SUSPENDED_KEY), dict)

    @property
    def lent(self) -> bool:
        """Whether the slice is suspended with nothing moved: its kernel had not used the GPU, so
        its room is lent to others until its first CUDA call takes it back."""
        state = self.metadata.get(SUSPENDED_KEY)
        return isinstance(state, dict) and bool(state.get("lent"))

    @property
    def host_memory(self) -> int:
        """Bytes of the slice's processes held in host memory while it is suspended (else 0)."""
        state = self.metadata.get(SUSPENDED_KEY)
        return int(state.get("host_memory", 0)) if isinstance(state, dict) else 0


@dataclass(frozen=True)
class UnpromisedMemory:
    """Memory a device really holds (NVML) that the ledger never promised, so must not promise
    again: ``outside`` is held by processes of no slice (another program, a process that escaped
    its slice, what a dead server left), ``over_cap`` by slices' processes past their caps (a
    kernel that raised its own cap and allocated before the server put it back)."""

    outside: int = 0
    over_cap: int = 0

    @property
    def total(self) -> int:
        return self.outside + self.over_cap


# What each device (by UUID) holds beyond the given allocations' promises, read when a decision
# is made. The ledger knows no processes: whoever can see them (the server's holders, the
# broker's process table) supplies the reading.
DeviceReader = Callable[[list[Allocation]], Mapping[str, UnpromisedMemory]]


@dataclass(frozen=True)
class DeviceUsage:
    """What one device holds. ``share_capacity`` is the cap on ``total_share`` (hard + burst).
    ``memory_outside`` and ``memory_over_cap`` are what the device held beyond the ledger's
    promises when this was read (see :class:`UnpromisedMemory`); ``memory_free`` excludes them."""

    device: Device
    memory_capacity: int
    memory_allocated: int
    memory_free: int
    hard_share: int
    total_share: int
    share_capacity: int
    slices: int
    memory_outside: int = 0
    memory_over_cap: int = 0

    def share_free(self, policy: str) -> int:
        """The largest share one more slice of this policy could have."""
        total_free = self.share_capacity - self.total_share
        if policy == "hard":
            return max(0, min(FULL_SHARE - self.hard_share, total_free))
        return max(0, total_free)

    def fits(self, limits: SliceLimits) -> bool:
        return self.memory_free >= limits.memory_limit and self.share_free(limits.policy) >= limits.sm_share


@dataclass(frozen=True)
class Admission:
    """What :meth:`Ledger.admit` is asked (its arguments, in one value)."""

    kernel_id: str
    limits: SliceLimits
    owner: str = ""
    device: str | int | None = None
    metadata: dict[str, Any] | None = None
    holder: str = "local"
    budget: OwnerBudget | None = None


@dataclass(frozen=True)
class Resizing:
    """What :meth:`Ledger.resize` is asked (its arguments, in one value); None: unchanged."""

    kernel_id: str
    memory_limit: int | None = None
    sm_share: int | None = None
    policy: str | None = None
    budget: OwnerBudget | None = None


@runtime_checkable
class Ledger(Protocol):
    """The slices of a node's GPUs and the decisions on them; every method may be called from
    any thread. Decisions are atomic: two concurrent admissions never over-commit a device.
    Both ledgers subclass it, so that ``admit`` and ``resize`` have one signature, here."""

    @property
    def devices(self) -> list[Device]: ...

    def devices_usage(self) -> list[DeviceUsage]: ...

    def get(self, kernel_id: str) -> Allocation | None: ...

    def allocations(self) -> list[Allocation]:
        """Every allocation, oldest first."""
        ...

    def admit(
        self,
        kernel_id: str,
        limits: SliceLimits,
        *,
        owner: str = "",
        device: str | int | None = None,
        metadata: dict[str, Any] | None = None,
        holder: str = "local",
        budget: OwnerBudget | None = None,
    ) -> Allocation:
        """Place a slice on ``device`` or where the placement policy puts it, within ``owner``'s
        ``budget``; raises CapacityError (no room), SliceValueError (a bad device or size),
        SliceExists. The one signature of both ledgers: each decides in :meth:`decide_admission`."""
        return self.decide_admission(Admission(kernel_id, limits, owner, device, metadata, holder, budget))

    def decide_admission(self, admission: Admission) -> Allocation: ...

    def resize(
        self,
        kernel_id: str,
        *,
        memory_limit: int | None = None,
        sm_share: int | None = None,
        policy: str | None = None,
        budget: OwnerBudget | None = None,
    ) -> Allocation:
        """Change a slice in place; only what grows is checked against capacity and against
        ``budget`` (its owner's). Each ledger decides in :meth:`decide_resize`."""
        return self.decide_resize(Resizing(kernel_id, memory_limit, sm_share, policy, budget))

    def decide_resize(self, resizing: Resizing) -> Allocation: ...

    def release(self, kernel_id: str) -> Allocation | None:
        """Free a kernel's slice; returns what it held, or None if it held nothing."""
        ...

    def update_metadata(self, kernel_id: str, **fields) -> Allocation: ...

    def suspend(self, kernel_id: str, *, host_memory: int, details: dict[str, Any] | None = None) -> Allocation:
        """Mark a slice suspended once its processes hold nothing on its device: its memory and
        SM share are free there for others, its claim (and its owner's budget) kept. ``details``
        are kept with the state (what a resume needs). Raises UnknownSlice."""
        ...

    def resume(self, kernel_id: str) -> Allocation:
        """Admit a suspended slice on its device again, before its processes are restored;
        raises CapacityError where it no longer fits (it stays suspended), UnknownSlice."""
        ...

    def reconcile(self, is_alive: Callable[[Allocation], bool]) -> list[Allocation]:
        """Release every allocation whose kernel is gone; returns the released."""
        ...

    def close(self) -> None: ...
