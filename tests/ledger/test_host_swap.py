"""The swap at the host memory cap (issue 25): where suspended kernels fill the broker's cap, a
suspended kernel whose cell wants to run gets room by an idle kernel's suspend, which may go past
the cap by at most the host memory that resume gives back (the two together add nothing once the
resume is done). The broker pairs them explicitly: its suspend request names the resumer, and the
allowance lasts only while the resumer is suspended and the request has not timed out; a suspend
nobody paired is refused at the cap as before. Borrowed room taken back for a resume within its
owner's guarantee is paired the same way. Real handlers, real HTTP on 127.0.0.1, a real
EmbeddedLedger, a served Lending as the broker's."""

from __future__ import annotations

import pytest
from test_service_borrowing import ClassroomGate

from jupyter_vgpu.ledger import (
    BORROWING_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    TAKE_BACK_KEY,
    CapacityError,
    EmbeddedLedger,
    NotSupported,
)
from jupyter_vgpu.ledger.base import ROOM_FOR_KEY
from jupyter_vgpu.ledger.broker_line import BrokerLine
from jupyter_vgpu.ledger.lending import Lending
from jupyter_vgpu.ledger.policy import waiting_for_room
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits

GIB = 1 << 30
PREFIX = "/services/vgpu/ledger"
TOKEN = "host-swap-token"
CAP = 8 * GIB


@pytest.fixture
def broker(service_loop, ledger_path, gpu):
    """A served ledger on one 16 GiB GPU with the broker's Lending (room-making, an 8 GiB host cap,
    a clock the test moves): (a RemoteLedger of it, the EmbeddedLedger behind it, the clock)."""
    now = [10_000.0]
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 16)])
    lending = Lending(make_room=True, host_memory_cap=CAP, clock=lambda: now[0])
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, TOKEN, lending=lending))
    client = RemoteLedger(server.url + PREFIX, TOKEN, timeout=30)
    yield client, ledger, now
    client.close()
    server.stop()
    ledger.close()


def idle(client: RemoteLedger, kernel_id: str, since: float) -> None:
    """What a user's server reports of an idle kernel that holds GPU memory (server/room.py)."""
    client.update_metadata(kernel_id, activity={"busy": False, "last_activity": since, "uses_gpu": True})


def in_host(ledger: EmbeddedLedger) -> int:
    return sum(allocation.host_memory for allocation in ledger.allocations())


def at_the_cap(client: RemoteLedger) -> None:
    """Two suspended kernels fill the 8 GiB cap ("waker" holds 6 GiB of it, "full" 2); "idle" (6 GiB,
    idle since 1000), "other" (4 GiB, idle since 2000) and "busy" (6 GiB) run in all the GPU's 16."""
    for kernel_id, gib in (("waker", 6), ("full", 2)):
        client.admit(kernel_id, SliceLimits(gib * GIB, 10))
        client.suspend(kernel_id, host_memory=gib * GIB)
    for kernel_id, gib, since in (("idle", 6, 1_000.0), ("other", 4, 2_000.0)):
        client.admit(kernel_id, SliceLimits(gib * GIB, 10))
        idle(client, kernel_id, since)
    client.admit("busy", SliceLimits(6 * GIB, 10))  # runs a cell: never asked


def paired_at_the_cap(client: RemoteLedger) -> None:
    """At the cap (at_the_cap), "waker" asks to resume: refused for now, and "idle" is asked to
    suspend to make room for it (the pairing whose allowance the tests probe)."""
    at_the_cap(client)
    with pytest.raises(CapacityError, match="1 idle kernel"):
        client.resume("waker")


def test_a_resume_at_the_cap_gets_room_by_an_idle_kernels_suspend(broker):
    client, ledger, _ = broker
    at_the_cap(client)
    assert in_host(ledger) == CAP
    with pytest.raises(CapacityError) as refused:
        client.resume("waker")
    assert refused.value.making_room.startswith("1 idle kernel on GPU 0 is being suspended")
    assert client.get("idle").metadata[SUSPEND_REQUESTED_KEY][ROOM_FOR_KEY] == "waker"
    assert client.get("other").metadata.get(SUSPEND_REQUESTED_KEY) is None

    # Its 5 GiB go to host memory past the cap, by less than the 6 GiB the resume gives back.
    assert client.suspend("idle", host_memory=5 * GIB).suspended
    assert in_host(ledger) == CAP + 5 * GIB <= CAP + client.get("waker").host_memory
    assert not client.resume("waker").suspended
    assert in_host(ledger) == 7 * GIB <= CAP


def test_a_paired_suspend_may_not_go_past_the_cap_by_more_than_the_resume_gives_back(broker):
    client, ledger, _ = broker
    paired_at_the_cap(client)
    # Its server reports more host memory than the pairing allows (8 + 7 > 8 + 6): refused.
    with pytest.raises(NotSupported, match=r"\(plus 6GiB that the resume it makes room for gives back\); its 7GiB"):
        client.suspend("idle", host_memory=7 * GIB)
    assert not client.get("idle").suspended and in_host(ledger) == CAP
    client.suspend("idle", host_memory=3 * GIB)
    # A second kernel paired to the same resume gets only what is left of the same allowance.
    ledger.update_metadata("other", **{SUSPEND_REQUESTED_KEY: {"at": 10_000.0, ROOM_FOR_KEY: "waker"}})
    with pytest.raises(NotSupported, match="would not fit"):
        client.suspend("other", host_memory=4 * GIB)  # 11 + 4 > 8 + 6
    assert client.suspend("other", host_memory=3 * GIB).suspended
    assert in_host(ledger) == CAP + 6 * GIB


def test_an_unpaired_suspend_is_still_refused_at_the_cap(broker):
    client, ledger, _ = broker
    at_the_cap(client)
    # A start (nothing to give back) asks nobody whose suspend the cap would refuse.
    with pytest.raises(CapacityError) as refused:
        client.admit("new", SliceLimits(8 * GIB, 10))
    assert not refused.value.making_room
    assert client.get("idle").metadata.get(SUSPEND_REQUESTED_KEY) is None
    with pytest.raises(NotSupported, match=r"may hold 8GiB together \(idle.suspend_host_memory\); its 1GiB"):
        client.suspend("idle", host_memory=GIB)
    # Nor may a client pair a suspend itself: only the broker sets the request.
    with pytest.raises(Exception, match="is set by the service"):
        client.update_metadata("idle", **{SUSPEND_REQUESTED_KEY: {"at": 10_000.0, ROOM_FOR_KEY: "waker"}})
    assert in_host(ledger) == CAP


def test_the_allowance_lapses_when_the_resume_does_not_happen_in_time(broker):
    client, ledger, now = broker
    paired_at_the_cap(client)
    now[0] += SUSPEND_REQUEST_TIMEOUT_S + 1  # the waker's server gave up; the request timed out
    with pytest.raises(NotSupported, match="would not fit"):
        client.suspend("idle", host_memory=GIB)
    assert in_host(ledger) == CAP


def test_the_allowance_ends_when_the_resumer_is_stopped(broker):
    client, ledger, _ = broker
    paired_at_the_cap(client)
    client.release("waker")  # stopped while it waited: its 6 GiB of host memory are freed
    with pytest.raises(NotSupported, match="would not fit"):
        client.suspend("idle", host_memory=7 * GIB)  # 2 + 7 > 8: the pairing allows nothing more
    assert client.suspend("idle", host_memory=6 * GIB).suspended
    assert in_host(ledger) == CAP


@pytest.fixture
def classroom_at_a_cap(service_loop, ledger_path, gpu):
    """One 8 GiB GPU, an 8 GiB host cap and three students (each guaranteed 4 GiB of up to 12,
    ClassroomGate): a client per student and the EmbeddedLedger."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 8)])
    lending = Lending(make_room=True, host_memory_cap=8 * GIB, clock=lambda: 1_000.0)
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=lending))
    clients = {
        name: RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in ("alice", "bob", "carol")
    }
    yield clients, ledger
    for client in clients.values():
        client.close()
    server.stop()
    ledger.close()


FOUR = SliceLimits(4 * GIB, 10, "burst")


def lend_and_borrow(alice: RemoteLedger, bob: RemoteLedger) -> None:
    """Alice's a1 suspended (4 GiB in host memory, its room lent); bob's b1 within his guarantee and
    b2 borrowing a1's room, both running cells: the GPU's 8 GiB are bob's."""
    alice.admit("a1", FOUR)
    alice.suspend("a1", host_memory=4 * GIB)
    for kernel_id in ("b1", "b2"):
        bob.admit(kernel_id, FOUR)
        bob.update_metadata(kernel_id, activity={"busy": True, "last_activity": 1_000.0, "uses_gpu": True})


def test_a_borrower_borrows_only_where_host_memory_could_take_its_room_back(classroom_at_a_cap):
    (clients, ledger) = classroom_at_a_cap
    alice, bob = clients["alice"], clients["bob"]
    alice.admit("a1", FOUR)
    alice.admit("a2", FOUR)
    alice.suspend("a1", host_memory=4 * GIB)
    bob.admit("b1", FOUR)  # within his guarantee: no host memory asked
    alice.suspend("a2", host_memory=4 * GIB)  # the cap is full; 4 GiB of the GPU is lent
    with pytest.raises(CapacityError, match="borrows only room that can be taken back without a kill") as refused:
        bob.admit("b2", FOUR)
    assert "suspended kernels hold 8GiB" in str(refused.value) and refused.value.available == 0
    # Issue 34 item 4: host memory is what is short, and what it waits for says so (not "GPU memory").
    assert refused.value.resource == "host_memory"
    assert waiting_for_room(refused.value) == (
        "4GiB more host memory to take its borrowed room back without a kill (0B free under idle.suspend_host_memory)"
    )
    alice.release("a2")  # stopped: 4 GiB of host memory frees, and with it the room to take a borrower back
    assert BORROWING_KEY in bob.admit("b2", FOUR).metadata
    assert in_host(ledger) == 4 * GIB


def test_a_suspend_leaves_the_host_memory_a_borrowers_take_back_needs(classroom_at_a_cap):
    (clients, ledger) = classroom_at_a_cap
    alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
    lend_and_borrow(alice, bob)  # 4 GiB in host memory, 4 kept for b2's take-back
    bob.release("b1")
    carol.admit("c1", FOUR)
    with pytest.raises(NotSupported, match="4GiB of the rest is kept for taking borrowed room back"):
        carol.suspend("c1", host_memory=GIB)
    assert not ledger.get("c1").suspended and in_host(ledger) == 4 * GIB


def test_a_start_within_its_guarantee_finds_its_room_while_suspended_kernels_fill_the_cap(classroom_at_a_cap):
    """The stall this rule ends (benchmarks/classroom_load.py at a 96 GiB cap): suspended kernels
    filled the cap, a borrower took their room, and a student within her guarantee then waited
    minutes, because the cap refused the borrower's suspend that would give her the room."""
    (clients, ledger) = classroom_at_a_cap
    alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
    alice.admit("a1", FOUR)
    carol.admit("c1", FOUR)
    alice.suspend("a1", host_memory=4 * GIB)
    carol.suspend("c1", host_memory=4 * GIB)  # the cap is full; the GPU's 8 GiB are lent
    bob.admit("b1", FOUR)
    with pytest.raises(CapacityError, match="can be taken back"):
        bob.admit("b2", FOUR)  # nobody could take this room back: it waits
    assert BORROWING_KEY not in alice.admit("a2", FOUR).metadata  # at once, no take-back to wait for
    assert in_host(ledger) == 8 * GIB


def test_a_start_within_its_guarantee_takes_borrowed_room_back_into_the_host_memory_kept_for_it(
    classroom_at_a_cap,
):
    (clients, ledger) = classroom_at_a_cap
    alice, bob = clients["alice"], clients["bob"]
    lend_and_borrow(alice, bob)
    with pytest.raises(CapacityError, match="being taken back"):
        alice.admit("a2", FOUR)  # within her guarantee: a1 is suspended
    request = bob.get("b2").metadata[SUSPEND_REQUESTED_KEY]
    assert request[TAKE_BACK_KEY] is True and ROOM_FOR_KEY not in request  # a start: no swap to pair with
    assert bob.suspend("b2", host_memory=4 * GIB).suspended  # into the room kept for it
    assert in_host(ledger) == 8 * GIB
    assert BORROWING_KEY not in alice.admit("a2", FOUR).metadata


def test_borrowed_room_is_taken_back_for_a_resume_at_the_cap(classroom_at_a_cap):
    (clients, ledger) = classroom_at_a_cap
    alice, bob = clients["alice"], clients["bob"]
    lend_and_borrow(alice, bob)
    with pytest.raises(CapacityError, match="being taken back"):
        alice.resume("a1")  # within alice's guarantee
    request = bob.get("b2").metadata[SUSPEND_REQUESTED_KEY]
    assert request[TAKE_BACK_KEY] is True and request[ROOM_FOR_KEY] == "a1"
    assert bob.suspend("b2", host_memory=4 * GIB).suspended
    assert in_host(ledger) == 8 * GIB
    assert not alice.resume("a1").suspended
    assert in_host(ledger) == 4 * GIB


def test_a_resume_behind_a_start_the_cap_stops_has_room_made_by_the_swap_and_held_for_it(
    service_loop, ledger_path, gpu
):
    """The stall classroom_load.py --seed 11 traced at a 96 GiB cap: suspended kernels fill the
    cap, the GPU runs idle kernels, and a start waits first in the node's line for room that only a
    stopped kernel can give (no suspend fits under the cap for it). Cells of suspended kernels
    waited behind it for half an hour, though each could swap with an idle kernel: room the start
    could never have been given. Now such a resume has that room made and held for it."""
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 8)])
    now = [1_000.0]
    lending = Lending(make_room=True, host_memory_cap=8 * GIB, clock=lambda: now[0])
    line = BrokerLine(clock=lambda: now[0])
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=lending, line=line))
    names = ("alice", "bob", "carol", "dave", "erin")
    alice, bob, carol, dave, erin = (RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in names)
    try:
        for client, kernel_id in ((alice, "a1"), (bob, "b1")):
            client.admit(kernel_id, FOUR)
            client.suspend(kernel_id, host_memory=4 * GIB)  # the cap is full
        for client, kernel_id, since in ((carol, "c1", 100.0), (dave, "d1", 200.0)):
            client.admit(kernel_id, FOUR)
            idle(client, kernel_id, since)  # the GPU's 8 GiB, both idle
        erin.wait_in_line("e1", kind="start", memory=FOUR.memory_limit, sm_share=10, device_uuid=None, since=900.0)
        with pytest.raises(CapacityError) as start:
            erin.admit("e1", FOUR)
        assert start.value.making_room == ""  # no suspend fits under the cap for a start
        assert ledger.get("c1").metadata.get(SUSPEND_REQUESTED_KEY) is None

        for client, kernel_id, since in ((alice, "a1", 950.0), (bob, "b1", 960.0)):
            client.wait_in_line(
                kernel_id, kind="resume", memory=FOUR.memory_limit, sm_share=10, device_uuid=None, since=since
            )
            with pytest.raises(CapacityError, match="its turn: ") as cell:
                client.resume(kernel_id)  # behind erin's start (and bob behind alice too)
            assert "1 idle kernel" in cell.value.making_room
        # Each resume has an idle kernel of its own, the longest idle first: no room counted twice.
        assert ledger.get("c1").metadata[SUSPEND_REQUESTED_KEY][ROOM_FOR_KEY] == "a1"
        assert ledger.get("d1").metadata[SUSPEND_REQUESTED_KEY][ROOM_FOR_KEY] == "b1"
        assert carol.suspend("c1", host_memory=4 * GIB).suspended  # past the cap by what a1 gives back
        with pytest.raises(NotSupported, match="would not fit"):
            dave.suspend("d1", host_memory=4 * GIB)  # one swap past the cap at a time: its server tries again

        with pytest.raises(CapacityError, match="held for a suspended kernel's resume"):
            erin.admit("e1", FOUR)  # the room the swap made is a1's
        assert not alice.resume("a1").suspended
        assert dave.suspend("d1", host_memory=4 * GIB).suspended
        assert not bob.resume("b1").suspended
        assert in_host(ledger) == 8 * GIB
        with pytest.raises(CapacityError):
            erin.admit("e1", FOUR)  # still waits for a kernel to stop, first in line
        alice.release("a1")
        assert not erin.admit("e1", FOUR).suspended
    finally:
        for client in (alice, bob, carol, dave, erin):
            client.close()
        server.stop()
        ledger.close()
