"""The pool's policy as a server's room-making applies it (ledger/policy.py; issue 34 items 2 and
5): only a kernel known to run no cell makes room (an adopted kernel whose execution state the
server has not learnt counts as busy), and a kernel that just got its room is held for
``VGPUApp.room_hold`` seconds. SuspendedKernels over a real EmbeddedLedger and a kernel manager
that knows each kernel's state; suspends are the ledger's decision only (no processes here)."""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from jupyter_vgpu.ledger import SUSPEND_TIMINGS_KEY, SUSPENDED_KEY, Allocation, CapacityError, EmbeddedLedger
from jupyter_vgpu.ledger.policy import RESUMED_AT, Idle, got_room_at, room_order
from jupyter_vgpu.line import Line, Request
from jupyter_vgpu.manager import ADOPTED_KEY, IN_LINE_KEY, RoomWanted
from jupyter_vgpu.model import Device, SliceLimits
from jupyter_vgpu.server.room import activity_of
from jupyter_vgpu.server.suspend import SuspendedKernels

GIB = 1 << 30
GPU = Device(
    uuid="GPU-00000000-0000-4000-8000-000000000000", index=0, name="test GPU", memory_total=8 * GIB, sm_count=100
)


@dataclass
class Kernel:
    """What room-making reads of a kernel (jupyter_server's kernel object)."""

    execution_state: str
    last_activity: datetime.datetime


class Kernels(dict):
    def get_kernel(self, kernel_id: str) -> Kernel:
        return self[kernel_id]


class Slices:
    """The slice manager as far as room-making goes: the ledger, usage (each kernel holds 1 GiB on
    the GPU), and a suspend that is the ledger's decision alone."""

    def __init__(self, ledger: EmbeddedLedger):
        self.ledger = ledger

    def status(self, allocation):
        return SimpleNamespace(usage=SimpleNamespace(memory_used=GIB))

    def suspend(self, kernel_id: str, *, lock_timeout: float):
        return self.ledger.suspend(kernel_id, host_memory=GIB)

    def get(self, kernel_id: str):
        return self.ledger.get(kernel_id)

    def resume(self, kernel_id: str):
        """No room: a resume waits in line."""
        raise CapacityError("no room for it yet", resource="memory", requested=4 * GIB, available=0)


@pytest.fixture
def ledger(tmp_path):
    ledger = EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU])
    yield ledger
    ledger.close()


def room_for_four_gib(ledger: EmbeddedLedger) -> RoomWanted:
    def fits() -> bool:
        return ledger.devices_usage()[0].memory_free >= 4 * GIB

    return RoomWanted(fits, GPU.uuid, "a new kernel")


def an_hour_ago() -> datetime.datetime:
    return datetime.datetime.fromtimestamp(time.time() - 3600, datetime.timezone.utc)


@pytest.mark.parametrize(("state", "adopted"), [("starting", True), ("busy", False), ("", False), ("unknown", False)])
def test_room_making_suspends_no_kernel_whose_execution_state_is_not_known_to_be_idle(ledger, state, adopted):
    """A restarted server's adopted kernel that ran a cell read "starting" and was suspended to
    make room as if idle. Only a kernel known to run no cell makes room: "idle", or "starting" in
    one this server watched from its start; it reports any other state to a broker as busy."""
    kernels = Kernels()
    for kernel_id in ("a", "b"):
        ledger.admit(kernel_id, SliceLimits(4 * GIB, 10))
        kernels[kernel_id] = Kernel(state, an_hour_ago())
        if adopted:
            ledger.update_metadata(kernel_id, **{ADOPTED_KEY: {"at": time.time(), "server": {}}})
    room = SuspendedKernels(Slices(ledger), kernels, hold=0.0)

    assert asyncio.run(room.make_room(room_for_four_gib(ledger))) is False
    assert not any(allocation.suspended for allocation in ledger.allocations())
    reported = activity_of(kernels["a"], ledger.get("a"))
    assert reported == {"last_activity": kernels["a"].last_activity.timestamp(), "busy": True}

    kernels["b"].execution_state = "idle"  # known idle: it makes the room
    assert asyncio.run(room.make_room(room_for_four_gib(ledger))) is True
    assert [allocation.kernel_id for allocation in ledger.allocations() if allocation.suspended] == ["b"]


def test_a_kernel_this_server_started_and_nobody_opened_makes_room_as_an_idle_one(ledger):
    """ "starting" until a client first talks to it: every cell's "busy" would have reached the
    server, which watched it from its start (jupyter_server's own culler counts it idle too)."""
    ledger.admit("never-opened", SliceLimits(4 * GIB, 10))
    ledger.admit("other", SliceLimits(4 * GIB, 10))
    kernels = Kernels(never_opened=Kernel("starting", an_hour_ago()))
    kernels["never-opened"] = kernels.pop("never_opened")
    room = SuspendedKernels(Slices(ledger), kernels, hold=0.0)
    assert asyncio.run(room.make_room(room_for_four_gib(ledger))) is True
    assert ledger.get("never-opened").suspended
    assert activity_of(kernels["never-opened"], ledger.get("other"))["busy"] is False


def test_a_kernel_that_just_got_its_room_is_not_suspended_for_another_within_the_hold(ledger):
    """A kernel admitted a moment ago is left alone for VGPUApp.room_hold seconds: the request
    waits in line meanwhile instead of taking the room back and forth (issue 34 item 2)."""
    kernels = Kernels()
    for kernel_id in ("a", "b"):
        ledger.admit(kernel_id, SliceLimits(4 * GIB, 10))
        kernels[kernel_id] = Kernel("idle", an_hour_ago())

    held = SuspendedKernels(Slices(ledger), kernels, hold=600.0)
    assert asyncio.run(held.make_room(room_for_four_gib(ledger))) is False
    assert not any(allocation.suspended for allocation in ledger.allocations())

    not_held = SuspendedKernels(Slices(ledger), kernels, hold=0.0)
    assert asyncio.run(not_held.make_room(room_for_four_gib(ledger))) is True


def test_the_hold_counts_from_a_kernels_last_resume_as_from_its_start():
    now = 10_000.0

    def slice_(kernel_id: str, created_at: float, resumed_at: float | None = None) -> Allocation:
        metadata = {} if resumed_at is None else {SUSPEND_TIMINGS_KEY: {"resume": 0.1, RESUMED_AT: resumed_at}}
        return Allocation(kernel_id, GPU.uuid, 0, 4 * GIB, 10, "hard", "", created_at, metadata)

    allocations = [
        slice_("resumed", now - 3600, resumed_at=now - 5),
        slice_("started", now - 5),
        slice_("old", now - 3600),
    ]
    assert got_room_at(allocations[0]) == now - 5

    def idle(allocation: Allocation) -> Idle:
        return Idle(last_active=now - 3600, uses_gpu=True)

    assert [item.kernel_id for item in room_order(allocations, GPU.uuid, "", idle, now=now, hold=60)] == ["old"]
    assert len(room_order(allocations, GPU.uuid, "", idle, now=now, hold=0)) == 3


class Requests:
    """A suspended slice's processes' resume requests, as its region counts them, and the
    Suspender's reading of them (holders/suspender.py: what a suspend or an interrupt answered)."""

    def __init__(self, ledger: EmbeddedLedger):
        self.ledger = ledger
        self.count = 0

    def resume_requested(self, allocation) -> bool:
        return self.count > int(allocation.metadata[SUSPENDED_KEY].get("resume_requests", 0))

    def answer_requests(self, allocation, **fields):
        state = {**allocation.metadata[SUSPENDED_KEY], "resume_requests": self.count}
        return self.ledger.update_metadata(allocation.kernel_id, **{SUSPENDED_KEY: state}, **fields)


def test_an_interrupted_wait_stays_out_of_the_line_until_the_next_cell_asks(ledger):
    """Issue 34 item 3: Interrupt took the request out of the line and it rejoined 41 ms later,
    the status bar keeping "1st in line": the watcher's pass used the ledger as it read it before
    the interrupt (the cell still busy, so "a cell runs" lined it up again). Nothing lines it up
    while the interrupted cell ends, nor a call it makes meanwhile; its next cell does."""
    ledger.admit("k", SliceLimits(4 * GIB, 10))
    ledger.suspend("k", host_memory=GIB, details={"resume_requests": 0})
    kernels = Kernels(k=Kernel("busy", an_hour_ago()))  # its cell waits for room
    slices = Slices(ledger)
    slices.line = Line()
    slices.suspender = requests = Requests(ledger)
    room = SuspendedKernels(slices, kernels, hold=0.0)

    before_the_interrupt = ledger.allocations()  # the watcher's read at the start of its tick
    requests.count = 1  # the waiting call asked
    # Kernel > Interrupt (SliceManager.leave_line): out of the line, what was asked is answered.
    requests.answer_requests(ledger.get("k"), **{IN_LINE_KEY: {"left": time.time()}})
    asyncio.run(room.check(before_the_interrupt))
    assert "k" not in slices.line

    requests.count = 2  # the interrupted cell still ends, and calls again
    asyncio.run(room.check(ledger.allocations()))
    assert "k" not in slices.line

    kernels["k"].execution_state = "idle"  # it ended
    asyncio.run(room.check(ledger.allocations()))
    asyncio.run(room.check(ledger.allocations()))
    assert "k" not in slices.line and ledger.get("k").metadata.get(IN_LINE_KEY) is None

    kernels["k"].execution_state = "busy"  # the next cell
    asyncio.run(room.check(ledger.allocations()))
    assert slices.line.get("k").kind == "resume"


def test_a_kernel_that_begins_a_cell_while_room_is_being_made_is_not_suspended(ledger):
    """The candidates are chosen before the first suspend, which takes seconds: one that began a
    cell meanwhile runs it (issue 34 item 2: never suspend a kernel running a cell to make room)."""
    kernels = Kernels()
    for kernel_id in ("a", "b"):
        ledger.admit(kernel_id, SliceLimits(4 * GIB, 10))
        kernels[kernel_id] = Kernel("idle", an_hour_ago())

    class CellBeginsMeanwhile(Slices):
        def suspend(self, kernel_id: str, *, lock_timeout: float):
            kernels["b" if kernel_id == "a" else "a"].execution_state = "busy"
            return super().suspend(kernel_id, lock_timeout=lock_timeout)

    def room_for_all_eight() -> RoomWanted:
        return RoomWanted(lambda: ledger.devices_usage()[0].memory_free >= 8 * GIB, GPU.uuid, "a new kernel")

    room = SuspendedKernels(CellBeginsMeanwhile(ledger), kernels, hold=0.0)
    assert asyncio.run(room.make_room(room_for_all_eight())) is False
    assert [allocation.kernel_id for allocation in ledger.allocations() if allocation.suspended] == ["a"]


def test_the_estimate_counts_the_hold_on_a_kernel_that_just_got_its_room(ledger, monkeypatch):
    """A request whose room only a kernel admitted a moment ago can make waits for the hold to end
    first: the estimate says so (it said the suspend's time alone)."""
    admitted = ledger.admit("fresh", SliceLimits(8 * GIB, 10)).created_at
    monkeypatch.setattr(time, "time", lambda: admitted + 100)  # the server's clock, 100 s after
    kernels = Kernels(fresh=Kernel("idle", an_hour_ago()))
    short = CapacityError("no room", resource="memory", requested=4 * GIB, available=0)
    request = Request("new", "start", 4 * GIB, 10, GPU.uuid, None, short=short)  # type: ignore[arg-type]

    estimates = {}
    for hold in (0.0, 600.0):
        room = SuspendedKernels(Slices(ledger), kernels, hold=hold)
        room.suspend_seconds_per_byte = 1 / GIB  # 1 s for the GiB it holds
        estimates[hold] = room.estimate(request)
    assert estimates == {0.0: 1.0, 600.0: 501.0}  # the hold's remaining 500 s, then the suspend
