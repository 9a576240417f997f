"""The node's broker lends a suspended kernel's GPU memory (issue 18): the real broker process
(`jupyter vgpu broker --classroom FILE`) on a simulated GPU, its kernels real processes on that
GPU (tests/programs/checkpoint_probe.c), checkpointed by the real controller in a process of its
own as a user's server does, and two users asking through RemoteLedger with their own tokens.
Making room across users: alice's server (RemoteLedger, SliceManager, SuspendedKernels and
RoomForOthers in a process of its own) reports her kernel's activity and suspends it when bob's
start makes the broker ask it to.

JupyterHub is a stand-in here (support.json_stand_in): it answers the two questions the broker
asks a hub (whose token is this; which size did this user's server start with), so that this
test runs in seconds; tests/hub/test_classroom_hub.py runs the broker under a real hub.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support import JUPYTER, checkpoint_controller, free_port, json_stand_in, wait_for

from jupyter_vgpu.holders.region import LimitsPage
from jupyter_vgpu.hub.broker import ADMIN_SCOPE, USE_SCOPE
from jupyter_vgpu.ledger import SUSPEND_REQUESTED_KEY, CapacityError, NotSupported
from jupyter_vgpu.ledger.remote import RemoteLedger, SliceForbidden
from jupyter_vgpu.manager import SliceManager, SliceRefused, start_refusal
from jupyter_vgpu.model import SliceLimits, SliceValueError

MIB = 1 << 20
BROKER_TOKEN = "the-brokers-own-token"
TOKENS = {"alice-token": "alice", "bob-token": "bob"}
TEACHER_TOKEN = "teachers-token"  # reads the broker's metrics
# One 1 GiB GPU (the simulator's device memory holds data: small, so the test is quick); each
# user's size is 768 MiB, so two kernels do not fit on it together.
CLASSROOM = """
gpus: {count: 1, memory: 1GiB}
simulate: true
broker: {state_dir: broker-state}
sizes:
  - {name: small, memory: 768MiB, cores: 40, policy: burst, default: true, kernel: {memory: 768MiB, cores: 40}}
oversubscribe: true
# room_hold 0: kernels started a moment ago make room at once (the hold has its own tests)
idle: {suspend_after: 10m, suspend_host_memory: 2GiB, room_hold: 0}
"""
SLICE = SliceLimits(768 * MIB, 40, "burst")


def stand_in_hub(method, path, body, headers):
    """What the broker asks the hub: GET /hub/api/user (a user's token) and /hub/api/users/<name>."""
    token = headers.get("Authorization", "").partition(" ")[2].strip()
    if path.split("?")[0] == "/hub/api/user" and token == TEACHER_TOKEN:
        return 200, {"kind": "user", "name": "teacher", "groups": [], "scopes": [ADMIN_SCOPE]}
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


def broker_metrics_text(ledger_url: str) -> str:
    request = urllib.request.Request(
        ledger_url.rpartition("/")[0] + "/metrics", headers={"Authorization": f"token {TEACHER_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read().decode()


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
    # The teacher's board (docs/grafana/jupyter-vgpu-classroom.json) sees it suspended.
    metrics = broker_metrics_text(url)
    assert re.search(r'^vgpu_device_suspended_slices\{device="0",uuid="GPU-[^"]+"\} 1\.0$', metrics, re.MULTILINE)
    host = re.search(
        r'^vgpu_device_suspended_host_memory_bytes\{device="0",uuid="GPU-[^"]+"\} (\S+)$', metrics, re.MULTILINE
    )
    assert host and float(host.group(1)) == 700 * MIB, metrics
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


# Alice's server, as far as making room goes, in a process of its own on the broker's simulated
# GPU: her RemoteLedger, a SliceManager with the local holder reading the broker's limits pages,
# and the server's SuspendedKernels and RoomForOthers over a kernel manager that knows her one
# kernel. Each line on stdin, {"busy": bool, "last_activity": epoch seconds}, is that kernel's
# state for one tick of her slice watcher; it answers her slice as the broker then holds it.
ALICES_SERVER = r"""
import asyncio, datetime, json, sys
from pathlib import Path
from jupyter_vgpu.model.devices import use_simulator
use_simulator()
from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.manager import SliceManager
from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.server.room import RoomForOthers
from jupyter_vgpu.server.suspend import SuspendedKernels

url, regions, limits, kernel_id = sys.argv[1:5]
ledger = RemoteLedger(url, "alice-token", timeout=30)
manager = SliceManager(ledger, [LocalHolder(Path(regions), simulate=True, limits_dir=Path(limits))], SliceLimits(1 << 30))

class Kernel:
    execution_state, last_activity = "idle", None

class Kernels(dict):
    def get_kernel(self, kernel_id):
        return self[kernel_id]

kernels = Kernels({kernel_id: Kernel()})
room = RoomForOthers(SuspendedKernels(manager, kernels, suspend_after=600, lock_timeout=5))
manager.admit(kernel_id, SliceLimits(768 << 20, 40, "burst"), owner="alice")
print(json.dumps({"admitted": kernel_id}), flush=True)
for line in sys.stdin:
    state = json.loads(line)
    kernel = kernels[kernel_id]
    kernel.execution_state = "busy" if state["busy"] else "idle"
    kernel.last_activity = datetime.datetime.fromtimestamp(state["last_activity"], datetime.timezone.utc)
    asyncio.run(room.check(ledger.allocations()))
    print(json.dumps(ledger.get(kernel_id).metadata), flush=True)
"""


class AlicesServer:
    def __init__(self, url: str, env: dict[str, str], tmp_path: Path, broker_dir: Path):
        pipe = subprocess.PIPE
        command = [sys.executable, "-c", ALICES_SERVER, url, str(tmp_path / "alice-regions")]
        command += [str(broker_dir / "limits"), "alice-kernel"]
        self.process = subprocess.Popen(command, env=env, stdin=pipe, stdout=pipe, stderr=pipe, text=True)
        assert "admitted" in self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        assert line, self.process.stderr.read()
        return json.loads(line)

    def tick(self, *, busy: bool, last_activity: float) -> dict:
        """One tick of her slice watcher with her kernel in that state: her slice's metadata after it."""
        self.process.stdin.write(json.dumps({"busy": busy, "last_activity": last_activity}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(30)


def test_a_start_that_does_not_fit_gets_another_users_idle_kernel_suspended_by_its_own_server(
    broker, checkpoint_targets, tmp_path
):
    url, env, broker_dir = broker
    alice, bob = RemoteLedger(url, "alice-token", timeout=30), RemoteLedger(url, "bob-token", timeout=30)
    server = AlicesServer(url, env, tmp_path, broker_dir)
    kernel = checkpoint_targets(env, "700M")  # alice's kernel, with a pattern in 700 MiB of the GPU
    start_time = int(Path(f"/proc/{kernel.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    alice.update_metadata("alice-kernel", provisioner_info={"pid": kernel.pid, "pid_start_time": start_time})

    # Her kernel runs a cell: it is never picked, and bob is told no more than that it does not fit.
    reported = server.tick(busy=True, last_activity=time.time())
    assert reported["activity"]["busy"] is True
    with pytest.raises(CapacityError) as refused:
        bob.admit("bob-kernel", SLICE)
    assert not refused.value.making_room and "being suspended" not in str(refused.value)
    assert alice.get("alice-kernel").metadata.get(SUSPEND_REQUESTED_KEY) is None

    # Idle for ten minutes: bob's start asks her server to suspend it, and says so.
    idle_since = time.time() - 600
    server.tick(busy=False, last_activity=idle_since)
    with pytest.raises(CapacityError) as refused:
        bob.admit("bob-kernel", SLICE)
    assert refused.value.making_room.startswith("1 idle kernel on GPU 0 is being suspended to make room")
    assert "try again in a few seconds" in start_refusal(refused.value)
    asked = alice.get("alice-kernel").metadata[SUSPEND_REQUESTED_KEY]
    assert isinstance(asked["at"], float)

    # Bob's server puts the start in its line, trying again, saying what it waits for; her server
    # does not tick meanwhile, so it waits until bob shuts it down, which takes it out of the line.
    bobs_server = SliceManager(bob, [], SliceLimits(MIB))

    async def waits_in_line() -> str:
        start = asyncio.ensure_future(bobs_server.admit_in_line("bob-kernel", SLICE, owner="bob"))
        await bobs_server.line.joined("bob-kernel")
        waiting_for = bobs_server.line.get("bob-kernel").waiting_for
        bobs_server.line.leave("bob-kernel", "shut down")
        with pytest.raises(SliceRefused, match="left the line"):
            await start
        return waiting_for

    assert "1 idle kernel on GPU 0 is being suspended to make room" in asyncio.run(waits_in_line())
    assert "bob-kernel" not in bobs_server.line and bob.get("bob-kernel") is None
    asked = alice.get("alice-kernel").metadata[SUSPEND_REQUESTED_KEY]

    # Nobody sets or clears a request through metadata: not bob on hers, not alice on her own.
    for who, value in ((bob, {"at": 0}), (alice, None), (alice, {"at": 0})):
        with pytest.raises(SliceValueError, match="'suspend_requested' is set by the service"):
            who.update_metadata("alice-kernel", suspend_requested=value)
    with pytest.raises(SliceForbidden):
        bob.update_metadata("alice-kernel", activity={"busy": False, "last_activity": 0})
    assert alice.get("alice-kernel").metadata[SUSPEND_REQUESTED_KEY] == asked

    # She runs a cell before her server's tick: the request is withdrawn, her kernel runs on.
    reported = server.tick(busy=True, last_activity=time.time())
    assert reported.get(SUSPEND_REQUESTED_KEY) is None and "suspended" not in reported
    server.tick(busy=False, last_activity=time.time())
    assert not alice.get("alice-kernel").suspended

    # Bob tries again: asked again, and her server's next tick suspends it through the broker
    # (which lends the room only once NVML lists none of her kernel's processes).
    with pytest.raises(CapacityError, match="is being suspended to make room"):
        bob.admit("bob-kernel", SLICE)
    reported = server.tick(busy=False, last_activity=reported["activity"]["last_activity"])
    assert reported["suspended"]["host_memory"] == 700 * MIB
    assert reported.get(SUSPEND_REQUESTED_KEY) is None
    assert reported["suspend_notice"].startswith("suspended to make room for another user's kernel: 700MiB")
    bob.admit("bob-kernel", SLICE)

    # Her next cell resumes it once bob's kernel is gone, intact.
    bob.release("bob-kernel")
    assert not alice.resume("alice-kernel").suspended
    checkpoint_controller(env, "resume", processes=reported["suspended"]["processes"])
    assert kernel.ask("verify", "intact") == "1"
    server.close()
    alice.close()
    bob.close()
