"""The embedded ledger: the slices of this machine's GPUs in an SQLite file.

Every decision (admit, resize, release, reconcile) is one SQLite ``BEGIN IMMEDIATE`` transaction
on a file, so concurrent kernel starts in many threads and processes never over-commit a device,
and a server killed with SIGKILL finds every slice again when it reopens the file. The ledger
knows nothing of kernels, provisioners or regions: the server extension tells it which devices
exist (:meth:`Ledger.set_devices`) and which kernels are alive (:meth:`Ledger.reconcile`), and
carries out its decisions.

Capacity of a device: its memory less ``reserve``; SM shares in percent, where the ``hard``
shares add up to at most 100 and all shares (``hard`` and ``burst``) to at most
``100 * burst_oversubscription``. Burst slices may run above their share when the GPU is idle,
so promising more than 100% of them is safe; hard slices are a guarantee, so it is not.

What the device really holds: memory NVML shows in use that no promise covers (a program outside
any slice, a slice past its cap, what a dead server left) is taken off a device's free memory in
every admission, growth and usage reading, read by the ``reader`` given (see
:data:`~jupyter_vgpu.ledger.base.DeviceReader`) inside the decision itself, so it is as fresh as
the decision.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_vgpu._version import __version__
from jupyter_vgpu.ledger.base import (
    SUSPENDED_KEY,
    Admission,
    Allocation,
    CapacityError,
    DeviceReader,
    DeviceUsage,
    Ledger,
    LedgerFileError,
    OwnerBudget,
    Resizing,
    SliceExists,
    UnknownSlice,
    UnpromisedMemory,
)
from jupyter_vgpu.model import FULL_SHARE, Device, SliceLimits, SliceValueError, format_size, select_device

if TYPE_CHECKING:
    from typing_extensions import Self

SCHEMA_VERSION = 2
PLACEMENTS = ("binpack", "spread")
# Long enough to wait out a burst of concurrent kernel starts (a decision holds the write lock for
# well under a millisecond), short enough that a wedged peer is reported rather than waited on.
BUSY_TIMEOUT_S = 30.0

# The schema of version 1, frozen: every later version is a migration from it (_MIGRATIONS), so
# a file of any version opens, and tests write a version-1 file from it.
SCHEMA_VERSION_1 = (
    """CREATE TABLE allocations (
        kernel_id    TEXT PRIMARY KEY,
        device_uuid  TEXT NOT NULL,
        device_index INTEGER NOT NULL,
        memory_limit INTEGER NOT NULL CHECK (memory_limit > 0),
        sm_share     INTEGER NOT NULL CHECK (sm_share BETWEEN 1 AND 100),
        policy       TEXT NOT NULL CHECK (policy IN ('hard', 'burst')),
        owner        TEXT NOT NULL,
        created_at   REAL NOT NULL,
        metadata     TEXT NOT NULL
    )""",
    "CREATE INDEX allocations_by_device ON allocations (device_uuid)",
)
# Each step takes the file from version N to N + 1, so a ledger of any older version opens.
_MIGRATIONS = {
    # 2: where a slice lives (a local region, a pod on a node), so a slice can be held by
    # another backend than this machine's region files.
    1: (
        "ALTER TABLE allocations ADD COLUMN holder TEXT NOT NULL DEFAULT 'local'",
        "ALTER TABLE allocations ADD COLUMN node TEXT NOT NULL DEFAULT ''",
    ),
}
_COLUMNS = (
    "kernel_id, device_uuid, device_index, memory_limit, sm_share, policy, owner, created_at, metadata, holder, node"
)

log = logging.getLogger(__name__)

# Told of every committed change to a slice's limits, in the order of the decisions: (before,
# after), before None for an admission, after None for a release. Called under the ledger's lock,
# so it must be quick and must not call back into the ledger; the broker publishes limits pages
# through one.
ChangeObserver = Callable[[Allocation | None, Allocation | None], None]


@dataclass(frozen=True)
class _Held:
    """Sums over a set of allocations, per device and over the whole server."""

    by_device: dict[str, tuple[int, int, int, int]]  # uuid -> (memory, hard share, total share, slices)
    memory: int
    slices: int


def _allocation(row: tuple[Any, ...]) -> Allocation:
    """An allocation from a row of the columns ``_COLUMNS`` names, its metadata decoded from JSON."""
    kernel_id, device_uuid, device_index, memory_limit, sm_share, policy, owner, created_at, metadata, holder, node = (
        row
    )
    return Allocation(
        kernel_id,
        device_uuid,
        device_index,
        memory_limit,
        sm_share,
        policy,
        owner,
        created_at,
        metadata=json.loads(metadata),
        holder=holder,
        node=node,
    )


def _gpu(device: Device) -> str:
    return f"GPU {device.index}"


def _enter_wal_mode(connection: sqlite3.Connection) -> None:
    """Switch a new file to WAL, waiting for other processes that open it at the same moment.

    SQLite gives up on this switch at once when another connection holds a lock, without calling
    the busy handler, so the waiting that busy_timeout does everywhere else is done here.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _open(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    try:
        # WAL: readers never wait for a decision. synchronous=NORMAL: a commit survives the
        # process being killed (what restarts are about); only a power cut may lose the last few,
        # and after a power cut no kernel is alive to hold them anyway.
        _enter_wal_mode(connection)
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute("BEGIN IMMEDIATE")
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for statement in SCHEMA_VERSION_1:
                    connection.execute(statement)
                version = 1
            if 0 < version < SCHEMA_VERSION:
                while version < SCHEMA_VERSION:
                    for statement in _MIGRATIONS[version]:
                        connection.execute(statement)
                    version += 1
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    except sqlite3.DatabaseError as error:
        connection.close()
        # OperationalError (locked, unreadable, ...) is a DatabaseError too but says nothing about
        # what the file holds; only the base class means "not an SQLite database".
        if type(error) is not sqlite3.DatabaseError:
            raise
        raise LedgerFileError(
            f"ledger file {path} is not a jupyter-vgpu ledger ({error}); move it away to start an empty ledger"
        ) from None
    if version != SCHEMA_VERSION:
        connection.close()
        raise LedgerFileError(
            f"ledger file {path} has schema version {version}, but jupyter-vgpu {__version__} reads version "
            f"{SCHEMA_VERSION}; run the jupyter-vgpu that wrote it, or move the file away to start an empty "
            "ledger (slices of running kernels are then not counted until they restart)"
        )
    return connection


class EmbeddedLedger(Ledger):
    """Slices per device, persisted in an SQLite file shared by every thread and process using it.

    Open one per process; its methods may be called from any thread.
    """

    def __init__(
        self,
        path: str | Path,
        devices: list[Device],
        *,
        reserve: int = 0,
        burst_oversubscription: float = 1.0,
        placement: str = "binpack",
        max_slice: SliceLimits | None = None,
        server_memory_limit: int | None = None,
        server_slice_limit: int | None = None,
        observers: Sequence[ChangeObserver] = (),
        reader: DeviceReader | None = None,
    ):
        if reserve < 0:
            raise ValueError(f"reserve must be zero or more bytes, not {reserve!r}")
        if burst_oversubscription < 1.0:
            raise ValueError(f"burst_oversubscription must be 1.0 or more, not {burst_oversubscription!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
        self.path = Path(path)
        self.reserve = reserve
        self.share_capacity = int(FULL_SHARE * burst_oversubscription)
        self.placement = placement
        self.max_slice = max_slice
        self.server_memory_limit = server_memory_limit
        self.server_slice_limit = server_slice_limit
        self.observers = tuple(observers)
        # Set after construction where the reading needs what is built from the ledger (holders).
        self.reader = reader
        self._changes: list[tuple[Allocation | None, Allocation | None]] = []
        # One connection per Ledger: threads of this process take turns through the lock (cheaper
        # than each waiting on SQLite's file lock), other processes wait in SQLite's busy handler.
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Kernel ids, pids and credential hashes: the user's alone. SQLite gives the -wal and
        # -shm files the mode of the database file, so making that one private is enough.
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        if self.path.stat().st_mode & 0o077:
            self.path.chmod(0o600)
        self._connection = _open(self.path)
        self._devices: list[Device] = []
        self.set_devices(devices)

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- devices ---------------------------------------------------------------------------

    @property
    def devices(self) -> list[Device]:
        return list(self._devices)

    def set_devices(self, devices: list[Device]) -> list[Allocation]:
        """Take the devices of this machine now; returns allocations stranded on vanished ones.

        Stranded allocations are kept (their kernels may still run, and the device may come back)
        but count on no device; :meth:`reconcile` releases them once their kernels are gone. A
        device that is still here under another index keeps its slices and their index follows it.
        """
        uuids = [device.uuid for device in devices]
        indexes = [device.index for device in devices]
        if len(set(uuids)) != len(uuids) or len(set(indexes)) != len(indexes):
            raise ValueError(f"devices must have distinct UUIDs and indexes: {devices!r}")
        with self._decision() as db:
            for device in devices:
                db.execute(
                    "UPDATE allocations SET device_index = ? WHERE device_uuid = ? AND device_index != ?",
                    (device.index, device.uuid, device.index),
                )
            self._devices = sorted(devices, key=lambda device: device.index)
        stranded = self.stranded_allocations()
        for allocation in stranded:
            log.warning(
                "kernel %s holds a %s slice on GPU %s (%s), which is no longer on this machine; it stays "
                "in the ledger until the kernel is gone",
                allocation.kernel_id,
                format_size(allocation.memory_limit),
                allocation.device_index,
                allocation.device_uuid,
            )
        return stranded

    def stranded_allocations(self) -> list[Allocation]:
        """Allocations on devices that are not in the current device list (a pod's slice is on
        none of this machine's devices, and is not stranded for that)."""
        uuids = {device.uuid for device in self._devices}
        return [
            allocation
            for allocation in self.allocations()
            if allocation.holder == "local" and allocation.device_uuid not in uuids
        ]

    # -- reading ---------------------------------------------------------------------------

    def get(self, kernel_id: str) -> Allocation | None:
        with self._lock:
            row = self._connection.execute(
                f"SELECT {_COLUMNS} FROM allocations WHERE kernel_id = ?", (kernel_id,)
            ).fetchone()
        return None if row is None else _allocation(row)

    def allocations(self) -> list[Allocation]:
        """Every allocation, oldest first."""
        with self._lock:
            rows = self._connection.execute(
                f"SELECT {_COLUMNS} FROM allocations ORDER BY created_at, kernel_id"
            ).fetchall()
        return [_allocation(row) for row in rows]

    def devices_usage(self) -> list[DeviceUsage]:
        with self._lock:
            held = self._held(self._connection)
            unpromised = self._unpromised(self._connection)
        return self._usages(held, unpromised)

    # -- decisions -------------------------------------------------------------------------

    def decide_admission(self, admission: Admission) -> Allocation:
        """Place a slice for a kernel on ``device`` or where the placement policy puts it, within
        ``owner``'s ``budget`` (what all their slices may hold together).

        A slice held on this machine (``holder="local"``) is placed on its devices; one held
        elsewhere (a pod) is placed by the cluster's scheduler, so only this server's own limits
        (largest slice, memory and number of slices) apply and it takes no device's room."""
        kernel_id, limits, owner, device = admission.kernel_id, admission.limits, admission.owner, admission.device
        metadata, holder, budget = admission.metadata, admission.holder, admission.budget
        self._check_max_slice(limits)
        local = holder == "local"
        named = None if device is None or not local else select_device(self._devices, device)
        metadata_text = json.dumps(metadata or {})
        with self._decision() as db:
            existing = self._get(db, kernel_id)
            if existing is not None:
                raise SliceExists(
                    f"a slice for kernel {kernel_id!r} already exists ({format_size(existing.memory_limit)} on "
                    f"GPU {existing.device_index}); resize or release it instead"
                )
            held = self._held(db)
            self._check_server_slices(held.slices)
            self._check_server_memory(held.memory, limits.memory_limit)
            if budget is not None:
                _check_budget(budget, self._owned(db, owner), limits, new=True)
            usages = self._usages(held, self._unpromised(db) if local else {})
            if named is not None:
                usages = [usage for usage in usages if usage.device.uuid == named.uuid]
            chosen = self._place(limits, usages, named=named is not None) if local else None
            allocation = Allocation(
                kernel_id=kernel_id,
                device_uuid=chosen.uuid if chosen else "",
                device_index=chosen.index if chosen else -1,
                memory_limit=limits.memory_limit,
                sm_share=limits.sm_share,
                policy=limits.policy,
                owner=owner,
                created_at=time.time(),
                metadata=json.loads(metadata_text),  # what get() will return: JSON, not the caller's objects
                holder=holder,
            )
            db.execute(
                f"INSERT INTO allocations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    allocation.kernel_id,
                    allocation.device_uuid,
                    allocation.device_index,
                    allocation.memory_limit,
                    allocation.sm_share,
                    allocation.policy,
                    allocation.owner,
                    allocation.created_at,
                    metadata_text,
                    allocation.holder,
                    allocation.node,
                ),
            )
            self._changes.append((None, allocation))
        return allocation

    def decide_resize(self, resizing: Resizing) -> Allocation:
        """Change a slice in place (a kernel does not move between devices while it runs).

        Only what grows is checked against capacity and against ``budget`` (its owner's), so a
        slice can always shrink, even on a device that is over-committed because it came back
        smaller after a restart, or for an owner whose budget was lowered meanwhile.
        """
        kernel_id, memory_limit, sm_share = resizing.kernel_id, resizing.memory_limit, resizing.sm_share
        policy, budget = resizing.policy, resizing.budget
        with self._decision() as db:
            current = self._get(db, kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            wanted = SliceLimits(
                current.memory_limit if memory_limit is None else memory_limit,
                current.sm_share if sm_share is None else sm_share,
                current.policy if policy is None else policy,
            )
            self._check_max_slice(wanted, current=current.limits)
            others = self._held(db, excluding=kernel_id)
            if wanted.memory_limit > current.memory_limit:
                self._check_server_memory(others.memory, wanted.memory_limit, resizing=kernel_id)
            if current.holder == "local":  # elsewhere, the holder checks what the cluster granted
                # Read as if the slice had its new cap already: what it holds up to that is its own.
                unpromised = self._unpromised(db, replace(current, memory_limit=wanted.memory_limit))
                self._check_resize_fits(kernel_id, current, wanted, others, unpromised)
            if budget is not None:
                owned = self._owned(db, current.owner, excluding=kernel_id)
                _check_budget(budget, owned, wanted, new=False, current=current.limits)
            resized = replace(current, memory_limit=wanted.memory_limit, sm_share=wanted.sm_share, policy=wanted.policy)
            db.execute(
                "UPDATE allocations SET memory_limit = ?, sm_share = ?, policy = ? WHERE kernel_id = ?",
                (resized.memory_limit, resized.sm_share, resized.policy, kernel_id),
            )
            self._changes.append((current, resized))
        return resized

    def release(self, kernel_id: str) -> Allocation | None:
        """Free a kernel's slice; returns what it held, or None if it held nothing."""
        with self._decision() as db:
            allocation = self._get(db, kernel_id)
            if allocation is not None:
                db.execute("DELETE FROM allocations WHERE kernel_id = ?", (kernel_id,))
                self._changes.append((allocation, None))
        return allocation

    def update_metadata(self, kernel_id: str, **fields) -> Allocation:
        """Merge ``fields`` into a slice's metadata (region path, pid, ... once they are known)."""
        with self._decision() as db:
            current = self._get(db, kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            updated = replace(current, metadata={**current.metadata, **fields})
            db.execute(
                "UPDATE allocations SET metadata = ? WHERE kernel_id = ?", (json.dumps(updated.metadata), kernel_id)
            )
        return updated

    def suspend(self, kernel_id: str, *, host_memory: int, details: dict[str, Any] | None = None) -> Allocation:
        """Mark a slice suspended (its processes checkpointed, their device memory released): from
        this decision on its memory and SM share are free on its device for other admissions and
        resizes, while the slice keeps its claim and counts against its owner's budget. What its
        processes still hold on the device counts as held beyond the promises (the reader sees a
        cap of 0), so memory a "suspended" slice still holds is never lent."""
        if host_memory < 0:
            raise ValueError(f"host_memory must be zero or more bytes, not {host_memory!r}")
        with self._decision() as db:
            current = self._get(db, kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            state = {**(details or {}), "host_memory": host_memory, "at": time.time()}
            suspended = replace(current, metadata={**current.metadata, SUSPENDED_KEY: state})
            db.execute(
                "UPDATE allocations SET metadata = ? WHERE kernel_id = ?", (json.dumps(suspended.metadata), kernel_id)
            )
        return suspended

    def resume(self, kernel_id: str) -> Allocation:
        """Admit a suspended slice on its device again (memory and share, against what the others
        hold now and what the device really holds); raises CapacityError, leaving it suspended,
        where it does not fit. A slice that is not suspended is returned as it is."""
        with self._decision() as db:
            current = self._get(db, kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            if not current.suspended:
                return current
            resumed = replace(current, metadata={**current.metadata, SUSPENDED_KEY: None})
            if current.holder == "local":
                # Read as if it were running again: what its processes hold is then its own.
                usage = next(
                    (
                        usage
                        for usage in self._usages(self._held(db), self._unpromised(db, resumed))
                        if usage.device.uuid == current.device_uuid
                    ),
                    None,
                )
                _check_resume_fits(current, usage)
            db.execute(
                "UPDATE allocations SET metadata = ? WHERE kernel_id = ?", (json.dumps(resumed.metadata), kernel_id)
            )
        return resumed

    def reconcile(self, is_alive: Callable[[Allocation], bool]) -> list[Allocation]:
        """Release every allocation whose kernel is gone (after a restart); returns the released.

        ``is_alive`` may be slow (it may ask a cluster), so it runs outside any transaction; a slice
        is then released only if it is still the one that was judged, not a new kernel that took
        the same id meanwhile.
        """
        dead = [allocation for allocation in self.allocations() if not is_alive(allocation)]
        released = []
        with self._decision() as db:
            for allocation in dead:
                deleted = db.execute(
                    "DELETE FROM allocations WHERE kernel_id = ? AND created_at = ?",
                    (allocation.kernel_id, allocation.created_at),
                ).rowcount
                if deleted:
                    released.append(allocation)
                    self._changes.append((allocation, None))
        return released

    # -- inside a decision -----------------------------------------------------------------

    @contextmanager
    def _decision(self) -> Iterator[sqlite3.Connection]:
        """One transaction that holds the write lock from its first read, so what it read is still
        true when it writes: the lock orders this process's threads, BEGIN IMMEDIATE other processes."""
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield self._connection
            except BaseException:
                self._changes.clear()
                self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")
            # Still under the lock: observers see the decisions in the order they were made.
            changes, self._changes = self._changes, []
            for before, after in changes:
                for observer in self.observers:
                    observer(before, after)

    @staticmethod
    def _get(db: sqlite3.Connection, kernel_id: str) -> Allocation | None:
        row = db.execute(f"SELECT {_COLUMNS} FROM allocations WHERE kernel_id = ?", (kernel_id,)).fetchone()
        return None if row is None else _allocation(row)

    @staticmethod
    def _held(db: sqlite3.Connection, excluding: str | None = None) -> _Held:
        rows = db.execute(
            "SELECT device_uuid, SUM(memory_limit), SUM(CASE policy WHEN 'hard' THEN sm_share ELSE 0 END),"
            " SUM(sm_share), COUNT(*) FROM allocations WHERE kernel_id IS NOT ?"
            # A suspended slice's room is lent to the others (its owner's budget still counts it).
            f" AND json_extract(metadata, '$.{SUSPENDED_KEY}') IS NULL GROUP BY device_uuid",
            (excluding,),
        ).fetchall()
        by_device = {uuid: tuple(sums) for uuid, *sums in rows}
        return _Held(
            by_device=by_device,
            memory=sum(sums[0] for sums in by_device.values()),
            slices=sum(sums[3] for sums in by_device.values()),
        )

    @staticmethod
    def _owned(db: sqlite3.Connection, owner: str, excluding: str | None = None) -> tuple[int, int, int]:
        """What ``owner``'s slices hold together: (memory, share, slices)."""
        memory, share, slices = db.execute(
            "SELECT COALESCE(SUM(memory_limit), 0), COALESCE(SUM(sm_share), 0), COUNT(*) FROM allocations"
            " WHERE owner = ? AND kernel_id IS NOT ?",
            (owner, excluding),
        ).fetchone()
        return memory, share, slices

    def _unpromised(self, db: sqlite3.Connection, changed: Allocation | None = None) -> Mapping[str, UnpromisedMemory]:
        """What each device holds beyond the promises, by the reader; ``changed`` stands in for
        its own row (a resize's slice at its new cap)."""
        if self.reader is None:
            return {}
        rows = db.execute(f"SELECT {_COLUMNS} FROM allocations").fetchall()
        allocations = [_allocation(row) for row in rows]
        if changed is not None:
            allocations = [changed if a.kernel_id == changed.kernel_id else a for a in allocations]
        # A suspended slice is promised nothing on its device: whatever its processes still hold
        # there is beyond the promises, and not lent.
        allocations = [replace(a, memory_limit=0) if a.suspended else a for a in allocations]
        return self.reader(allocations)

    def _usages(self, held: _Held, unpromised: Mapping[str, UnpromisedMemory]) -> list[DeviceUsage]:
        usages = []
        for device in self._devices:
            memory, hard_share, total_share, slices = held.by_device.get(device.uuid, (0, 0, 0, 0))
            capacity = max(0, device.memory_total - self.reserve)
            seen = unpromised.get(device.uuid, UnpromisedMemory())
            usages.append(
                DeviceUsage(
                    device=device,
                    memory_capacity=capacity,
                    memory_allocated=memory,
                    memory_free=max(0, capacity - memory - seen.total),
                    hard_share=hard_share,
                    total_share=total_share,
                    share_capacity=self.share_capacity,
                    slices=slices,
                    memory_outside=seen.outside,
                    memory_over_cap=seen.over_cap,
                )
            )
        return usages

    def _place(self, limits: SliceLimits, usages: list[DeviceUsage], *, named: bool) -> Device:
        fitting = [usage for usage in usages if usage.fits(limits)]
        if not fitting:
            raise _no_room(limits, usages, named=named)
        if self.placement == "binpack":
            # Fill the fullest device that still fits, keeping big holes for big slices.
            chosen = min(fitting, key=lambda usage: (usage.memory_free, usage.device.index))
        else:
            chosen = min(fitting, key=lambda usage: (-usage.memory_free, usage.device.index))
        return chosen.device

    def _check_max_slice(self, limits: SliceLimits, current: SliceLimits | None = None) -> None:
        """Refuse a slice without a memory cap or above the server's largest; a resize is held to
        the largest only where it grows."""
        if limits.memory_limit <= 0:
            raise SliceValueError("a slice needs a memory cap of more than zero bytes")
        limits.check_within(self.max_slice, current)

    def _check_server_slices(self, held_slices: int) -> None:
        limit = self.server_slice_limit
        if limit is not None and held_slices >= limit:
            raise CapacityError(
                f"this server allows at most {limit} GPU slices and all {held_slices} are in use; "
                "stop a kernel that holds one first",
                resource="slices",
                requested=1,
                available=max(0, limit - held_slices),
            )

    def _check_server_memory(self, held_memory: int, wanted: int, resizing: str | None = None) -> None:
        limit = self.server_memory_limit
        if limit is None or held_memory + wanted <= limit:
            return
        free = max(0, limit - held_memory)
        if resizing is None:
            situation = f"{format_size(held_memory)} is held"
            advice = f"ask for at most {format_size(free)}, or stop a kernel" if free else "stop a kernel first"
            subject = f"cannot admit a slice of {format_size(wanted)}"
        else:
            situation = f"the other slices hold {format_size(held_memory)}"
            advice = f"it can grow to at most {format_size(free)}, or stop another kernel"
            subject = f"kernel {resizing!r} cannot grow to {format_size(wanted)}"
        raise CapacityError(
            f"{subject}: this server's slices may hold {format_size(limit)} of GPU memory in all and "
            f"{situation}; {advice}",
            resource="server_memory",
            requested=wanted,
            available=free,
        )

    def _check_resize_fits(
        self,
        kernel_id: str,
        current: Allocation,
        wanted: SliceLimits,
        others: _Held,
        unpromised: Mapping[str, UnpromisedMemory],
    ) -> None:
        grows = (
            wanted.memory_limit > current.memory_limit,
            wanted.hard_share > current.limits.hard_share,
            wanted.sm_share > current.sm_share,
        )
        if not any(grows):
            return
        usage = next(
            (usage for usage in self._usages(others, unpromised) if usage.device.uuid == current.device_uuid), None
        )
        if usage is None:
            raise _device_gone(current, "its slice can shrink but not grow")
        gpu = _gpu(usage.device)
        if grows[0] and wanted.memory_limit > usage.memory_free:
            raise CapacityError(
                f"kernel {kernel_id!r} cannot grow to {format_size(wanted.memory_limit)} of GPU memory: {gpu} "
                f"has {format_size(max(0, usage.memory_free - current.memory_limit))} free beyond the slice's "
                f"{format_size(current.memory_limit)}{unpromised_note(usage)}; it can grow to at most {format_size(usage.memory_free)}, "
                "or stop another kernel on that GPU",
                resource="memory",
                requested=wanted.memory_limit,
                available=usage.memory_free,
            )
        most = usage.share_free(wanted.policy)
        if (grows[1] or grows[2]) and wanted.sm_share > most:
            raise CapacityError(
                f"kernel {kernel_id!r} cannot have {wanted.sm_share}% of the SMs of {gpu} as a {wanted.policy} "
                f"slice: the other slices leave {most}%; ask for at most {most}%, or stop another kernel on "
                "that GPU",
                resource="sm_share",
                requested=wanted.sm_share,
                available=most,
            )


def _device_gone(current: Allocation, consequence: str) -> CapacityError:
    return CapacityError(
        f"kernel {current.kernel_id!r} is on GPU {current.device_index} ({current.device_uuid}), which is no "
        f"longer on this machine; {consequence}",
        resource="devices",
        requested=1,
        available=0,
    )


def _check_resume_fits(current: Allocation, usage: DeviceUsage | None) -> None:
    """Refuse to resume a suspended slice where its device has no room for it now."""
    kernel_id, memory = current.kernel_id, format_size(current.memory_limit)
    if usage is None:
        raise _device_gone(current, "it cannot resume")
    gpu = _gpu(usage.device)
    if usage.memory_free < current.memory_limit:
        raise CapacityError(
            f"kernel {kernel_id!r} cannot resume yet: its {memory} slice needs {memory} on {gpu}, which has "
            f"{format_size(usage.memory_free)} free{unpromised_note(usage)}; it resumes when "
            f"{format_size(current.memory_limit - usage.memory_free)} more is free",
            resource="memory",
            requested=current.memory_limit,
            available=usage.memory_free,
        )
    most = usage.share_free(current.policy)
    if most < current.sm_share:
        raise CapacityError(
            f"kernel {kernel_id!r} cannot resume yet: its {current.sm_share}% {current.policy} share of {gpu}'s "
            f"SMs does not fit, the other slices leave {most}%",
            resource="sm_share",
            requested=current.sm_share,
            available=most,
        )


def _check_budget(
    budget: OwnerBudget,
    owned: tuple[int, int, int],
    wanted: SliceLimits,
    *,
    new: bool,
    current: SliceLimits | None = None,
) -> None:
    """Refuse what would take an owner's slices past their budget. ``owned`` is what the owner's
    other slices hold; on a resize only what grows is checked (a budget lowered meanwhile
    never forces a slice to shrink)."""
    memory, share, slices = owned
    if new and budget.slices is not None and slices >= budget.slices:
        raise CapacityError(
            f"{budget.label} allows {budget.slices} GPU slice{'s' if budget.slices != 1 else ''} at once and "
            f"all {slices} are in use; stop one of your kernels first",
            resource="user_slices",
            requested=1,
            available=max(0, budget.slices - slices),
        )
    if budget.policy == "burst" and wanted.policy == "hard" and (current is None or current.policy != "hard"):
        raise SliceValueError(
            f"{budget.label} gives burst slices, not hard ones (a hard share is a promise others pay for); "
            "ask for policy burst"
        )
    had_memory, had_share = (None, None) if current is None else (current.memory_limit, current.sm_share)
    checks: tuple[tuple[str, int | None, int, int, int | None, Callable[[int], str]], ...] = (
        ("user_memory", budget.memory, memory, wanted.memory_limit, had_memory, format_size),
        ("user_sm_share", budget.sm_share, share, wanted.sm_share, had_share, _percent),
    )
    for resource, limit, held, asked, had, show in checks:
        grows = had is None or asked > had
        if not grows or limit is None or held + asked <= limit:
            continue
        free = max(0, limit - held)
        others = f"your other slices hold {show(held)}" if held else "you hold no other slice"
        advice = f"ask for at most {show(free)}, or stop a kernel" if free else "stop one of your kernels first"
        what = f"{show(asked)} of GPU memory" if resource == "user_memory" else f"an SM share of {show(asked)}"
        raise CapacityError(
            f"{what} does not fit in {budget.label}: it allows {show(limit)} for all your slices together and "
            f"{others}; {advice}",
            resource=resource,
            requested=asked,
            available=free,
        )


def unpromised_note(usage: DeviceUsage) -> str:
    """`` (and 2GiB in use outside any slice)``: why a device has less free than its promises
    leave, where it does."""
    parts = []
    if usage.memory_outside:
        parts.append(f"{format_size(usage.memory_outside)} in use outside any slice")
    if usage.memory_over_cap:
        parts.append(f"{format_size(usage.memory_over_cap)} held by slices over their caps")
    return f" (besides {' and '.join(parts)})" if parts else ""


def _percent(value: int) -> str:
    return f"{value}%"


def _either(options: list[str]) -> str:
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])}, or {options[-1]}"


def _no_room(limits: SliceLimits, usages: list[DeviceUsage], *, named: bool) -> CapacityError:
    """The refusal of a slice that fits on none of ``usages``: what is short, where, and what to ask."""
    if not usages:
        return CapacityError("this server has no GPU to place a slice on", resource="devices", requested=1, available=0)
    memory = format_size(limits.memory_limit)
    share_word = f"of its SMs free for a {limits.policy} slice"
    with_share = [usage for usage in usages if usage.share_free(limits.policy) >= limits.sm_share]
    with_memory = [usage for usage in usages if usage.memory_free >= limits.memory_limit]
    if not with_memory:
        # Suggest the most memory on a device where the share fits as well, if there is one.
        best = max(with_share or usages, key=lambda usage: (usage.memory_free, -usage.device.index))

        def describe(usage: DeviceUsage) -> str:
            short_share = "" if usage in with_share else f" (but only {usage.share_free(limits.policy)}% {share_word})"
            holder = "it" if named else _gpu(usage.device)
            return f"{holder} has {format_size(usage.memory_free)}{short_share}{unpromised_note(usage)}"

        subject = f"{_gpu(usages[0].device)} does not have" if named else "no device has"
        if best.memory_free == 0:
            advice = "stop a kernel to free some"
        elif best in with_share:
            advice = f"ask for at most {format_size(best.memory_free)}, or stop a kernel"
        else:
            advice = (
                f"ask for at most {format_size(best.memory_free)} and {best.share_free(limits.policy)}%, "
                "or stop a kernel"
            )
        return CapacityError(
            f"{subject} {memory} of GPU memory free: {', '.join(map(describe, usages))} free; {advice}",
            resource="memory",
            requested=limits.memory_limit,
            available=best.memory_free,
        )
    best = max(with_memory, key=lambda usage: (usage.share_free(limits.policy), -usage.device.index))
    most = best.share_free(limits.policy)
    free = ", ".join(
        f"{'it' if named else _gpu(usage.device)} has {usage.share_free(limits.policy)}%" for usage in with_memory
    )
    subject = f"{_gpu(usages[0].device)} does not have" if named else f"no device with {memory} of GPU memory free has"
    options = [f"ask for at most {most}%"] if most else []
    if limits.policy == "hard" and any(usage.share_free("burst") >= limits.sm_share for usage in with_memory):
        options.append("ask for a burst slice")
    options.append("stop a kernel" if options else "stop a kernel to free some")
    return CapacityError(
        f"{subject} {limits.sm_share}% {share_word}: {free}; {_either(options)}",
        resource="sm_share",
        requested=limits.sm_share,
        available=most,
    )
