"""Guarantees and borrowing through the ledger service (issue 25, item 4), the broker's rules: a
start or resume past its owner's guarantee is marked as borrowing and takes only room no kernel
within its guarantee is owed, making none; one within its guarantee that does not fit, where idle
kernels cannot make the room, has the most recent borrowing kernel asked to give its room back
even while it runs a cell, and that room is held for it. Real handlers, real HTTP on 127.0.0.1, a
real EmbeddedLedger; the servers' side and the paused cell run in tests/hub/test_borrowing_hub.py."""

from __future__ import annotations

import pytest

from jupyter_vgpu.ledger import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    TAKE_BACK_KEY,
    CapacityError,
    EmbeddedLedger,
    OwnerBudget,
)
from jupyter_vgpu.ledger.broker_line import BrokerLine
from jupyter_vgpu.ledger.edge import Caller, Refusal
from jupyter_vgpu.ledger.lending import Lending
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits, SliceValueError

GIB = 1 << 30
PREFIX = "/services/vgpu/ledger"
# Guaranteed 4 GiB and 20 %, up to 12 GiB and 60 % where nobody within a guarantee needs it.
SIZE = OwnerBudget(memory=12 * GIB, sm_share=60, label="the size", guaranteed_memory=4 * GIB, guaranteed_sm_share=20)
FOUR = SliceLimits(4 * GIB, 10, "burst")


class ClassroomGate:
    """Each token is its user's; everyone has SIZE."""

    async def caller(self, request, credential: str) -> Caller:
        if not credential.endswith("-token"):
            raise Refusal(403, "not a token of this test", "Forbidden")
        return Caller(credential.removesuffix("-token"))

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        return SIZE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def classroom(service_loop, ledger_path, gpu):
    """(client per user, the Lending's take-back calls, its clock, the EmbeddedLedger): one 12 GiB GPU."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    taken: list[tuple[str, bool]] = []
    clock = Clock()
    lending = Lending(
        make_room=True, clock=clock, on_take_back=lambda allocation, asked: taken.append((allocation.kernel_id, asked))
    )
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=lending))
    clients = {name: RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in ("alice", "bob")}
    yield clients, taken, clock, ledger
    for client in clients.values():
        client.close()
    server.stop()
    ledger.close()


def busy(client: RemoteLedger, kernel_id: str, at: float) -> None:
    """What the kernel's server reports while it runs a cell."""
    client.update_metadata(kernel_id, **{ACTIVITY_KEY: {"last_activity": at, "busy": True, "uses_gpu": True}})


def test_a_start_past_the_guarantee_borrows_only_free_room_and_makes_none(classroom):
    clients, taken, clock, _ = classroom
    alice, bob = clients["alice"], clients["bob"]
    assert BORROWING_KEY not in bob.admit("b1", FOUR).metadata  # within his 4 GiB
    clock.now += 1
    assert bob.admit("b2", FOUR).metadata[BORROWING_KEY] == {"at": clock.now}  # 8 GiB: 4 borrowed
    # Whose room is taken back first is the broker's to say: no owner unmarks (or marks) a slice.
    with pytest.raises(SliceValueError, match="'borrowing' is set by the service"):
        bob.update_metadata("b2", **{BORROWING_KEY: None})
    assert BORROWING_KEY not in alice.admit("a1", FOUR, metadata={BORROWING_KEY: {"at": 0}}).metadata
    alice.update_metadata("a1", **{ACTIVITY_KEY: {"last_activity": 0.0, "busy": False, "uses_gpu": True}})

    # The GPU is full; alice's kernel is idle. A borrower's start does not have it suspended.
    with pytest.raises(CapacityError) as refused:
        bob.admit("b3", FOUR)
    assert refused.value.making_room == ""
    assert alice.get("a1").metadata.get(SUSPEND_REQUESTED_KEY) is None
    assert taken == []


def test_a_start_within_the_guarantee_takes_back_the_most_recent_borrowers_room_even_mid_cell_and_holds_it(
    classroom,
):
    clients, taken, clock, ledger = classroom
    alice, bob = clients["alice"], clients["bob"]
    for kernel_id in ("b1", "b2", "b3"):  # 4 GiB within his guarantee, then two borrowing, b3 the latest
        clock.now += 1
        bob.admit(kernel_id, FOUR)
        busy(bob, kernel_id, clock.now)

    with pytest.raises(CapacityError) as refused:
        alice.admit("a1", FOUR)
    assert "room borrowed above a guarantee on GPU 0 is being taken back for it" in refused.value.making_room
    request = bob.get("b3").metadata[SUSPEND_REQUESTED_KEY]
    assert request[TAKE_BACK_KEY] is True and request["at"] == clock.now
    assert bob.get("b2").metadata.get(SUSPEND_REQUESTED_KEY) is None
    assert taken == [("b3", True)]
    # Running a cell does not withdraw it (an idle kernel's request is withdrawn when it runs).
    busy(bob, "b3", clock.now + 1)
    assert bob.get("b3").metadata[SUSPEND_REQUESTED_KEY][TAKE_BACK_KEY] is True
    # Alice's retries wait for the same kernel: nobody else is asked.
    with pytest.raises(CapacityError):
        alice.admit("a1", FOUR)
    assert bob.get("b2").metadata.get(SUSPEND_REQUESTED_KEY) is None and taken == [("b3", True)]

    # Bob's server suspends it: the room is alice's, not a borrower's.
    bob.suspend("b3", host_memory=GIB)
    with pytest.raises(CapacityError, match="held for a kernel within its owner's guarantee"):
        bob.resume("b3")
    assert alice.admit("a1", FOUR).metadata.get(BORROWING_KEY) is None
    # Alice has her room; bob's resume waits for free room and makes none for itself.
    alice.update_metadata("a1", **{ACTIVITY_KEY: {"last_activity": 0.0, "busy": False, "uses_gpu": True}})
    with pytest.raises(CapacityError) as waiting:
        bob.resume("b3")
    assert waiting.value.making_room == "" and alice.get("a1").metadata.get(SUSPEND_REQUESTED_KEY) is None
    alice.release("a1")
    clock.now += 1
    resumed = bob.resume("b3")
    assert not resumed.suspended and resumed.metadata[BORROWING_KEY] == {"at": clock.now}
    assert ledger.get("b3").metadata.get(SUSPEND_REQUESTED_KEY) is None


def test_a_take_back_its_server_does_not_carry_out_lapses_and_its_kernel_runs_on(classroom):
    clients, taken, clock, ledger = classroom
    alice, bob = clients["alice"], clients["bob"]
    for kernel_id in ("b1", "b2", "b3"):
        bob.admit(kernel_id, FOUR)
    with pytest.raises(CapacityError):
        alice.admit("a1", FOUR)
    assert taken == [("b3", True)]
    lending = Lending(make_room=True, clock=clock)  # the broker's periodic check, on the same ledger
    assert lending.lapse_take_backs(ledger) == []
    clock.now += SUSPEND_REQUEST_TIMEOUT_S + 1
    assert [allocation.kernel_id for allocation in lending.lapse_take_backs(ledger)] == ["b3"]
    assert ledger.get("b3").metadata.get(SUSPEND_REQUESTED_KEY) is None


def test_where_no_budget_guarantees_less_than_it_allows_nothing_is_borrowing_nor_taken_back(
    service_loop, ledger_path, gpu
):
    """A server's own embedded ledger, or a classroom size without borrow: (no guarantee below the
    budget) admits as before, and only idle kernels make room."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    lending = Lending(make_room=True)
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, "one-token", lending=lending))
    client = RemoteLedger(server.url + PREFIX, "one-token", timeout=30)
    try:
        for kernel_id in ("k1", "k2", "k3"):
            assert BORROWING_KEY not in client.admit(kernel_id, FOUR, owner="bob").metadata
            busy(client, kernel_id, 1.0)
        with pytest.raises(CapacityError) as refused:
            client.admit("a1", FOUR, owner="alice")
        assert refused.value.making_room == ""
        assert all(SUSPEND_REQUESTED_KEY not in item.metadata for item in client.allocations())
    finally:
        client.close()
        server.stop()
        ledger.close()


def test_where_nothing_can_be_taken_back_the_room_that_frees_next_is_held_for_a_request_within_its_guarantee(
    service_loop, ledger_path, gpu
):
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=Lending(make_room=True)))
    names = ("bob", "carol", "dave", "erin")
    clients = {name: RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in names}
    try:
        for name in ("bob", "carol", "erin"):  # the GPU full, every kernel within its owner's guarantee
            clients[name].admit(f"{name}-1", FOUR)
        with pytest.raises(CapacityError) as refused:
            clients["dave"].admit("dave-1", FOUR)
        assert refused.value.making_room == ""  # no borrower to take room back from
        # Carol's room frees: dave's (his start retries), not bob's, who would borrow it.
        clients["carol"].release("carol-1")
        with pytest.raises(CapacityError, match="held for a kernel within its owner's guarantee"):
            clients["bob"].admit("bob-2", FOUR)
        assert clients["dave"].admit("dave-1", FOUR).metadata.get(BORROWING_KEY) is None
    finally:
        for client in clients.values():
            client.close()
        server.stop()
        ledger.close()


def test_in_the_nodes_line_a_request_within_its_guarantee_waits_behind_no_borrower(service_loop, ledger_path, gpu):
    """Bob's borrowing start asked first and waits in the node's line; alice's start within her
    guarantee, asked later, is not held behind it (it gets the room bob waits for), while carol's
    later borrowing start is."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    server = service_loop.serve(
        ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=Lending(make_room=True), line=BrokerLine())
    )
    clients = {
        name: RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in ("bob", "carol", "dave")
    }
    alice = RemoteLedger(server.url + PREFIX, "alice-token", timeout=30)
    bob, carol, dave = clients["bob"], clients["carol"], clients["dave"]
    try:
        bob.admit("b1", FOUR)  # within his guarantee
        carol.admit("c1", FOUR)
        dave.admit("d1", FOUR)  # the GPU is full
        size = {"kind": "start", "memory": FOUR.memory_limit, "sm_share": FOUR.sm_share, "device_uuid": None}
        bob.wait_in_line("b2", **size, since=1.0)  # past his guarantee: borrowing
        carol.wait_in_line("c2", **size, since=2.0)  # past hers too
        alice.wait_in_line("a1", **size, since=3.0)  # within hers
        dave.release("d1")  # room for one

        with pytest.raises(CapacityError, match="asked earlier") as held:
            carol.admit("c2", FOUR)  # a borrower behind an older borrower
        assert held.value.resource == "line"
        assert alice.admit("a1", FOUR).metadata.get(BORROWING_KEY) is None
    finally:
        for client in (*clients.values(), alice):
            client.close()
        server.stop()
        ledger.close()


class MixedSizesGate(ClassroomGate):
    """Bob's size borrows (SIZE); alice's does not: she is guaranteed all she may hold, 4 GiB."""

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        if caller.name == "alice":
            return OwnerBudget(
                memory=4 * GIB, sm_share=20, label="alice's size", guaranteed_memory=4 * GIB, guaranteed_sm_share=20
            )
        return SIZE


def test_a_student_whose_size_does_not_borrow_takes_her_guarantee_back_from_a_borrower(service_loop, ledger_path, gpu):
    """Issue 34 item 4: every size's guarantee is taken back from borrowers, not only a borrowing size's."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, MixedSizesGate(), lending=Lending(make_room=True)))
    alice, bob = (RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in ("alice", "bob"))
    try:
        for kernel_id in ("b1", "b2", "b3"):  # the GPU full: bob within his 4 GiB, then borrowing 8
            bob.admit(kernel_id, FOUR)
            busy(bob, kernel_id, 1.0)
        with pytest.raises(CapacityError) as refused:
            alice.admit("a1", FOUR)
        assert "room borrowed above a guarantee on GPU 0 is being taken back for it" in refused.value.making_room
        assert bob.get("b3").metadata[SUSPEND_REQUESTED_KEY][TAKE_BACK_KEY] is True
        bob.suspend("b3", host_memory=GIB)
        assert alice.admit("a1", FOUR).metadata.get(BORROWING_KEY) is None
    finally:
        alice.close()
        bob.close()
        server.stop()
        ledger.close()


def test_a_growth_takes_no_room_held_for_a_kernel_within_its_guarantee(service_loop, ledger_path, gpu):
    """Issue 34 item 3: a growth was granted by the ledger alone, into room taken back and held for
    a kernel within its owner's guarantee (or freed by the swap for a resume), as no start or
    resume may be."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=Lending(make_room=True)))
    names = ("alice", "bob", "dave")
    alice, bob, dave = (RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in names)
    try:
        bob.admit("b1", FOUR)  # within his guarantee
        bob.admit("b2", FOUR)  # borrowing
        dave.admit("d1", SliceLimits(2 * GIB, 10, "burst"))  # 2 GiB of the GPU left free
        with pytest.raises(CapacityError):
            alice.admit("a1", FOUR)  # b2 is asked to give its room back, held for her
        bob.suspend("b2", host_memory=GIB)  # 6 GiB free, 4 of them alice's
        with pytest.raises(CapacityError, match="held for a kernel within its owner's guarantee"):
            dave.resize("d1", memory_limit=6 * GIB)  # past his guarantee: it would borrow her room
        assert dave.get("d1").memory_limit == 2 * GIB
        assert alice.admit("a1", FOUR).metadata.get(BORROWING_KEY) is None
    finally:
        for client in (alice, bob, dave):
            client.close()
        server.stop()
        ledger.close()
