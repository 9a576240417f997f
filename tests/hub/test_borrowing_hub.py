"""Guarantees and borrowing in a classroom (issue 25, item 4) on a real JupyterHub: the hub behind
configurable-http-proxy, the broker as its managed service, alice's and bob's servers started by
SimpleLocalProcessSpawner, their kernels on the simulated GPU (one 3 GiB GPU).

Their size guarantees 1 GiB and 20 % and may borrow 2 GiB and 30 % more. Bob borrows the whole GPU
and runs a long cell; alice starts a kernel within her guarantee: the broker takes bob's borrowed
room back (his kernel is suspended mid-cell, its CUDA calls wait and say why), alice's kernel runs
within seconds, and when alice stops, bob's cell carries on and ends with the right result.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hub_process import Hub, HubError, kernel_connection_file, run_in_hub_kernel
from support import CUDA_PRELUDE, wait_for

pytestmark = pytest.mark.timeout(600)

CLASSROOM = """
gpus: {count: 1, memory: 3GiB}
groups:
  students: [alice, bob]
sizes:
  - name: small
    memory: 1GiB
    cores: 20
    policy: burst
    default: true
    kernel: {memory: 1GiB, cores: 20}
    borrow: {memory: 2GiB, cores: 30}
# room_hold 0: kernels started a moment ago make room at once (the hold has its own tests)
idle: {suspend_after: 1h, suspend_host_memory: 8GiB, room_hold: 0}
"""
# The simulated GPU's shared state is this hub's own, so no other test's simulated device is touched.
OWN_SIMULATED_GPU = """
import os
SIM_STATE = {"VGPU_SIM_STATE": os.path.join(os.getcwd(), "simulated-gpu.state")}
for service in c.JupyterHub.services:
    if service["name"] == "vgpu":
        service["environment"] = {**service.get("environment", {}), **SIM_STATE}
c.Spawner.environment.update(SIM_STATE)
"""
PAUSED = "paused: room on GPU 0 was taken back for a student within their guarantee; carries on when room frees"
# Bob's long cell: a pattern in 64 MiB of the GPU, then a CUDA call (cuMemGetInfo, which waits in
# libvgpu.so while the slice is held back) and a read of the GPU every step, each step counted
# in a file, until the test says stop; then the whole pattern is read back and compared.
BOBS_CELL = (
    CUDA_PRELUDE
    + """
import hashlib, os
size = 64 << 20
pattern = bytes(range(256)) * (size // 256)
pointer = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) == 0
assert cuda.cuMemcpyHtoD_v2(pointer, pattern, ctypes.c_size_t(size)) == 0
print("cell started", flush=True)
steps, page = 0, ctypes.create_string_buffer(4096)
while not os.path.exists(STOP):
    memory()
    assert cuda.cuMemcpyDtoH_v2(page, pointer, ctypes.c_size_t(4096)) == 0
    steps += 1
    with open(STEPS, "w") as counted:
        counted.write(str(steps))
    time.sleep(0.02)
whole = ctypes.create_string_buffer(size)
assert cuda.cuMemcpyDtoH_v2(whole, pointer, ctypes.c_size_t(size)) == 0
print("result", hashlib.sha256(whole.raw).hexdigest() == hashlib.sha256(pattern).hexdigest(), flush=True)
"""
)
ALLOCATE_512_MIB = CUDA_PRELUDE + "\nprint(allocate(512 << 20))\n"


class CellInThread:
    """A cell running in a hub kernel, its stdout and stderr collected as they come."""

    def __init__(self, hub: Hub, user: str, kernel_id: str, code: str):
        from jupyter_client import BlockingKernelClient

        self.client = BlockingKernelClient(connection_file=str(kernel_connection_file(hub, user, kernel_id)))
        self.client.load_connection_file()
        self.output: list[str] = []
        self.reply: dict | None = None
        self.thread = threading.Thread(target=self._run, args=(code,), daemon=True)
        self.thread.start()

    def _run(self, code: str) -> None:
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=60)

            def collect(message):
                if message["msg_type"] == "stream":
                    self.output.append(message["content"]["text"])
                elif message["msg_type"] == "error":
                    self.output.append("\n".join(message["content"]["traceback"]))

            self.reply = self.client.execute_interactive(code, output_hook=collect, timeout=300)
        finally:
            self.client.stop_channels()

    def said(self, text: str) -> bool:
        return text in "".join(self.output)


def allocations(hub: Hub, token: str) -> dict[str, dict]:
    status, reply = hub.broker("GET", "ledger/allocations", token)
    assert status == 200, reply
    return {allocation["kernel_id"]: allocation for allocation in reply["allocations"]}


def answers(hub: Hub, user: str, kernel_id: str) -> bool:
    """Whether the kernel answers a kernel_info request (a client gives up on a kernel whose
    heartbeat has not begun within a second, as on a loaded machine while it still starts)."""
    from jupyter_client import BlockingKernelClient

    try:
        client = BlockingKernelClient(connection_file=str(kernel_connection_file(hub, user, kernel_id)))
    except HubError:
        return False  # no connection file yet
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=10)
        return True
    except RuntimeError:
        return False
    finally:
        client.stop_channels()


def steps(path: Path) -> int:
    return int(path.read_text() or 0) if path.exists() else 0


def test_a_borrowers_kernel_is_paused_mid_cell_for_a_student_within_her_guarantee_and_carries_on_when_she_stops(
    tmp_path,
):
    (tmp_path / "hub").mkdir()
    hub = Hub(tmp_path / "hub", CLASSROOM, extra_config=OWN_SIMULATED_GPU)
    try:
        alice, bob = hub.user_token("alice"), hub.user_token("bob")
        hub.start_server("alice", {})
        hub.start_server("bob", {})

        # Bob borrows: 3 GiB and 50 %, above his 1 GiB, 20 % guarantee, the whole GPU.
        status, started = hub.server("bob", bob, "POST", "api/vgpu/kernels", {"memory": "3GiB", "cores": 50})
        assert status == 201, started
        bobs = started["kernel"]["id"]
        assert allocations(hub, bob)[bobs]["metadata"].get("borrowing"), allocations(hub, bob)[bobs]
        stop, counted = tmp_path / "stop-bobs-cell", tmp_path / "bobs-steps"
        code = f"STOP, STEPS = {str(stop)!r}, {str(counted)!r}\nimport time\n" + BOBS_CELL
        wait_for(lambda: answers(hub, "bob", bobs), 120, "bob's kernel answering", interval=0.1)
        cell = CellInThread(hub, "bob", bobs, code)
        wait_for(lambda: steps(counted) > 0, 60, "bob's cell running", interval=0.1)

        # Alice starts within her guarantee: answered at once, admitted once bob's kernel gave its
        # room back, mid-cell.
        asked = time.monotonic()
        status, reply = hub.start_kernel("alice", alice)
        assert status == 201, reply
        alices = reply["id"]
        wait_for(lambda: alices in allocations(hub, alice), 60, "alice's kernel admitted", interval=0.1)
        admitted_after = time.monotonic() - asked
        paused = allocations(hub, bob)[bobs]
        assert paused["metadata"].get("suspended"), paused
        assert cell.thread.is_alive() and cell.reply is None  # the cell still runs: nothing was killed
        wait_for(lambda: cell.said(PAUSED), 30, f"bob's cell to say {PAUSED!r}", interval=0.1)

        # Alice's kernel runs on the room bob gave back; bob's cell makes no progress meanwhile.
        before = steps(counted)
        wait_for(lambda: answers(hub, "alice", alices), 120, "alice's kernel answering", interval=0.1)
        assert run_in_hub_kernel(hub, "alice", alices, ALLOCATE_512_MIB).strip() == "0"  # CUDA_SUCCESS
        ran_after = time.monotonic() - asked
        assert steps(counted) == before
        assert allocations(hub, bob)[bobs]["metadata"].get("suspended")

        # Alice stops: bob's kernel takes its room back and his cell carries on to its result.
        status, _ = hub.server("alice", alice, "DELETE", f"api/kernels/{alices}")
        assert status == 204
        wait_for(lambda: not allocations(hub, bob)[bobs]["metadata"].get("suspended"), 60, "bob's kernel resumed", 0.1)
        wait_for(lambda: steps(counted) > before, 60, "bob's cell carrying on", interval=0.1)
        stop.write_text("")
        cell.thread.join(120)
        assert cell.reply is not None and cell.reply["content"]["status"] == "ok", "".join(cell.output)
        assert "result True" in "".join(cell.output), "".join(cell.output)
        print(f"alice's kernel admitted {admitted_after:.1f} s and her cell done {ran_after:.1f} s after her start")
    finally:
        hub.stop()
