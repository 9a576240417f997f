"""The ledger service with callers who are not all alike: a user sees and changes only the slices
they own (403 for another's), admits slices in their own name whatever the body says and within
their budget (409 with the budget's message), and their reconcile never releases another's slice;
an admin sees and changes every slice. The one-token service (TokenGate) is as before: its
holder may do everything, with no budget.

The gate here (:class:`StandInGate`) stands in for the hub: the broker's HubGate asks JupyterHub
who a token belongs to and reads the user's budget from the size their server was started with;
this one looks both up in a table. Everything else (handlers, HTTP, the RemoteLedger client, the
EmbeddedLedger) is the real code, over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from support import http_request
from tornado import httputil

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, LedgerError, OwnerBudget
from jupyter_vgpu.ledger.edge import Caller, Refusal
from jupyter_vgpu.ledger.remote import RemoteLedger, SliceForbidden
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits, SliceValueError

GIB = 1 << 30
PREFIX = "/services/vgpu/ledger"
SERVICE_TOKEN = "the-one-service-token"


@dataclass
class StandInGate:
    """A :class:`~jupyter_vgpu.ledger.service.Gate` from two tables (the hub's part in the broker):
    tokens to callers, and callers' names to budgets (absent: no limit)."""

    callers: dict[str, Caller]
    budgets: dict[str, OwnerBudget] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def caller(self, request: httputil.HTTPServerRequest, credential: str) -> Caller:
        caller = self.callers.get(credential)
        if caller is None:
            raise Refusal(403, "the stand-in hub does not accept this token", "Forbidden")
        return caller

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        self.asked.append(caller.name)
        return self.budgets.get(caller.name)


TOKENS = {
    "alice-token": Caller("alice"),
    "bob-token": Caller("bob"),
    "teacher-token": Caller("teacher", admin=True),
    "admin-service-token": Caller("", admin=True),
}
ALICE_BUDGET = OwnerBudget(memory=4 * GIB, sm_share=40, slices=2, policy="hard", label="alice's GPU size 'small'")
BOB_BUDGET = OwnerBudget(memory=8 * GIB, sm_share=60, slices=3, policy="burst", label="bob's GPU size 'burst'")


@dataclass
class Reply:
    status: int
    body: dict

    @property
    def message(self) -> str:
        return self.body.get("message", "")


def request(url: str, method: str, path: str, token: str, body: dict | None = None) -> Reply:
    """One raw HTTP request, so that the status and the JSON of a refusal are seen as sent."""
    status, headers, data = http_request(url, method, path, body, {"Authorization": f"token {token}"})
    assert headers["Content-Type"].startswith("application/json"), data[:200]
    return Reply(status, json.loads(data))


@dataclass
class Service:
    url: str
    ledger: EmbeddedLedger
    gate: StandInGate
    clients: dict[str, RemoteLedger]

    def client(self, token: str) -> RemoteLedger:
        if token not in self.clients:
            self.clients[token] = RemoteLedger(self.url, token, timeout=30)
        return self.clients[token]


@pytest.fixture
def service(service_loop, ledger_path, gpu):
    """The service on two 16GiB GPUs with a StandInGate; bob already holds slice b1 (2GiB, 20%
    burst) and carol (no token here) holds c1."""
    gate = StandInGate(dict(TOKENS), {"alice": ALICE_BUDGET, "bob": BOB_BUDGET})
    with EmbeddedLedger(ledger_path, [gpu(0, 16), gpu(1, 16)]) as ledger:
        ledger.admit("b1", SliceLimits(2 * GIB, 20, "burst"), owner="bob")
        ledger.admit("c1", SliceLimits(GIB, 10), owner="carol")
        served = service_loop.serve(ledger_handlers(PREFIX, ledger, gate))
        service = Service(served.url + PREFIX, ledger, gate, {})
        try:
            yield service
        finally:
            for client in service.clients.values():
                client.close()
            served.stop()


# -- a user sees only their own ---------------------------------------------------------------


def test_a_user_lists_only_their_own_allocations(service):
    alice = service.client("alice-token")
    assert alice.allocations() == []
    alice.admit("a1", SliceLimits(GIB, 10))
    assert [allocation.kernel_id for allocation in alice.allocations()] == ["a1"]
    assert [allocation.kernel_id for allocation in service.client("bob-token").allocations()] == ["b1"]
    listed = request(service.url, "GET", "/allocations", "alice-token")
    assert listed.status == 200
    assert [item["owner"] for item in listed.body["allocations"]] == ["alice"]


def test_a_user_sees_the_devices_and_their_usage_of_everyone(service):
    # Usage is the devices' (so that a server can say what is free), never whose slices they are.
    usage = service.client("alice-token").devices_usage()
    assert sum(device.slices for device in usage) == 2
    assert len(service.client("alice-token").devices) == 2


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/allocations/b1", None),
        ("PATCH", "/allocations/b1", {"memory_limit": GIB}),
        ("DELETE", "/allocations/b1", None),
        ("PATCH", "/allocations/b1/metadata", {"pid": 1}),
    ],
)
def test_a_user_gets_403_on_another_users_slice_and_it_is_left_as_it_was(service, method, path, body):
    before = service.ledger.get("b1")
    reply = request(service.url, method, path, "alice-token", body)
    assert reply.status == 403
    assert reply.body["error"] == "NotYourSlice"
    assert "'b1' is not yours ('alice')" in reply.message
    assert "only its owner or a vGPU admin" in reply.message
    assert service.ledger.get("b1") == before


def test_a_slice_that_does_not_exist_is_404_not_403(service):
    reply = request(service.url, "GET", "/allocations/nobody", "alice-token")
    assert reply.status == 404
    assert reply.body["error"] == "UnknownSlice"


def test_the_client_turns_another_users_slice_into_slice_forbidden_not_a_ledger_error(service):
    alice = service.client("alice-token")
    for call in (
        lambda: alice.get("b1"),
        lambda: alice.resize("b1", memory_limit=GIB),
        lambda: alice.release("b1"),
        lambda: alice.update_metadata("b1", pid=1),
    ):
        with pytest.raises(SliceForbidden, match=r"'b1' is not yours \('alice'\)") as refused:
            call()
        assert not isinstance(refused.value, LedgerError)  # not the broker failing
    assert service.ledger.get("b1").memory_limit == 2 * GIB


def test_a_user_admits_in_their_own_name_whatever_the_body_says(service):
    alice = service.client("alice-token")
    allocation = alice.admit("a1", SliceLimits(GIB, 10), owner="bob")
    assert allocation.owner == "alice"
    assert service.ledger.get("a1").owner == "alice"
    reply = request(
        service.url,
        "POST",
        "/allocations",
        "alice-token",
        {"kernel_id": "a2", "memory_limit": GIB, "sm_share": 10, "owner": "carol"},
    )
    assert reply.status == 201
    assert reply.body["owner"] == "alice"
    # What was admitted in her name counts against her budget, and is hers to change.
    assert alice.resize("a2", sm_share=20).sm_share == 20
    assert alice.release("a1").owner == "alice"


def test_a_user_changes_their_own_slices(service):
    bob = service.client("bob-token")
    assert bob.get("b1").owner == "bob"
    assert bob.resize("b1", memory_limit=3 * GIB).memory_limit == 3 * GIB
    assert bob.update_metadata("b1", pid=42).metadata == {"pid": 42}
    assert bob.release("b1").kernel_id == "b1"
    assert service.ledger.get("b1") is None


# -- a user is held to their budget -------------------------------------------------------------


def test_a_user_is_held_to_their_memory_budget_with_409_and_its_message(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(3 * GIB, 10))
    reply = request(service.url, "POST", "/allocations", "alice-token", {"kernel_id": "a2", "memory_limit": 2 * GIB})
    assert reply.status == 409
    assert reply.body["error"] == "CapacityError"
    assert (reply.body["resource"], reply.body["requested"], reply.body["available"]) == ("user_memory", 2 * GIB, GIB)
    assert "does not fit in alice's GPU size 'small'" in reply.message
    assert "ask for at most 1GiB, or stop a kernel" in reply.message
    with pytest.raises(CapacityError) as refused:
        alice.admit("a2", SliceLimits(2 * GIB, 10))
    assert refused.value.resource == "user_memory"
    assert str(refused.value) == reply.message
    assert service.ledger.get("a2") is None


def test_a_user_is_held_to_their_slices_and_share_budget(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(GIB, 30))
    with pytest.raises(CapacityError, match="alice's GPU size 'small'") as refused:
        alice.admit("a2", SliceLimits(GIB, 20))
    assert (refused.value.resource, refused.value.available) == ("user_sm_share", 10)
    alice.admit("a2", SliceLimits(GIB, 10))
    with pytest.raises(CapacityError, match="stop one of your kernels first") as refused:
        alice.admit("a3", SliceLimits(GIB, 1))
    assert refused.value.resource == "user_slices"


def test_a_users_resize_is_held_to_their_budget_where_it_grows(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(2 * GIB, 20))
    with pytest.raises(CapacityError) as refused:
        alice.resize("a1", memory_limit=5 * GIB)
    assert refused.value.resource == "user_memory"
    reply = request(service.url, "PATCH", "/allocations/a1", "alice-token", {"sm_share": 50})
    assert (reply.status, reply.body["resource"]) == (409, "user_sm_share")
    assert alice.resize("a1", memory_limit=4 * GIB, sm_share=40).limits == SliceLimits(4 * GIB, 40)


def test_a_users_burst_budget_refuses_a_hard_slice_with_400(service):
    reply = request(service.url, "POST", "/allocations", "bob-token", {"kernel_id": "b2", "memory_limit": GIB})
    assert reply.status == 400
    assert reply.body["error"] == "SliceValueError"
    assert "bob's GPU size 'burst' gives burst slices" in reply.message
    with pytest.raises(SliceValueError, match="ask for policy burst"):
        service.client("bob-token").admit("b2", SliceLimits(GIB, 10, "hard"))


def test_the_budget_is_asked_at_every_admission_and_growth(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(GIB, 10))
    service.gate.budgets["alice"] = OwnerBudget(memory=GIB, label="alice's GPU size 'tiny'")
    with pytest.raises(CapacityError, match="alice's GPU size 'tiny'"):
        alice.admit("a2", SliceLimits(GIB, 10))
    with pytest.raises(CapacityError, match="alice's GPU size 'tiny'"):
        alice.resize("a1", memory_limit=2 * GIB)
    # Under the lowered budget her slice can still shrink.
    service.gate.budgets["alice"] = OwnerBudget(memory=GIB // 4, label="alice's GPU size 'tinier'")
    assert alice.resize("a1", memory_limit=GIB // 2).memory_limit == GIB // 2
    assert service.gate.asked.count("alice") >= 4


def test_other_users_slices_never_count_against_a_users_budget(service):
    service.ledger.admit("c2", SliceLimits(8 * GIB, 50, "burst"), owner="carol")
    alice = service.client("alice-token")
    # Carol's and bob's slices together hold far more than alice's budget.
    alice.admit("a1", SliceLimits(4 * GIB, 40))
    assert alice.resize("a1", memory_limit=4 * GIB).memory_limit == 4 * GIB


# -- reconcile ----------------------------------------------------------------------------------


def test_a_users_reconcile_never_releases_another_users_slice(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(GIB, 10))
    # Her client lists only her slices, so only those can be judged dead.
    released = alice.reconcile(lambda allocation: False)
    assert [allocation.kernel_id for allocation in released] == ["a1"]
    assert {allocation.kernel_id for allocation in service.ledger.allocations()} == {"b1", "c1"}
    # Naming another's slice in the request (kernel id and creation time right) releases nothing.
    b1 = service.ledger.get("b1")
    c1 = service.ledger.get("c1")
    dead = [{"kernel_id": a.kernel_id, "created_at": a.created_at} for a in (b1, c1)]
    reply = request(service.url, "POST", "/reconcile", "alice-token", {"dead": dead})
    assert reply.status == 200
    assert reply.body["released"] == []
    assert service.ledger.get("b1") == b1
    assert service.ledger.get("c1") == c1


def test_a_users_reconcile_releases_their_own_dead_slices_only(service):
    bob = service.client("bob-token")
    bob.admit("b2", SliceLimits(GIB, 10, "burst"))
    released = bob.reconcile(lambda allocation: allocation.kernel_id != "b1")
    assert [allocation.kernel_id for allocation in released] == ["b1"]
    assert {allocation.kernel_id for allocation in service.ledger.allocations()} == {"b2", "c1"}


# -- admins -------------------------------------------------------------------------------------


def test_an_admin_sees_every_slice(service):
    service.client("alice-token").admit("a1", SliceLimits(GIB, 10))
    teacher = service.client("teacher-token")
    assert {allocation.kernel_id for allocation in teacher.allocations()} == {"a1", "b1", "c1"}
    assert teacher.get("b1").owner == "bob"


def test_an_admin_changes_every_slice_held_to_the_devices_only(service):
    alice = service.client("alice-token")
    alice.admit("a1", SliceLimits(GIB, 10))
    teacher = service.client("teacher-token")
    # Past alice's budget (4GiB, 40%): an admin changing another's slice is not held to it.
    assert teacher.resize("a1", memory_limit=6 * GIB, sm_share=60).limits == SliceLimits(6 * GIB, 60)
    assert "teacher" not in service.gate.asked
    assert teacher.update_metadata("b1", note="seen").metadata == {"note": "seen"}
    assert teacher.release("c1").owner == "carol"
    # The devices still hold: no slice bigger than a GPU.
    with pytest.raises(CapacityError) as refused:
        teacher.resize("a1", memory_limit=17 * GIB)
    assert refused.value.resource == "memory"


def test_an_admin_user_admits_in_their_own_name(service):
    teacher = service.client("teacher-token")
    assert teacher.admit("t1", SliceLimits(GIB, 10), owner="alice").owner == "teacher"


def test_an_admin_service_admits_in_the_name_the_body_gives(service):
    admin = service.client("admin-service-token")
    assert admin.admit("x1", SliceLimits(GIB, 10), owner="alice").owner == "alice"
    # The admin is no user: nobody's budget is asked for, so alice's does not apply.
    assert "" in service.gate.asked
    assert admin.admit("x2", SliceLimits(8 * GIB, 90), owner="alice").owner == "alice"


def test_an_admins_reconcile_releases_any_dead_slice(service):
    released = service.client("teacher-token").reconcile(lambda allocation: allocation.owner != "bob")
    assert [allocation.kernel_id for allocation in released] == ["b1"]


def test_a_token_the_gate_does_not_accept_is_refused_with_403(service):
    reply = request(service.url, "GET", "/allocations", "mallory-token")
    assert reply.status == 403
    assert "does not accept this token" in reply.message
    with pytest.raises(LedgerError, match=r"refused \(403\)"):
        RemoteLedger(service.url, "mallory-token", timeout=30).allocations()


# -- the one-token service ----------------------------------------------------------------------


@pytest.fixture
def token_service(serve, ledger_path, gpu):
    with EmbeddedLedger(ledger_path, [gpu(0, 16)]) as ledger:
        ledger.admit("b1", SliceLimits(2 * GIB, 20), owner="bob")
        url = serve(ledger, prefix=PREFIX, token=SERVICE_TOKEN)
        with RemoteLedger(url, SERVICE_TOKEN, timeout=30) as client:
            yield url, ledger, client


def test_the_token_gates_holder_sees_and_changes_every_slice(token_service):
    url, ledger, client = token_service
    assert [allocation.owner for allocation in client.allocations()] == ["bob"]
    assert client.resize("b1", memory_limit=3 * GIB).memory_limit == 3 * GIB
    assert client.update_metadata("b1", pid=7).metadata == {"pid": 7}
    assert request(url, "GET", "/allocations/b1", SERVICE_TOKEN).status == 200
    assert client.release("b1").owner == "bob"
    assert ledger.allocations() == []


def test_the_token_gate_admits_in_the_name_the_body_gives_with_no_budget(token_service):
    _, _, client = token_service
    assert client.admit("a1", SliceLimits(4 * GIB, 30), owner="alice").owner == "alice"
    assert client.admit("a2", SliceLimits(4 * GIB, 30), owner="alice").owner == "alice"
    assert client.admit("n1", SliceLimits(GIB, 10)).owner == ""
    # Only the device's capacity refuses.
    with pytest.raises(CapacityError) as refused:
        client.admit("a3", SliceLimits(8 * GIB, 10), owner="alice")
    assert refused.value.resource == "memory"


def test_the_token_gates_holder_reconciles_every_slice(token_service):
    _, ledger, client = token_service
    client.admit("a1", SliceLimits(GIB, 10), owner="alice")
    released = client.reconcile(lambda allocation: False)
    assert {allocation.kernel_id for allocation in released} == {"a1", "b1"}
    assert ledger.allocations() == []


def test_the_token_gate_refuses_another_token(token_service):
    url, _, _ = token_service
    reply = request(url, "GET", "/allocations", "alice-token")
    assert reply.status == 403
    assert reply.body["error"] == "Forbidden"
