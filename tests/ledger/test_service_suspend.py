"""Suspending a slice through the ledger service (issue 18): RemoteLedger.suspend and .resume
call the service's routes, which lend a suspended slice's room as the embedded ledger does and
admit it again on resume; a service with a Lending (the broker's) refuses a suspend past its host
memory cap, or while its check says the slice's processes still hold device memory, and the
suspended state is never set by a metadata update. Real handlers, real HTTP on 127.0.0.1, a real
EmbeddedLedger; the broker's own NVML check runs in tests/hub/test_broker_suspend.py."""

from __future__ import annotations

import json

import pytest
from support import http_request

from jupyter_vgpu.ledger import (
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    CapacityError,
    EmbeddedLedger,
    NotSupported,
)
from jupyter_vgpu.ledger.lending import Lending
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import SliceLimits

GIB = 1 << 30
PREFIX = "/services/vgpu/ledger"
TOKEN = "suspend-test-token"


@pytest.fixture
def served(service_loop, ledger_path, gpu):
    """serve(lending) -> (a RemoteLedger of a service on one 16 GiB GPU, the EmbeddedLedger behind it)."""
    opened = []

    def serve(lending: Lending | None = None):
        ledger = EmbeddedLedger(ledger_path, [gpu(0, 16)])
        server = service_loop.serve(ledger_handlers(PREFIX, ledger, TOKEN, lending=lending))
        client = RemoteLedger(server.url + PREFIX, TOKEN, timeout=30)
        opened.append((client, server, ledger))
        return client, ledger

    yield serve
    for client, server, ledger in opened:
        client.close()
        server.stop()
        ledger.close()


def test_a_slice_suspended_through_the_service_lends_its_room_until_it_resumes(served):
    client, _ = served()
    client.admit("a", SliceLimits(12 * GIB, 30))
    suspended = client.suspend("a", host_memory=12 * GIB, details={"processes": [{"pid": 7, "memory": 12 * GIB}]})
    assert suspended.suspended and suspended.host_memory == 12 * GIB
    assert suspended.metadata["suspended"]["processes"] == [{"pid": 7, "memory": 12 * GIB}]
    assert client.devices_usage()[0].memory_free == 16 * GIB
    client.admit("b", SliceLimits(8 * GIB, 30))
    with pytest.raises(CapacityError, match="cannot resume yet") as refused:
        client.resume("a")
    assert (refused.value.resource, refused.value.available) == ("memory", 8 * GIB)
    assert client.get("a").suspended
    client.release("b")
    assert not client.resume("a").suspended
    assert client.devices_usage()[0].memory_free == 4 * GIB


def test_a_suspend_past_the_host_memory_cap_is_refused_and_the_slice_keeps_its_room(served):
    client, _ = served(Lending(host_memory_cap=4 * GIB))
    client.admit("a", SliceLimits(3 * GIB, 10))
    client.admit("b", SliceLimits(3 * GIB, 10))
    client.suspend("a", host_memory=3 * GIB)
    with pytest.raises(NotSupported, match=r"hold 3GiB of host memory and may hold 4GiB together"):
        client.suspend("b", host_memory=3 * GIB)
    assert not client.get("b").suspended
    assert client.devices_usage()[0].memory_allocated == 3 * GIB  # b's, not lent
    client.resume("a")
    assert client.suspend("b", host_memory=3 * GIB).suspended


def test_a_suspend_is_refused_while_the_check_sees_the_slices_processes_on_the_gpu(served):
    held = {4242: GIB}
    checked = []

    def still_held(allocation):
        checked.append(allocation.kernel_id)
        return dict(held)

    client, _ = served(Lending(still_held=still_held))
    client.admit("a", SliceLimits(2 * GIB, 10))
    with pytest.raises(NotSupported, match=r"still \(pid 4242 \(1GiB\)\)"):
        client.suspend("a", host_memory=GIB)
    assert not client.get("a").suspended and checked == ["a"]
    held.clear()
    assert client.suspend("a", host_memory=GIB).suspended


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/allocations/a/suspend", {}, 400, "the request body lacks 'host_memory'"),
        ("/allocations/a/suspend", {"host_memory": -1}, 400, "host_memory must be zero or more bytes, not -1"),
        ("/allocations/a/suspend", {"host_memory": "1GiB"}, 400, "host_memory must be a whole number"),
        ("/allocations/a/suspend", {"host_memory": 1, "when": 2}, 400, "unknown field 'when'; it takes host_memory"),
        ("/allocations/nobody/suspend", {"host_memory": 1}, 404, "no slice is held for kernel 'nobody'"),
        ("/allocations/nobody/resume", {}, 404, "no slice is held for kernel 'nobody'"),
        ("/allocations/a/metadata", {"suspended": {"host_memory": 0}}, 400, "'suspended' is set by POST .../suspend"),
        # Whose kernel makes room is the service's decision: never asked, nor declined, by metadata.
        *(
            ("/allocations/a/metadata", {"suspend_requested": value}, 400, "'suspend_requested' is set by the service")
            for value in ({"at": 0}, None, "yes")
        ),
    ],
)
def test_bad_suspend_requests_get_a_clear_refusal(served, path, body, status, message):
    client, ledger = served()
    client.admit("a", SliceLimits(2 * GIB, 10))
    got, _headers, data = http_request(
        client.url.removesuffix(PREFIX),
        "POST" if "metadata" not in path else "PATCH",
        PREFIX + path,
        body,
        {"Authorization": f"token {TOKEN}"},
    )
    assert got == status, data
    assert message in json.loads(data)["message"]
    assert not ledger.get("a").suspended


def report(client: RemoteLedger, kernel_id: str, *, busy: bool, last_activity: float):
    """What a user's server reports of its kernel at a tick (server/room.py)."""
    return client.update_metadata(kernel_id, activity={"busy": busy, "last_activity": last_activity})


def requested(client: RemoteLedger) -> set[str]:
    return {a.kernel_id for a in client.allocations() if a.metadata.get(SUSPEND_REQUESTED_KEY) is not None}


def test_a_start_that_does_not_fit_asks_the_longest_idle_kernels_not_running_a_cell_to_suspend(served):
    now = [10_000.0]
    client, _ = served(Lending(make_room=True, clock=lambda: now[0]))
    for kernel_id in ("busy", "recent", "oldest", "older", "silent"):
        client.admit(kernel_id, SliceLimits(3 * GIB, 10))
    report(client, "busy", busy=True, last_activity=0.0)  # idle longest, but a cell runs now
    report(client, "recent", busy=False, last_activity=9_000.0)
    report(client, "oldest", busy=False, last_activity=1_000.0)
    report(client, "older", busy=False, last_activity=2_000.0)
    # "silent": its server reports nothing (no suspend policy there): never picked.

    # 1 GiB free, 6 GiB asked for: the two kernels idle longest make room.
    with pytest.raises(CapacityError) as refused:
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert refused.value.making_room.startswith("2 idle kernels on GPU 0 are being suspended to make room")
    assert refused.value.making_room in str(refused.value)
    assert requested(client) == {"oldest", "older"}
    assert client.get("oldest").metadata[SUSPEND_REQUESTED_KEY] == {"at": now[0]}

    # Asked again before they are suspended: the same two, not more.
    with pytest.raises(CapacityError, match="2 idle kernels"):
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert requested(client) == {"oldest", "older"}

    # "older" ran a cell since: its server's report withdraws the request, another is asked.
    assert report(client, "older", busy=True, last_activity=now[0]).metadata[SUSPEND_REQUESTED_KEY] is None
    with pytest.raises(CapacityError, match="2 idle kernels"):
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert requested(client) == {"oldest", "recent"}

    # A suspend carries the request out (and clears it).
    assert client.suspend("oldest", host_memory=GIB).metadata[SUSPEND_REQUESTED_KEY] is None

    # Not enough idle kernels to make room: a plain refusal, nobody asked.
    with pytest.raises(CapacityError) as refused:
        client.admit("huge", SliceLimits(15 * GIB, 10))
    assert not refused.value.making_room


def two_idle_kernels(client, longer: str, shorter: str) -> None:
    """Two 6 GiB kernels, idle and reported so: `longer` idle since 1000, `shorter` since 2000."""
    for kernel_id, idle_since in ((longer, 1_000.0), (shorter, 2_000.0)):
        client.admit(kernel_id, SliceLimits(6 * GIB, 10))
        report(client, kernel_id, busy=False, last_activity=idle_since)


def test_a_request_not_carried_out_in_time_is_not_counted_on_and_a_resume_makes_room_too(served):
    now = [10_000.0]
    client, _ = served(Lending(make_room=True, clock=lambda: now[0]))
    two_idle_kernels(client, "stuck", "idle")
    with pytest.raises(CapacityError, match="1 idle kernel on GPU 0 is being suspended"):
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert requested(client) == {"stuck"}
    now[0] += SUSPEND_REQUEST_TIMEOUT_S + 1  # its server did not (it cannot checkpoint that kernel)
    with pytest.raises(CapacityError, match="1 idle kernel"):
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert requested(client) == {"stuck", "idle"}
    client.suspend("idle", host_memory=GIB)
    client.admit("new", SliceLimits(6 * GIB, 10))
    report(client, "new", busy=False, last_activity=3_000.0)

    # "idle" resumes: its room is taken; the idle "new" is asked to make it.
    with pytest.raises(CapacityError, match="1 idle kernel on GPU 0 is being suspended") as refused:
        client.resume("idle")
    assert refused.value.resource == "memory"
    assert requested(client) == {"stuck", "new"}


def test_a_kernel_that_resumed_is_not_asked_to_suspend_on_the_report_made_before_its_suspend(served):
    now = [10_000.0]
    client, _ = served(Lending(make_room=True, clock=lambda: now[0]))
    two_idle_kernels(client, "back", "other")
    client.suspend("back", host_memory=6 * GIB)
    # A cell runs in "back": it resumes before its server's next tick reports it busy.
    assert client.resume("back").metadata.get("activity") is None
    with pytest.raises(CapacityError, match="1 idle kernel on GPU 0 is being suspended"):
        client.admit("new", SliceLimits(6 * GIB, 10))
    assert requested(client) == {"other"}


def test_kernels_whose_suspend_the_host_memory_cap_would_refuse_are_not_asked(served):
    client, _ = served(Lending(make_room=True, host_memory_cap=5 * GIB))
    for kernel_id, idle_since in (("big", 1_000.0), ("small", 2_000.0), ("held", 3_000.0)):
        client.admit(kernel_id, SliceLimits({"big": 6, "small": 4, "held": 3}[kernel_id] * GIB, 10))
        report(client, kernel_id, busy=False, last_activity=idle_since)
    client.suspend("held", host_memory=GIB)  # 1 GiB of the 5 in host memory; 6 GiB free on the GPU
    with pytest.raises(CapacityError, match="1 idle kernel on GPU 0"):
        client.admit("new", SliceLimits(10 * GIB, 10))  # "big", idle longer, would not fit in host memory
    assert requested(client) == {"small"}
    with pytest.raises(CapacityError) as refused:
        client.admit("new", SliceLimits(14 * GIB, 10))
    assert not refused.value.making_room


def test_kernels_that_hold_nothing_on_the_gpu_are_asked_first_and_take_no_host_memory(served):
    client, _ = served(Lending(make_room=True, host_memory_cap=GIB))
    for kernel_id in ("oldest", "unused"):
        client.admit(kernel_id, SliceLimits(6 * GIB, 10))
    report(client, "oldest", busy=False, last_activity=1_000.0)  # holds its memory (no uses_gpu: assumed)
    client.update_metadata("unused", activity={"busy": False, "last_activity": 5_000.0, "uses_gpu": False})
    # 4 GiB free, 8 GiB asked for: the kernel that holds nothing is lent, though idle for less,
    # and its 6 GiB need no host memory (the cap of 1 GiB would refuse the other's suspend).
    with pytest.raises(CapacityError, match="1 idle kernel on GPU 0"):
        client.admit("new", SliceLimits(8 * GIB, 10))
    assert requested(client) == {"unused"}
