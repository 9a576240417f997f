"""One fair line across students (issue 25): the real broker process (`jupyter vgpu broker
--classroom FILE`, the stand-in hub of test_broker_suspend.py) and two real Jupyter servers, bob's
and alice's, each starting a kernel through the broker on its one 1 GiB simulated GPU, where only
one 768 MiB kernel fits. Bob asks first; alice's server is the one that keeps trying while bob's
is held up (stopped, as a loaded or slow server is), so without one line at the broker alice
would overtake him the moment room comes."""

from __future__ import annotations

import signal
import time

from support import VGPUServer, hold_outside, wait_for
from test_broker_suspend import broker  # noqa: F401 -- the fixture

from jupyter_vgpu.ledger.remote import RemoteLedger

MIB = 1 << 20
SERVER_OPTIONS = ("--VGPUApp.default_cores=40", "--VGPUApp.default_policy=burst")


def registration(ledger: RemoteLedger, kernel_id: str) -> dict | None:
    """The kernel's entry in the broker's line (as its owner sees it), or None."""
    line = ledger._call("GET", "/line", read=lambda reply: reply["line"])
    return next((entry for entry in line if entry["kernel_id"] == kernel_id), None)


def test_a_student_who_asked_later_does_not_overtake_one_who_asked_earlier(broker, tmp_path):  # noqa: F811
    url, env, _ = broker
    service = url.rpartition("/ledger")[0]
    outside = hold_outside(env, 1024 * MIB)  # the whole GPU, held outside any slice: nothing fits
    servers = {
        name: VGPUServer(
            tmp_path / name,
            env,
            f"--VGPUApp.broker_url={service}",
            f"--VGPUApp.broker_token={name}-token",
            *SERVER_OPTIONS,
            memory="768MiB",
        )
        for name in ("bob", "alice")
    }
    ledgers = {name: RemoteLedger(url, f"{name}-token", timeout=10) for name in servers}
    bob_server, alice_server = servers["bob"], servers["alice"]
    try:
        bob_kernel = bob_server.api("POST", "api/kernels", {"name": bob_server.kernel_name})["id"]
        wait_for(lambda: registration(ledgers["bob"], bob_kernel), 60, "bob's start in the broker's line")
        alice_kernel = alice_server.api("POST", "api/kernels", {"name": alice_server.kernel_name})["id"]
        wait_for(lambda: registration(ledgers["alice"], alice_kernel), 60, "alice's start in the broker's line")
        assert alice_server.slice_of(alice_kernel)["queue"]["waiting_for"] == (
            "its turn: 1 request of the node's users asked earlier for room on any GPU and waits ahead of it"
        )

        # Bob's server is held up; room comes; alice's server tries again and again.
        bob_server.process.send_signal(signal.SIGSTOP)
        outside.stdin.close()
        outside.wait(30)
        wait_for(lambda: ledgers["alice"].devices_usage()[0].memory_free >= 768 * MIB, 30, "the broker to see the room")
        room_came = time.time()
        wait_for(
            lambda: (registration(ledgers["alice"], alice_kernel) or {}).get("renewed", 0) > room_came,
            30,
            "alice's server to try after the room came",
        )
        tried = registration(ledgers["alice"], alice_kernel)["renewed"]
        # A later renewal: the attempt that followed the first one after the room came has been answered.
        wait_for(
            lambda: (registration(ledgers["alice"], alice_kernel) or {}).get("renewed", 0) > tried,
            30,
            "alice's server to try again",
        )
        assert alice_server.slice_of(alice_kernel)["state"] == "queued"
        assert [allocation.kernel_id for allocation in ledgers["alice"].allocations()] == []

        # Bob's server carries on: his kernel gets the room; alice's waits for the next.
        bob_server.process.send_signal(signal.SIGCONT)
        wait_for(lambda: bob_server.slice_of(bob_kernel)["state"] != "queued", 60, "bob's kernel to start")
        assert registration(ledgers["bob"], bob_kernel) is None
        assert alice_server.slice_of(alice_kernel)["state"] == "queued"
    finally:
        bob_server.process.send_signal(signal.SIGCONT)
        if outside.poll() is None:
            outside.stdin.close()
            outside.wait(30)
        for server in servers.values():
            server.stop()
        for ledger in ledgers.values():
            ledger.close()
