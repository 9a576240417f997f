"""The ledger over HTTP at its edges: the service refuses requests without its token and every
body it does not take, always with a JSON answer and never with a 500; the client turns a
service it cannot reach, or one that answers something other than the ledger API, into a
LedgerError that says so."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import http_request
from tornado import web

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, LedgerError
from jupyter_vgpu.ledger.edge import MAX_BODY_BYTES
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits, SliceValueError

GIB = 1 << 30
TOKEN = "service-test-token"


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> dict:
        assert self.headers["Content-Type"].startswith("application/json"), self.body[:200]
        return json.loads(self.body)


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One raw HTTP request to ``url`` + ``path``, with ``token`` or else ``headers`` (not through
    the client, so that what it never sends can be sent)."""
    if headers is None:
        headers = {} if token is None else {"Authorization": f"token {token}"}
    return Reply(*http_request(url, method, path, body, headers))


@dataclass
class Service:
    url: str
    ledger: EmbeddedLedger


@pytest.fixture
def service(serve, ledger_path, gpu):
    """A service of an EmbeddedLedger on one 16GiB GPU that holds a 4GiB slice for kernel k1."""
    with EmbeddedLedger(ledger_path, [gpu(0, 16)]) as ledger:
        ledger.admit("k1", SliceLimits(4 * GIB, 50))
        yield Service(serve(ledger, token=TOKEN), ledger)


# -- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, "", "token", "token   ", "Basic dXNlcjpwYXNz", TOKEN])
def test_a_request_without_a_token_is_refused_with_401(service, header):
    reply = request(service.url, "GET", "/allocations", headers={} if header is None else {"Authorization": header})
    assert reply.status == 401
    assert reply.json() == {
        "message": "the ledger service needs a token: send 'Authorization: token <token>'",
        "error": "Unauthorized",
    }
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("token", ["wrong", TOKEN + "x", TOKEN[:-1], "ünïcode"])
def test_a_wrong_token_is_refused_with_403(service, token):
    reply = request(service.url, "POST", "/allocations", {"kernel_id": "k2", "memory_limit": GIB}, token=token)
    assert reply.status == 403
    assert reply.json()["error"] == "Forbidden"
    assert service.ledger.get("k2") is None


@pytest.mark.parametrize("scheme", ["token", "Token", "Bearer", "bearer"])
def test_the_token_is_taken_in_either_scheme(service, scheme):
    reply = request(service.url, "GET", "/allocations/k1", headers={"Authorization": f"{scheme} {TOKEN}"})
    assert (reply.status, reply.json()["kernel_id"]) == (200, "k1")


def test_a_client_with_a_wrong_token_gets_a_ledger_error_without_the_token(service):
    with (
        RemoteLedger(service.url, "not-the-secret") as client,
        pytest.raises(LedgerError, match=r"refused \(403\)") as raised,
    ):
        client.allocations()
    assert "not-the-secret" not in str(raised.value)


def test_unknown_routes_are_refused_after_authentication(service):
    assert request(service.url, "GET", "/nothing/here", token=None).status == 401
    reply = request(service.url, "GET", "/nothing/here")
    assert (reply.status, reply.json()["error"]) == (404, "NotFound")


def test_a_dot_in_the_prefix_is_not_a_wildcard(service):
    # PREFIX is /services/vgpu.broker/ledger; a route built from it unescaped would match this.
    url = service.url.replace("vgpu.broker", "vgpuXbroker")
    assert request(url, "GET", "/devices").status == 404
    assert request(service.url, "GET", "/devices").status == 200


def test_a_method_a_route_does_not_have_is_refused_as_json(service):
    reply = request(service.url, "PUT", "/allocations", {})
    assert reply.status == 405
    assert reply.json()["error"] == "HTTPError"


# -- refusals as JSON --------------------------------------------------------------------------


def test_refusals_carry_their_kind_and_the_capacity_figures(service):
    no_room = request(service.url, "POST", "/allocations", {"kernel_id": "k2", "memory_limit": 20 * GIB})
    assert no_room.status == 409
    assert no_room.json() == {
        "message": no_room.json()["message"],
        "error": "CapacityError",
        "resource": "memory",
        "requested": 20 * GIB,
        "available": 12 * GIB,
    }
    assert no_room.json()["message"].startswith("no device has 20GiB of GPU memory free")
    exists = request(service.url, "POST", "/allocations", {"kernel_id": "k1", "memory_limit": GIB})
    assert (exists.status, exists.json()["error"]) == (409, "SliceExists")
    for method in ("GET", "DELETE"):
        unknown = request(service.url, method, "/allocations/ghost")
        assert (unknown.status, unknown.json()["error"]) == (404, "UnknownSlice")
    refused = request(service.url, "PATCH", "/allocations/k1", {"sm_share": 0})
    assert (refused.status, refused.json()) == (
        400,
        {"message": "SM share 0 is not a whole percentage from 1 to 100", "error": "SliceValueError"},
    )


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


ADMIT = {"kernel_id": "k2", "memory_limit": GIB}


@pytest.mark.parametrize(
    "method, path, body, message",
    [
        ("POST", "/allocations", b"not json", "the request body is not JSON"),
        ("POST", "/allocations", b"", "the request body is not JSON"),
        ("POST", "/allocations", b"\xff\xfe{", "the request body is not JSON"),
        ("POST", "/allocations", b"[" * 100_000, "the request body is not JSON"),
        ("POST", "/allocations", b"[1]", "the request body must be a JSON object"),
        ("POST", "/allocations", {**ADMIT, "colour": "red"}, "unknown field 'colour'; it takes kernel_id, memory_"),
        ("POST", "/allocations", {"kernel_id": "k2"}, "lacks 'memory_limit'"),
        ("POST", "/allocations", {**ADMIT, "memory_limit": "4GiB"}, 'memory_limit must be a whole number, not "4GiB"'),
        ("POST", "/allocations", {**ADMIT, "memory_limit": True}, "memory_limit must be a whole number, not true"),
        ("POST", "/allocations", {**ADMIT, "memory_limit": 1.5}, "memory_limit must be a whole number, not 1.5"),
        ("POST", "/allocations", {**ADMIT, "memory_limit": 1 << 70}, "memory_limit 1180591620717411303424 is out of"),
        ("POST", "/allocations", b'{"kernel_id": "k2", "memory_limit": NaN}', "is not JSON"),
        ("POST", "/allocations", b'{"kernel_id": "k2", "memory_limit": 1e999}', "is out of range"),
        ("POST", "/allocations", {**ADMIT, "kernel_id": ""}, "kernel_id must not be empty"),
        ("POST", "/allocations", {**ADMIT, "kernel_id": 7}, "kernel_id must be a string, not 7"),
        ("POST", "/allocations", {**ADMIT, "kernel_id": "k" * 300}, "kernel_id must be at most 256 characters"),
        ("POST", "/allocations", b'{"kernel_id": "\\ud800", "memory_limit": 1}', "kernel_id must be text that UTF-8"),
        ("POST", "/allocations", {**ADMIT, "policy": 5}, "policy must be a string"),
        ("POST", "/allocations", {**ADMIT, "device": True}, "device must be a string, not true"),
        ("POST", "/allocations", {**ADMIT, "device": [0]}, "device must be a string"),
        ("POST", "/allocations", {**ADMIT, "metadata": [1]}, "metadata must be a JSON object"),
        ("POST", "/allocations", {**ADMIT, "metadata": _nested(20)}, "nested more than 16 levels deep"),
        ("POST", "/allocations", {**ADMIT, "owner": "x" * (MAX_BODY_BYTES + 1)}, "must be at most 262144 bytes"),
        ("PATCH", "/allocations/k1", {"memory_limit": "8GiB"}, "memory_limit must be a whole number"),
        ("PATCH", "/allocations/k1", {"cores": 50}, "unknown field 'cores'; it takes memory_limit, sm_share, policy"),
        ("PATCH", "/allocations/k1/metadata", b"[]", "the request body must be a JSON object"),
        ("PATCH", "/allocations/k1/metadata", {"kernel_id": "k9"}, "metadata fields may not be named 'kernel_id'"),
        ("PATCH", "/allocations/k1/metadata", {"self": 1}, "may not be named 'self'"),
        ("POST", "/reconcile", {}, "lacks 'dead'"),
        ("POST", "/reconcile", {"dead": "k1"}, "dead must be a list"),
        ("POST", "/reconcile", {"dead": [{"kernel_id": "k1"}]}, r"dead\[0\] lacks 'created_at'"),
        ("POST", "/reconcile", {"dead": [{"kernel_id": "k1", "created_at": "now"}]}, "created_at must be a number"),
        ("POST", "/reconcile", {"dead": [{"kernel_id": "k1", "created_at": 1, "x": 1}]}, r"dead\[0\] has unknown"),
    ],
)
def test_a_body_the_service_does_not_take_is_refused_with_400_and_changes_nothing(service, method, path, body, message):
    before = service.ledger.allocations()
    reply = request(service.url, method, path, body)
    assert reply.status == 400, reply.body[:300]
    assert reply.json()["error"] == "BadRequest"
    assert re.search(message, reply.json()["message"]), reply.json()["message"]
    assert service.ledger.allocations() == before


def test_a_kernel_id_that_is_not_utf8_in_the_path_is_refused_as_json(service):
    reply = request(service.url, "GET", "/allocations/%FF")
    assert reply.status == 400
    assert reply.json()["error"] == "HTTPError"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    ["kernel_id", "memory_limit", "sm_share", "policy", "owner", "device", "metadata", "holder", "dead", "pid"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    route=st.sampled_from(
        [
            ("POST", "/allocations"),
            ("PATCH", "/allocations/k1"),
            ("PATCH", "/allocations/k1/metadata"),
            ("POST", "/reconcile"),
            ("DELETE", "/allocations/k9"),
            ("GET", "/allocations/k9"),
        ]
    ),
    body=st.dictionaries(FIELDS, JSON_VALUES, max_size=4) | JSON_VALUES,
)
def test_whatever_a_client_sends_is_answered_as_json_and_never_with_a_500(service, route, body):
    # One service for all examples (the fixture is the test's): what earlier bodies admitted
    # stays, as it would on a live service.
    method, path = route
    reply = request(service.url, method, path, json.dumps(body).encode() if method in ("POST", "PATCH") else None)
    assert reply.status in (200, 201, 400, 404, 409), (reply.status, reply.body[:300])
    answer = reply.json()
    if reply.status >= 400:
        assert isinstance(answer["message"], str) and answer["message"]


def test_a_failing_ledger_is_answered_with_503_and_its_message(serve):
    class BrokenLedger:
        def allocations(self):
            raise LedgerError("ledger file /var/lib/vgpu/ledger.sqlite is locked")

    url = serve(BrokenLedger(), token=TOKEN)
    reply = request(url, "GET", "/allocations")
    assert (reply.status, reply.json()["message"]) == (503, "ledger file /var/lib/vgpu/ledger.sqlite is locked")
    with RemoteLedger(url, TOKEN) as client, pytest.raises(LedgerError, match="503 Service Unavailable: ledger file"):
        client.allocations()


# -- the client against services that fail it --------------------------------------------------


def test_a_service_that_cannot_be_reached_is_a_ledger_error():
    with socket.socket() as bound_but_not_listening:
        bound_but_not_listening.bind(("127.0.0.1", 0))
        port = bound_but_not_listening.getsockname()[1]
        client = RemoteLedger(f"http://127.0.0.1:{port}/ledger", TOKEN)
        with pytest.raises(LedgerError, match=rf"cannot reach the ledger service at http://127.0.0.1:{port}/ledger: "):
            client.admit("k1", SliceLimits(GIB))


def test_a_service_that_does_not_answer_in_time_is_a_ledger_error():
    # It accepts connections (the kernel does, into the backlog) but never reads or answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = RemoteLedger(f"http://127.0.0.1:{silent.getsockname()[1]}/ledger", TOKEN, timeout=0.2)
        with pytest.raises(LedgerError, match="did not answer POST /allocations within 0.2 s; the decision may"):
            client.admit("k1", SliceLimits(GIB))


def test_a_connection_lost_after_the_request_says_the_decision_may_have_been_made():
    # The service takes the request and goes away before answering (killed, restarted).
    with socket.socket() as vanishing:
        vanishing.bind(("127.0.0.1", 0))
        vanishing.listen()

        def take_the_request_and_go() -> None:
            connection, _ = vanishing.accept()
            with connection:
                connection.recv(65536)

        taker = threading.Thread(target=take_the_request_and_go)
        taker.start()
        client = RemoteLedger(f"http://127.0.0.1:{vanishing.getsockname()[1]}/ledger", TOKEN)
        with pytest.raises(LedgerError, match="failed during POST /allocations: .*the decision may or may not have"):
            client.admit("k1", SliceLimits(GIB))
        taker.join()


class CannedHandler(web.RequestHandler):
    def initialize(self, status: int, content_type: str, body: str) -> None:
        self.canned = (status, content_type, body)

    def get(self) -> None:
        status, content_type, body = self.canned
        self.set_status(status)
        self.set_header("Content-Type", content_type)
        self.finish(body)


@pytest.mark.parametrize(
    "status, content_type, body, message",
    [
        (200, "text/html", "<html>JupyterHub</html>", r"answered GET /api/devices with 200 OK and no ledger reply"),
        (500, "text/plain", "Internal Server Error", r"with 500 Internal Server Error and no ledger reply"),
        (302, "text/html", "", r"with 302 Found and no ledger reply"),
        (200, "application/json", '{"devices": [{"uuid": 1}]}', r"a reply this client cannot read \(Device lacks"),
        (200, "application/json", '{"devices": {}}', r"cannot read \(the reply's 'devices' is dict"),
        (200, "application/json", "[]", r"cannot read \(the reply is list"),
        (502, "application/json", '{"message": "upstream gone"}', r"GET /api/devices with 502 Bad Gateway: upstream"),
    ],
)
def test_a_reply_that_is_not_the_ledger_api_is_a_ledger_error(service_loop, status, content_type, body, message):
    canned = {"status": status, "content_type": content_type, "body": body}
    served = service_loop.serve([(r"/api/devices", CannedHandler, canned)])
    try:
        with RemoteLedger(f"{served.url}/api", TOKEN) as client, pytest.raises(LedgerError, match=message):
            client.devices  # noqa: B018 -- reading the property is the request that fails
    finally:
        served.stop()


def test_a_wrong_address_is_a_ledger_error_that_says_to_check_it(service):
    with (
        RemoteLedger(service.url.replace("/ledger", "/ledgr"), TOKEN) as client,
        pytest.raises(LedgerError, match="404 Not Found and no ledger reply .*check that the URL is the ledger's"),
    ):
        client.allocations()


def test_a_connection_the_service_closed_while_idle_is_not_reused(service_loop, ledger_path, gpu):
    with EmbeddedLedger(ledger_path, [gpu(0, 16)]) as ledger:
        served = service_loop.serve(ledger_handlers("/ledger", ledger, TOKEN))
        try:
            with RemoteLedger(f"{served.url}/ledger", TOKEN) as client:
                client.admit("k1", SliceLimits(GIB, 10))
                # The service drops its kept-alive connections (a restart of its proxy, an idle
                # timeout) but goes on listening.
                service_loop.run(served.server.close_all_connections())
                assert client.admit("k2", SliceLimits(GIB, 10)).kernel_id == "k2"
                assert [a.kernel_id for a in ledger.allocations()] == ["k1", "k2"]
        finally:
            served.stop()


def test_refusals_reach_the_client_as_the_ledgers_exceptions(service):
    with RemoteLedger(service.url, TOKEN) as client:
        with pytest.raises(CapacityError) as raised:
            client.admit("k2", SliceLimits(20 * GIB))
        assert (raised.value.resource, raised.value.requested, raised.value.available) == ("memory", 20 * GIB, 12 * GIB)
        with pytest.raises(SliceValueError, match="matches no single GPU"):
            client.admit("k2", SliceLimits(GIB), device=3)


def test_a_closed_client_makes_no_more_requests(service):
    client = RemoteLedger(service.url, TOKEN)
    assert client.get("k1").kernel_id == "k1"
    client.close()
    with pytest.raises(LedgerError, match="is closed"):
        client.get("k1")


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, token, message",
    [
        ("127.0.0.1:8081/ledger", TOKEN, "must be http:// or https://"),
        ("ftp://hub/ledger", TOKEN, "must be http:// or https://"),
        ("http://hub/ledger?x=1", TOKEN, "must not have a query"),
        ("http://hub/ledger", "", "needs a token"),
    ],
)
def test_a_client_refuses_an_unusable_address_or_no_token(url, token, message):
    with pytest.raises(ValueError, match=message):
        RemoteLedger(url, token)


@pytest.mark.parametrize("prefix, token, message", [("/ledger", "", "needs a token"), ("ledger", TOKEN, "start with")])
def test_the_handlers_refuse_to_serve_without_a_token_or_a_relative_prefix(ledger_path, gpu, prefix, token, message):
    with EmbeddedLedger(ledger_path, [gpu(0, 8)]) as ledger, pytest.raises(ValueError, match=message):
        ledger_handlers(prefix, ledger, token)


def test_the_client_needs_no_tornado():
    # A user's server imports the client; only the service (the broker) needs an HTTP server.
    code = "import sys, jupyter_vgpu.ledger.remote; print(sorted(m for m in sys.modules if m.startswith('tornado')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
