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
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    TAKE_BACK_KEY,
    CapacityError,
    EmbeddedLedger,
    NotSupported,
)
from jupyter_vgpu.ledger.base import ROOM_FOR_KEY
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import Lending, ledger_handlers
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


def test_borrowed_room_is_taken_back_for_a_resume_at_the_cap(service_loop, ledger_path, gpu):
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 12)])
    lending = Lending(make_room=True, host_memory_cap=4 * GIB, clock=lambda: 1_000.0)
    server = service_loop.serve(ledger_handlers(PREFIX, ledger, ClassroomGate(), lending=lending))
    alice, bob = (RemoteLedger(server.url + PREFIX, f"{name}-token", timeout=30) for name in ("alice", "bob"))
    try:
        four = SliceLimits(4 * GIB, 10, "burst")
        alice.admit("a1", four)
        alice.suspend("a1", host_memory=4 * GIB)  # the cap is full
        for kernel_id in ("b1", "b2", "b3"):  # b2 and b3 borrow the room a1 lends
            bob.admit(kernel_id, four)
            bob.update_metadata(kernel_id, activity={"busy": True, "last_activity": 1_000.0, "uses_gpu": True})
        with pytest.raises(CapacityError, match="being taken back"):
            alice.resume("a1")  # within alice's guarantee
        request = bob.get("b3").metadata[SUSPEND_REQUESTED_KEY]
        assert request[TAKE_BACK_KEY] is True and request[ROOM_FOR_KEY] == "a1"
        # The borrower's suspend goes past the cap by the 4 GiB a1's resume gives back, not more.
        assert bob.suspend("b3", host_memory=4 * GIB).suspended
        assert in_host(ledger) == 8 * GIB
        assert not alice.resume("a1").suspended
        assert in_host(ledger) == 4 * GIB
    finally:
        alice.close()
        bob.close()
        server.stop()
        ledger.close()
