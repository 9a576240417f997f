"""The node's broker lends a suspended kernel's GPU memory (issue 18): the real broker process
(`jupyter vgpu broker --classroom FILE`) on a simulated GPU, its kernels real processes on that
GPU (tests/programs/checkpoint_probe.c), checkpointed by the real controller in a process of its
own as a user's server does, and two users asking through RemoteLedger with their own tokens.

JupyterHub is a stand-in here (support.json_stand_in): it answers the two questions the broker
asks a hub (whose token is this; which size did this user's server start with), so that this
test runs in seconds; tests/hub/test_classroom_hub.py runs the broker under a real hub.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import JUPYTER, checkpoint_controller, free_port, json_stand_in, wait_for

from jupyter_vgpu.holders.region import LimitsPage
from jupyter_vgpu.hub.broker import USE_SCOPE
from jupyter_vgpu.ledger import CapacityError, NotSupported
from jupyter_vgpu.ledger.remote import RemoteLedger, SliceForbidden
from jupyter_vgpu.model import SliceLimits, SliceValueError

MIB = 1 << 20
BROKER_TOKEN = "the-brokers-own-token"
TOKENS = {"alice-token": "alice", "bob-token": "bob"}
# One 1 GiB GPU (the simulator's device memory holds data: small, so the test is quick); each
# user's size is 768 MiB, so two kernels do not fit on it together.
CLASSROOM = """
gpus: {count: 1, memory: 1GiB}
simulate: true
broker: {state_dir: broker-state}
sizes:
  - {name: small, memory: 768MiB, cores: 40, policy: burst, default: true, kernel: {memory: 768MiB, cores: 40}}
oversubscribe: true
idle: {suspend_after: 10m, suspend_host_memory: 2GiB}
"""
SLICE = SliceLimits(768 * MIB, 40, "burst")


def stand_in_hub(method, path, body, headers):
    """What the broker asks the hub: GET /hub/api/user (a user's token) and /hub/api/users/<name>."""
    token = headers.get("Authorization", "").partition(" ")[2].strip()
    if path.split("?")[0] == "/hub/api/user" and token in TOKENS:
        name = TOKENS[token]
        return 200, {"kind": "user", "name": name, "groups": [], "scopes": [f"{USE_SCOPE}!user={name}"]}
    name = path.split("?")[0].rpartition("/")[2]
    if path.startswith("/hub/api/users/") and token == BROKER_TOKEN and name in TOKENS.values():
        return 200, {"kind": "user", "name": name, "groups": [], "servers": {"": {"user_options": {}}}}
    return 403, {"message": "the stand-in hub does not know this token"}


@pytest.fixture
def broker(tmp_path, sim_env):
    """(the ledger URL, the environment of a process on the broker's simulated GPU)."""
    classroom = tmp_path / "classroom.yaml"
    classroom.write_text(CLASSROOM)
    port = free_port()
    env = {
        **sim_env,
        # The broker's simulated node, as the classroom file makes it (its devices and state).
        "VGPU_SIM_DEVICES": "name=jupyter-vgpu simulated GPU,memory=1024MiB,sms=100,context_memory=0",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    with json_stand_in(stand_in_hub) as hub_url:
        service_env = {
            **env,
            "JUPYTERHUB_API_URL": f"{hub_url}hub/api",
            "JUPYTERHUB_API_TOKEN": BROKER_TOKEN,
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/vgpu/",
        }
        log = (tmp_path / "broker.log").open("wb")
        process = subprocess.Popen(
            [JUPYTER, "vgpu", "broker", "--classroom", str(classroom)],
            cwd=tmp_path,
            env=service_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}/services/vgpu/ledger"
        try:

            def answers() -> bool:
                assert process.poll() is None, (tmp_path / "broker.log").read_text()
                try:
                    RemoteLedger(url, "alice-token", timeout=5).devices  # noqa: B018 -- a request
                except Exception:  # noqa: BLE001 -- not listening yet
                    return False
                return True

            wait_for(answers, 60, "the broker to answer", interval=0.1)
            yield url, env, tmp_path / "broker-state"
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
            log.close()


def test_the_broker_lends_a_suspended_kernels_memory_only_once_nvml_shows_it_holds_none(broker, checkpoint_targets):
    url, env, broker_dir = broker
    alice, bob = RemoteLedger(url, "alice-token", timeout=30), RemoteLedger(url, "bob-token", timeout=30)
    alice.admit("alice-kernel", SLICE)
    kernel = checkpoint_targets(env, "700M")  # alice's kernel, with a pattern in 700 MiB of the GPU
    start_time = int(Path(f"/proc/{kernel.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    # What her server records for each kernel: the broker finds the kernel's processes by it.
    alice.update_metadata("alice-kernel", provisioner_info={"pid": kernel.pid, "pid_start_time": start_time})
    with pytest.raises(CapacityError):
        bob.admit("bob-kernel", SLICE)

    # A "suspended" kernel that still holds its memory: the broker does not lend on a claim.
    with pytest.raises(
        NotSupported, match=rf"NVML lists its processes on the GPU still \(pid {kernel.pid} \(700MiB\)\)"
    ):
        alice.suspend("alice-kernel", host_memory=700 * MIB)
    with pytest.raises(SliceValueError, match="'suspended' is set by POST .../suspend"):
        alice.update_metadata("alice-kernel", suspended={"host_memory": 0})
    assert not alice.get("alice-kernel").suspended
    with pytest.raises(CapacityError):
        bob.admit("bob-kernel", SLICE)

    # Her server checkpoints the kernel (its memory moves to host memory, its pid leaves NVML).
    suspension = checkpoint_controller(env, "suspend", pids=[kernel.pid], lock_timeout=5)
    with pytest.raises(SliceForbidden):
        bob.suspend("alice-kernel", host_memory=700 * MIB)  # not his to lend
    suspended = alice.suspend("alice-kernel", host_memory=700 * MIB, details={"processes": suspension["processes"]})
    assert suspended.suspended and suspended.host_memory == 700 * MIB
    # The broker raises its limits page's flag (the kernel's CUDA calls then ask for a resume):
    # the page is the broker's to write, not the user's server's.
    page = LimitsPage.open(broker_dir / "limits" / "alice-kernel.limits", writable=False)
    assert page.suspended
    # The lent memory is bob's now; alice's size still counts her suspended kernel.
    bob.admit("bob-kernel", SLICE)
    with pytest.raises(CapacityError) as over_budget:
        alice.admit("alice-second", SliceLimits(MIB, 1, "burst"))
    assert over_budget.value.resource == "user_memory"

    # Her next cell: admitted again against the device, not while bob holds the memory.
    with pytest.raises(SliceForbidden):
        bob.resume("alice-kernel")
    with pytest.raises(CapacityError, match="cannot resume yet") as waiting:
        alice.resume("alice-kernel")
    assert waiting.value.resource == "memory"
    assert alice.get("alice-kernel").suspended
    bob.release("bob-kernel")
    assert not alice.resume("alice-kernel").suspended
    assert not page.suspended
    page.close()
    checkpoint_controller(env, "resume", processes=suspension["processes"])
    assert kernel.ask("verify", "intact") == "1"
    with pytest.raises(CapacityError):
        bob.admit("bob-kernel", SLICE)
    alice.close()
    bob.close()
