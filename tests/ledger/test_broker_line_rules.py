"""One fair line across users' servers at the node's broker (issue 25): a request a server
registers (``PUT line/<kernel id>``, RemoteLedger.wait_in_line) with the time it first asked keeps
its place among every server's requests; the service admits a start, a resume or a growth only
where no older registered request on that device would be delayed by it (line.py's rule: smaller
in memory and no more SM share than each may go first); registrations expire when their server
stops renewing them, and survive a restart of the service where the ledger does. Real handlers,
real HTTP on 127.0.0.1, a real EmbeddedLedger; tests/hub/test_broker_line.py runs the same with
the broker process and two real Jupyter servers."""

from __future__ import annotations

import pytest
from test_service_borrowing import Clock
from test_service_callers import StandInGate

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger
from jupyter_vgpu.ledger.broker_line import BrokerLine
from jupyter_vgpu.ledger.edge import Caller
from jupyter_vgpu.ledger.remote import RemoteLedger, SliceForbidden
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits, SliceValueError

GIB = 1 << 30
PREFIX = "/services/vgpu/ledger"
CALLERS = {"alice-token": Caller("alice"), "bob-token": Caller("bob"), "admin-token": Caller("", admin=True)}
SIZE = SliceLimits(8 * GIB, 20, "burst")


@pytest.fixture
def node(service_loop, ledger_path, gpu):
    """node(line) -> {"alice": RemoteLedger, "bob": ..., "admin": ...} of a service of one 16 GiB
    GPU that keeps ``line``."""
    opened = []

    def open_node(line: BrokerLine) -> dict[str, RemoteLedger]:
        ledger = EmbeddedLedger(ledger_path, [gpu(0, 16)])
        served = service_loop.serve(ledger_handlers(PREFIX, ledger, StandInGate(CALLERS), line=line))
        clients = {
            caller.name or "admin": RemoteLedger(served.url + PREFIX, token) for token, caller in CALLERS.items()
        }
        opened.append((clients, served, ledger))
        return clients

    yield open_node
    for clients, served, ledger in opened:
        for client in clients.values():
            client.close()
        served.stop()
        ledger.close()


def wait_for_start(client: RemoteLedger, kernel_id: str, since: float, memory: int = SIZE.memory_limit) -> None:
    client.wait_in_line(kernel_id, kind="start", memory=memory, sm_share=SIZE.sm_share, device_uuid=None, since=since)


def test_a_later_start_of_another_server_waits_behind_an_earlier_one_even_where_it_fits(node):
    clock = Clock()
    users = node(BrokerLine(clock=clock))
    alice, bob = users["alice"], users["bob"]
    alice.admit("alice-1", SliceLimits(12 * GIB, 20, "burst"))

    # Bob's server asked first (its start did not fit); then Alice's 8 GiB.
    wait_for_start(bob, "bob-1", since=clock.now - 5)
    with pytest.raises(CapacityError):
        bob.admit("bob-1", SIZE)
    alice.release("alice-1")

    # Room for one: Alice's server tries first, but Bob asked earlier.
    with pytest.raises(CapacityError) as refused:
        alice.admit("alice-2", SIZE)
    assert refused.value.resource == "line"
    assert (
        str(refused.value)
        == "its turn: 1 request of the node's users asked earlier for room on any GPU and waits ahead of it"
    )
    assert [allocation.kernel_id for allocation in users["admin"].allocations()] == []

    bob.admit("bob-1", SIZE)  # his turn: admitted, and out of the line
    assert users["admin"]._call("GET", "/line", read=lambda reply: reply) == {"line": []}
    alice.admit("alice-2", SIZE)


def test_a_smaller_request_goes_first_only_where_it_delays_nobody_ahead(node):
    clock = Clock()
    users = node(BrokerLine(clock=clock))
    alice, bob = users["alice"], users["bob"]
    alice.admit("alice-1", SliceLimits(12 * GIB, 20, "burst"))
    wait_for_start(bob, "bob-1", since=clock.now - 5)  # 8 GiB: waits for room that is not there

    # 2 GiB and no more SM share than Bob's: it takes room he cannot use yet (backfill).
    alice.admit("alice-small", SliceLimits(2 * GIB, 20, "burst"))
    # As large as his in memory: it would delay him, so it waits.
    with pytest.raises(CapacityError) as refused:
        alice.admit("alice-large", SliceLimits(8 * GIB, 10, "burst"))
    assert refused.value.resource == "line"
    # A growth is a request for what it grows by, in the same line.
    with pytest.raises(CapacityError) as growth:
        alice.resize("alice-small", memory_limit=12 * GIB)
    assert growth.value.resource == "line"
    alice.resize("alice-small", memory_limit=3 * GIB)  # 1 GiB more: smaller than Bob's 8


def test_a_registration_its_server_stops_renewing_expires(node):
    clock = Clock()
    users = node(BrokerLine(clock=clock, ttl=30))
    wait_for_start(users["bob"], "bob-1", since=clock.now)
    with pytest.raises(CapacityError):
        users["alice"].admit("alice-1", SIZE)

    clock.now += 20
    wait_for_start(users["bob"], "bob-1", since=clock.now)  # renewed: it keeps its first place
    clock.now += 20
    with pytest.raises(CapacityError):
        users["alice"].admit("alice-1", SIZE)
    (entry,) = users["bob"]._call("GET", "/line", read=lambda reply: reply["line"])
    assert entry["since"] == 1000.0

    clock.now += 31  # Bob's server died: nothing renews his place
    users["alice"].admit("alice-1", SIZE)


def test_the_line_survives_a_restart_of_the_service(node, tmp_path):
    clock = Clock()
    path = tmp_path / "line.json"
    wait_for_start(node(BrokerLine(path, clock=clock))["bob"], "bob-1", since=clock.now)

    again = node(BrokerLine(path, clock=clock))
    with pytest.raises(CapacityError) as refused:
        again["alice"].admit("alice-1", SIZE)
    assert refused.value.resource == "line"
    again["bob"].leave_line("bob-1")
    again["alice"].admit("alice-1", SIZE)


def test_a_user_cannot_take_or_change_another_users_place(node):
    clock = Clock()
    users = node(BrokerLine(clock=clock))
    wait_for_start(users["bob"], "bob-1", since=clock.now)
    with pytest.raises(SliceForbidden):
        wait_for_start(users["alice"], "bob-1", since=0)
    users["alice"].leave_line("bob-1")  # not hers: nothing happens
    assert [entry["owner"] for entry in users["admin"]._call("GET", "/line", read=lambda reply: reply["line"])] == [
        "bob"
    ]
    assert users["alice"]._call("GET", "/line", read=lambda reply: reply["line"]) == []


def test_bad_registrations_are_refused_with_what_is_accepted(node):
    users = node(BrokerLine())
    with pytest.raises(SliceValueError, match="kind must be one of start, resume, resize"):
        users["alice"].wait_in_line("k", kind="grow", memory=1, sm_share=1, device_uuid=None, since=0)
    with pytest.raises(SliceValueError, match="memory must be zero or more"):
        users["alice"].wait_in_line("k", kind="start", memory=-1, sm_share=1, device_uuid=None, since=0)


def test_a_resume_waiting_on_one_gpu_holds_up_a_start_on_any_gpu_only_there(service_loop, ledger_path, gpu):
    """A resume is tied to its GPU; a start on any GPU asked after it goes to another GPU where
    nobody older waits, and is never placed where the resume waits (traced in classroom_load.py
    --seed 11: starts waited behind a resume tied to GPU 0 while GPU 1 had room, and the cells
    on GPU 1 behind those starts waited 18 minutes)."""
    clock = Clock()
    ledger = EmbeddedLedger(ledger_path, [gpu(0, 8), gpu(1, 8)])
    served = service_loop.serve(ledger_handlers(PREFIX, ledger, StandInGate(CALLERS), line=BrokerLine(clock=clock)))
    alice, bob = (RemoteLedger(served.url + PREFIX, token) for token in ("alice-token", "bob-token"))
    four = SliceLimits(4 * GIB, 20, "burst")
    try:
        alice.admit("alice-1", four, device=0)
        bob.admit("bob-1", four, device=0)
        alice.suspend("alice-1", host_memory=4 * GIB)
        bob.admit("bob-2", four, device=0)  # takes the room alice's kernel lent: GPU 0 is full
        uuid0 = ledger.devices[0].uuid
        alice.wait_in_line(
            "alice-1", kind="resume", memory=4 * GIB, sm_share=20, device_uuid=uuid0, since=clock.now - 9
        )
        with pytest.raises(CapacityError):
            alice.resume("alice-1")

        wait_for_start(bob, "bob-3", since=clock.now - 5, memory=4 * GIB)
        assert ledger.devices_usage()[1].device.index == 1
        placed = bob.admit("bob-3", four)  # on any GPU, asked after alice's resume: GPU 1
        assert placed.device_uuid == ledger.devices[1].uuid
        bob.admit("bob-4", four, device=1)  # GPU 1 is full too
        bob.release("bob-2")  # room on GPU 0, which alice's resume waits for
        wait_for_start(bob, "bob-5", since=clock.now - 1, memory=4 * GIB)
        with pytest.raises(CapacityError) as refused:
            bob.admit("bob-5", four)  # not onto GPU 0, where it would go before alice
        assert "GPU 1" in str(refused.value)
        assert not alice.resume("alice-1").suspended
    finally:
        alice.close()
        bob.close()
        served.stop()
        ledger.close()
