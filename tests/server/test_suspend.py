"""Suspending a kernel to host memory and resuming it (issue 18) through a real server, with real
kernels on the simulated 16 GiB GPU (device 1 of the server tests' machine): the checkpoint API
of the simulated driver moves the kernel's device memory to host memory, the ledger lends the
slice's room, and a resume takes the room back first and then restores the memory, intact.

The server runs in the test's event loop: waiting is polling with ``await``, which lets the
server's periodic watcher run meanwhile."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pynvml
import pytest
from support import written_with_a_pattern
from test_idle_policy import eventually
from tornado.httpclient import HTTPClientError

from jupyter_vgpu.provisioning.base import MANAGER_SETTING
from jupyter_vgpu.server.suspend import SUSPEND_SETTING

GIB, MIB = 1 << 30, 1 << 20
LARGE = 1  # the 16 GiB device of the server tests' simulated machine

# Kernel code (after the CUDA prelude): 12 GiB held, the last 64 MiB of it written with a pattern
# (the simulated driver copies only memory that was written, so the host copy stays small).
HOLD_12_GIB_WITH_A_PATTERN = (
    """
untouched, written = ctypes.c_uint64(), ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(untouched), ctypes.c_size_t((12 << 30) - (64 << 20))) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(written), ctypes.c_size_t(64 << 20)) == 0
"""
    + written_with_a_pattern("written", 64 << 20)
    + "print(intact())\n"
)


@pytest.fixture
def suspend_settings() -> dict:
    """VGPUApp settings of the test's server beyond a fast watcher (a test parametrizes it)."""
    return {}


@pytest.fixture
def jp_server_config(jp_server_config, suspend_settings):
    return {
        **jp_server_config,
        "VGPUApp": {**jp_server_config["VGPUApp"], "watch_interval": 0.2, **suspend_settings},
    }


async def slice_of(jp_fetch, kernel_id: str) -> dict:
    return json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)


def notice_starting(jp_fetch, kernel_id: str, prefix: str):
    """A condition: the slice's notice, once it starts with ``prefix``."""

    async def condition():
        notice = (await slice_of(jp_fetch, kernel_id))["notice"]
        return notice if notice and notice.startswith(prefix) else None

    return condition


async def start_sliced(jp_fetch, kernelspec, **fields) -> str:
    body = json.dumps({"name": kernelspec, **fields})
    response = await jp_fetch("api", "vgpu", "kernels", method="POST", body=body)
    return json.loads(response.body)["kernel"]["id"]


async def post(jp_fetch, kernel_id: str, action: str) -> dict:
    return json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id, action, method="POST", body="")).body)


async def refusal(jp_fetch, kernel_id: str, action: str) -> tuple[int, str]:
    with pytest.raises(HTTPClientError) as refused:
        await post(jp_fetch, kernel_id, action)
    return refused.value.code, json.loads(refused.value.response.body)["message"]


def nvml_device(index: int) -> dict:
    """What NVML (the simulated one, loaded in this process by the server) says of a device."""
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {
            "free": pynvml.nvmlDeviceGetMemoryInfo(handle).free,
            "pids": {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)},
        }
    finally:
        pynvml.nvmlShutdown()


def kernel_pid(jp_serverapp, kernel_id: str) -> int:
    return jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.process.pid


async def kernels_holding(
    jp_fetch, kernelspec, run_in_kernel, cuda_prelude, count: int, held: int, **fields
) -> list[str]:
    """``count`` kernels started on the large GPU with ``fields``, then each holding ``held``
    bytes, in order: the last one was active last."""
    kernels = [await start_sliced(jp_fetch, kernelspec, device=LARGE, **fields) for _ in range(count)]
    for kernel in kernels:
        assert (await run_in_kernel(kernel, cuda_prelude + f"print(allocate({held}))")).strip() == "0"
    return kernels


async def suspended_beside_a_kernel_in_its_room(
    jp_fetch, kernelspec, run_in_kernel, cuda_prelude, b_path: str = ""
) -> tuple[str, str]:
    """A, holding 12 GiB with a pattern (``intact()`` checks it), suspended: off the GPU; then B
    (started for the notebook ``b_path``, where one is given) admitted to the room A lent, holding
    all of its 12 GiB. (A, B)."""
    a = await start_sliced(jp_fetch, kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(a, cuda_prelude + HOLD_12_GIB_WITH_A_PATTERN)).strip() == "True"
    await post(jp_fetch, a, "suspend")
    assert nvml_device(LARGE) == {"free": 16 * GIB, "pids": set()}
    b = await start_sliced(jp_fetch, kernelspec, memory="12GiB", device=LARGE, **({"path": b_path} if b_path else {}))
    assert (await run_in_kernel(b, cuda_prelude + "print(allocate(12 << 30))")).strip() == "0"
    return a, b


async def suspended_when_idle(jp_fetch, kernel_id: str) -> dict:
    """The slice once the idle policy has suspended it and its notice says so."""

    async def suspended():
        model = await slice_of(jp_fetch, kernel_id)
        return model if model["state"] == "suspended" and model["notice"] else None

    return await eventually(suspended, 30, "the idle kernel suspended, with its notice")


async def test_a_suspended_kernels_memory_is_lent_and_comes_back_intact_when_resumed(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    a = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await run_in_kernel(a, cuda_prelude + HOLD_12_GIB_WITH_A_PATTERN)).strip() == "True"
    pid = kernel_pid(jp_serverapp, a)
    assert pid in nvml_device(LARGE)["pids"]

    suspended = await post(jp_fetch, a, "suspend")
    assert (suspended["state"], suspended["host_memory_bytes"]) == ("suspended", 12 * GIB)
    assert nvml_device(LARGE) == {"free": 16 * GIB, "pids": set()}
    devices = json.loads((await jp_fetch("api", "vgpu", "devices")).body)
    assert devices[LARGE]["memory_free_bytes"] == 16 * GIB
    assert (await post(jp_fetch, a, "suspend"))["state"] == "suspended"  # again: as it is
    metrics = (await jp_fetch("api", "vgpu", "metrics")).body.decode()
    uuid = devices[LARGE]["uuid"]
    assert f'vgpu_device_suspended_slices{{device="1",uuid="{uuid}"}} 1.0' in metrics
    assert f'vgpu_device_suspended_host_memory_bytes{{device="1",uuid="{uuid}"}} 1.2884901888e+10' in metrics
    assert f'vgpu_slice_last_suspend_seconds{{device="1",kernel_id="{a}"}}' in metrics
    # Its memory is in host memory: the GPU-memory gauge of the slice says none (the server's board).
    assert f'vgpu_slice_memory_used_bytes{{device="1",kernel_id="{a}",policy="hard"}} 0.0' in metrics

    # Its room is lent: another kernel gets 12 GiB of the 16, and A cannot come back meanwhile.
    b = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    code, message = await refusal(jp_fetch, a, "resume")
    assert code == 409
    assert message.startswith(
        f"kernel {a!r} cannot resume yet: its 12GiB slice needs 12GiB on GPU 1, which has 4GiB free"
    )
    assert nvml_device(LARGE)["pids"] == set()  # nothing was restored

    await jp_fetch("api", "kernels", b, method="DELETE")
    resumed = await post(jp_fetch, a, "resume")
    assert (resumed["state"], resumed["host_memory_bytes"]) == ("running", 0)
    assert pid in nvml_device(LARGE)["pids"]
    assert (await run_in_kernel(a, "print(intact())")).strip() == "True"
    code, message = await refusal(jp_fetch, "no-such-kernel", "resume")
    assert code == 404


async def test_a_kernel_with_managed_memory_is_not_suspended_and_the_refusal_says_why(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", device=LARGE)
    managed = (
        "pointer = ctypes.c_uint64()\nprint(cuda.cuMemAllocManaged(ctypes.byref(pointer), ctypes.c_size_t(1 << 20), 1))"
    )
    assert (await run_in_kernel(kernel, cuda_prelude + managed)).strip() == "0"
    code, message = await refusal(jp_fetch, kernel, "suspend")
    assert code == 409
    assert "the kernel uses managed (unified) memory, which the driver cannot suspend" in message
    assert (json.loads((await jp_fetch("api", "vgpu", "slices", kernel)).body))["state"] == "running"


class Said(logging.Handler):
    """The messages a logger emits, with their levels."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))

    def count(self, level: int, text: str) -> int:
        return sum(1 for levelno, message in self.records if levelno == level and text in message)


@pytest.fixture
def suspend_log(jp_serverapp):
    """What the server's SuspendedKernels logs, DEBUG included."""
    log = jp_serverapp.web_app.settings[SUSPEND_SETTING].log
    logger = getattr(log, "logger", log)  # a LoggerAdapter's logger
    said, level = Said(), logger.level
    logger.addHandler(said)
    logger.setLevel(logging.DEBUG)
    yield said
    logger.removeHandler(said)
    logger.setLevel(level)


async def test_the_next_cell_of_a_suspended_kernel_waits_saying_why_until_its_room_is_free_then_resumes(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_log
):
    """The issue's walk-through: A (12 GiB with a pattern) suspended, B admitted 12 GiB and
    running a cell; A's next cell waits, its notice says for what and names B by its notebook,
    and the server logs that once while it says the same, until B shuts down."""
    a, b = await suspended_beside_a_kernel_in_its_room(
        jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude, b_path="work/b.ipynb"
    )
    # B runs a cell (never suspended to make room), a long one: the kernel's own wait, ended by its shutdown.
    b_cell = await running_a_long_cell(jp_serverapp, b)

    a_cell = asyncio.ensure_future(run_in_kernel(a, "print(intact())"))

    notice = await eventually(notice_starting(jp_fetch, a, "waiting"), 30, "A's notice saying what it waits for")
    assert notice == (
        "waiting for 8GiB more GPU memory (4GiB free) on GPU 1, held by b.ipynb; this kernel resumes when it is free"
    )
    assert not a_cell.done() and (await slice_of(jp_fetch, a))["state"] == "suspended"
    # Tried again at every pass of the line: said once at INFO, the repeats at DEBUG.

    async def repeated_three_times():
        return suspend_log.count(logging.DEBUG, notice) >= 3

    await eventually(repeated_three_times, 30, "three passes of the line that found A's wait unchanged")
    assert suspend_log.count(logging.INFO, notice) == 1, suspend_log.records

    await jp_fetch("api", "kernels", b, method="DELETE")
    b_cell.cancel()
    assert (await asyncio.wait_for(a_cell, 60)).strip() == "True"
    resumed = await slice_of(jp_fetch, a)
    assert (resumed["state"], resumed["notice"], resumed["host_memory_bytes"]) == ("running", None, 0)
    assert kernel_pid(jp_serverapp, a) in nvml_device(LARGE)["pids"]


async def _state_is(jp_serverapp, kernel_id: str, state: str) -> bool:
    return jp_serverapp.kernel_manager.get_kernel(kernel_id).execution_state == state


async def test_resume_makes_room_by_suspending_an_idle_kernel(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    a, b = await suspended_beside_a_kernel_in_its_room(jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude)

    # A runs again while B is idle: B is suspended to make room, and A resumes intact.
    assert (await asyncio.wait_for(run_in_kernel(a, "print(intact())"), 60)).strip() == "True"
    made_room = await slice_of(jp_fetch, b)
    assert (made_room["state"], made_room["host_memory_bytes"]) == ("suspended", 12 * GIB)
    assert made_room["notice"].startswith("suspended to make room for a kernel that ran again: 12GiB moved")
    assert nvml_device(LARGE)["pids"] == {kernel_pid(jp_serverapp, a)}


async def test_a_cuda_call_from_a_background_thread_of_a_suspended_kernel_resumes_it(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, tmp_path
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    # A thread that makes a CUDA call once the test writes to a FIFO: no cell runs then.
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    thread = (
        "import threading\n"
        "def wait_then_call():\n"
        f"    open({str(fifo)!r}).read(1)\n"
        "    memory()\n"
        "worker = threading.Thread(target=wait_then_call)\n"
        "worker.start()\n"
        "print(allocate(1 << 30))\n"
    )
    assert (await run_in_kernel(kernel, cuda_prelude + thread)).strip() == "0"
    await post(jp_fetch, kernel, "suspend")
    await eventually(lambda: _state_is(jp_serverapp, kernel, "idle"), 30, "the kernel idle")
    assert (await slice_of(jp_fetch, kernel))["state"] == "suspended"

    await asyncio.to_thread(fifo.write_text, "x")  # the reader is waiting: this open does not block

    async def running():
        return (await slice_of(jp_fetch, kernel))["state"] == "running"

    await eventually(running, 30, "the kernel resumed by its thread's CUDA call")
    assert jp_serverapp.kernel_manager.get_kernel(kernel).execution_state == "idle"  # no cell ran
    assert (await run_in_kernel(kernel, "worker.join(60); print(worker.is_alive())")).strip() == "False"


@pytest.mark.parametrize("suspend_settings", [{"idle_suspend_after": 1.0}])
async def test_an_idle_kernel_is_suspended_and_its_next_cell_resumes_it(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    code = "pointer = ctypes.c_uint64()\nprint(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(1 << 30)))"
    assert (await run_in_kernel(kernel, cuda_prelude + code)).strip() == "0"

    model = await suspended_when_idle(jp_fetch, kernel)
    assert model["host_memory_bytes"] == GIB
    # No time: its resume waits for its room first, for as long as others hold it.
    assert model["notice"] == "suspended after 1 s idle: 1GiB moved to host memory; resumes when a cell runs"
    assert kernel_pid(jp_serverapp, kernel) not in nvml_device(LARGE)["pids"]

    free = "free, total = memory(); print(total - free)"
    assert (await asyncio.wait_for(run_in_kernel(kernel, free), 60)).strip() == str(GIB)
    model = await slice_of(jp_fetch, kernel)
    # Resumed; it may be suspended again a second after the cell, which is the policy too.
    assert model["notice"] is None or model["notice"].startswith("suspended after 1 s idle")


@pytest.mark.parametrize(
    "suspend_settings", [{"idle_suspend_after": 0.5, "idle_cull_after": 3.0, "suspend_host_memory": "512MiB"}]
)
async def test_past_the_host_memory_cap_an_idle_kernel_is_culled_instead_and_told_why(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + "print(allocate(1 << 30))")).strip() == "0"

    notice = await eventually(notice_starting(jp_fetch, kernel, "not suspended"), 30, "the suspend refused for the cap")
    assert notice == (
        "not suspended: suspended kernels hold 0B of the 512MiB of host memory they may use, and this one's "
        "1GiB would not fit; it is stopped when idle longer instead"
    )

    async def culled():
        notices = json.loads((await jp_fetch("api", "vgpu", "notices")).body)
        return notices if kernel not in jp_serverapp.kernel_manager else None

    await eventually(culled, 30, "the kernel culled")


def gpu_work_in_a_child(compile_c, milliseconds: int) -> str:
    """A cell that starts a process of the kernel (a child, in its slice) with ``milliseconds`` of
    GPU work queued, kept as ``probe``; it prints "ready", "queued" and the child's pid."""
    return (
        "import subprocess\n"
        f"probe = subprocess.Popen([{str(compile_c('checkpoint_probe'))!r}, 'target', '1M'], "
        "stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)\n"
        "print(probe.stdout.readline().split()[0])\n"
        f"probe.stdin.write('busy {milliseconds}\\n'); probe.stdin.flush()\n"
        "print(probe.stdout.readline().strip(), probe.pid)\n"
    )


@pytest.mark.parametrize("suspend_settings", [{"suspend_lock_timeout": 0.3}])
async def test_a_kernel_whose_process_does_not_finish_its_gpu_work_in_time_stays_running(
    jp_fetch, vgpu_kernelspec, run_in_kernel, compile_c, suspend_settings
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", device=LARGE)
    # A process of the kernel (a child, in its slice) with 20 s of GPU work queued.
    ready, queued, pid = (await run_in_kernel(kernel, gpu_work_in_a_child(compile_c, 20_000))).split()
    assert (ready, queued) == ("ready", "queued")

    code, message = await refusal(jp_fetch, kernel, "suspend")
    assert code == 409
    assert f"process {pid} did not finish its GPU work within 0.3 s; left running" in message
    model = await slice_of(jp_fetch, kernel)
    assert (model["state"], model["host_memory_bytes"]) == ("running", 0)
    assert int(pid) in nvml_device(LARGE)["pids"]
    # Still running, not locked: it answers a CUDA call.
    assert (
        await run_in_kernel(
            kernel, "probe.stdin.write('alloc 1M\\n'); probe.stdin.flush(); print(probe.stdout.readline().strip())"
        )
    ).strip() == "alloc 0"
    await run_in_kernel(kernel, "probe.kill(); probe.wait()")


@pytest.mark.parametrize("suspend_settings", [{"idle_suspend_after": 3600.0}])
async def test_a_kernel_start_that_does_not_fit_makes_room_by_suspending_the_longest_idle_kernel(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    older, newer = await kernels_holding(
        jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude, 2, 4 << 30, memory="6GiB"
    )
    await run_in_kernel(newer, "print('active later')")

    # 12 of 16 GiB are promised: an 8 GiB start fits once one 6 GiB kernel is suspended, the one idle longest.
    started = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    made_room, kept = await slice_of(jp_fetch, older), await slice_of(jp_fetch, newer)
    assert (made_room["state"], made_room["host_memory_bytes"]) == ("suspended", 4 * GIB)
    assert (
        made_room["notice"]
        == "suspended to make room for a new kernel: 4GiB moved to host memory; resumes when a cell runs"
    )
    assert kept["state"] == "running" and (await slice_of(jp_fetch, started))["limits"]["memory_bytes"] == 8 * GIB


async def test_memory_a_suspended_slices_processes_still_hold_is_not_lent(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    """The ledger lends a suspended slice's room only as far as NVML shows it free: a slice
    recorded suspended while its process still holds 4 GiB (a ledger told so by a server whose
    checkpoint did not happen) leaves 12 GiB of the 16 to lend, not 16."""
    a = await start_sliced(jp_fetch, vgpu_kernelspec, memory="6GiB", device=LARGE)
    assert (await run_in_kernel(a, cuda_prelude + "print(allocate(4 << 30))")).strip() == "0"
    jp_serverapp.web_app.settings[MANAGER_SETTING].ledger.suspend(a, host_memory=4 * GIB)

    waiting = await start_sliced(jp_fetch, vgpu_kernelspec, memory="13GiB", device=LARGE)
    queued = await slice_of(jp_fetch, waiting)
    assert queued["state"] == "queued" and queued["queue"]["waiting_for"] == "1GiB more GPU memory (12GiB free)"
    await jp_fetch("api", "kernels", waiting, method="DELETE")  # it leaves the line
    fits = await start_sliced(jp_fetch, vgpu_kernelspec, memory="12GiB", device=LARGE)
    assert (await slice_of(jp_fetch, fits))["state"] == "unused"


async def patch(jp_fetch, kernel_id: str, **changes) -> dict:
    body = json.dumps(changes)
    return json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id, method="PATCH", body=body)).body)


class Cell:
    """A cell running in a kernel, its output (stdout, stderr, errors) collected as it comes."""

    def __init__(self, jp_serverapp, kernel_id: str, code: str):
        self.client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
        self.client.start_channels()
        self.output: list[str] = []
        self.reply: asyncio.Future = asyncio.ensure_future(self._run(code))

    async def _run(self, code: str) -> dict:
        await self.client.wait_for_ready(timeout=60)

        def collect(message):
            if message["msg_type"] == "stream":
                self.output.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                self.output.append(f"{message['content']['ename']}: {message['content']['evalue']}")

        try:
            return await self.client.execute_interactive(code, output_hook=collect, timeout=120)
        finally:
            self.client.stop_channels()

    def cancel(self) -> None:
        """Stop waiting for the reply (the kernel was shut down, or the test is over)."""
        self.reply.cancel()

    def said(self, text: str):
        """A condition: the output so far, once it contains ``text``."""

        async def condition():
            joined = "".join(self.output)
            return joined if text in joined else None

        return condition


async def running_a_long_cell(jp_serverapp, kernel_id: str) -> Cell:
    """The kernel runs a cell until it is interrupted or shut down, once the cell has started
    (not merely once the kernel was busy: answering a client's kernel_info makes it busy too)."""
    cell = Cell(jp_serverapp, kernel_id, "print('cell started', flush=True); import time; time.sleep(600)")
    await eventually(cell.said("cell started"), 30, f"kernel {kernel_id} running its cell")
    return cell


@pytest.mark.parametrize("suspend_settings", [{"idle_suspend_after": 3600.0}])
async def test_a_resize_that_does_not_fit_makes_room_by_suspending_an_idle_kernel_never_a_busy_one_nor_itself(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    # Last active in this order: the one that grows, then the busy one (its cell starts), then the idle one.
    grown, busy, idle = await kernels_holding(
        jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude, 3, 2 << 30, memory="4GiB", cores=20
    )
    busy_cell = await running_a_long_cell(jp_serverapp, busy)
    await run_in_kernel(idle, "print('active later')")

    # 12 of 16 GiB promised: 16 GiB would need 8 more, and the idle kernel's 4 GiB are not enough,
    # so nothing is suspended: it waits in line (202) for the busy kernel's room.
    waiting = await jp_fetch("api", "vgpu", "slices", grown, method="PATCH", body=json.dumps({"memory": "16GiB"}))
    assert waiting.code == 202
    # The GPU's free memory, not the slice's room with it (issue 34 item 3: it said 8GiB).
    assert json.loads(waiting.body)["queue"]["waiting_for"] == "8GiB more GPU memory (4GiB free)"
    assert [(await slice_of(jp_fetch, kernel))["state"] for kernel in (grown, busy, idle)] == ["running"] * 3

    # 10 GiB (which replaces the waiting resize) needs 2 more: the idle kernel is suspended for it,
    # not the busy one, nor the one that grows.
    resized = await patch(jp_fetch, grown, memory="10GiB")
    assert (resized["state"], resized["limits"]["memory_bytes"]) == ("running", 10 * GIB)
    made_room = await slice_of(jp_fetch, idle)
    assert (made_room["state"], made_room["host_memory_bytes"]) == ("suspended", 2 * GIB)
    assert made_room["notice"] == (
        "suspended to make room for a kernel that grows: 2GiB moved to host memory; resumes when a cell runs"
    )
    assert (await slice_of(jp_fetch, busy))["state"] == "running"
    assert (await run_in_kernel(grown, "print(allocate(8 << 30))")).strip() == "0"  # really there

    await jp_fetch("api", "kernels", busy, method="DELETE")
    busy_cell.cancel()


@pytest.mark.parametrize("suspend_settings", [{"idle_suspend_after": 3600.0}])
async def test_a_kernel_start_that_does_not_fit_never_suspends_a_kernel_running_a_cell(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    busy, idle = await kernels_holding(
        jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude, 2, 4 << 30, memory="6GiB"
    )
    # The busy kernel was last active before the idle one: idle longest, were it not running a cell.
    busy_cell = await running_a_long_cell(jp_serverapp, busy)
    await run_in_kernel(idle, "print('active later')")

    started = await start_sliced(jp_fetch, vgpu_kernelspec, memory="8GiB", device=LARGE)
    assert (await slice_of(jp_fetch, idle))["state"] == "suspended"
    assert (await slice_of(jp_fetch, busy))["state"] == "running"
    assert (await slice_of(jp_fetch, started))["limits"]["memory_bytes"] == 8 * GIB

    await jp_fetch("api", "kernels", busy, method="DELETE")
    busy_cell.cancel()


# Kernel code (after the CUDA prelude), issue 26 item 2: 256 MiB the program holds, written with a
# pattern; 2 GiB freed into the default stream-ordered pool, which keeps it (its release threshold
# set to keep everything); and a STAND-IN `torch` module (PyTorch is not installable with CUDA
# here) put in sys.modules as if the program had imported it: its "cache" is 1 GiB of real device
# memory (cuMemAlloc_v2, as PyTorch's caching allocator holds its blocks) that empty_cache() frees
# through the driver, recording the call. The real PyTorch check is benchmarks/framework_checks.py's.
POOL_AND_STAND_IN_TORCH = (
    """
import sys, types
held = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(held), ctypes.c_size_t(256 << 20)) == 0
"""
    + written_with_a_pattern("held", 256 << 20)
    + """
pool, freed = ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0
keep_all = ctypes.c_uint64(2**64 - 1)
assert cuda.cuMemPoolSetAttribute(pool, 4, ctypes.byref(keep_all)) == 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
assert cuda.cuMemAllocAsync(ctypes.byref(freed), ctypes.c_size_t(2 << 30), None) == 0
assert cuda.cuMemFreeAsync(freed, None) == 0
assert cuda.cuCtxSynchronize() == 0
class StandInCuda:
    def __init__(self):
        self.calls, self.block = [], ctypes.c_uint64()
        assert cuda.cuMemAlloc_v2(ctypes.byref(self.block), ctypes.c_size_t(1 << 30)) == 0
    def is_initialized(self):
        return True
    def memory_reserved(self):
        return (1 << 30) if self.block.value else 0
    def empty_cache(self):
        self.calls.append("empty_cache")
        if self.block.value:
            assert cuda.cuMemFree_v2(self.block) == 0
            self.block.value = 0
torch = sys.modules["torch"] = types.ModuleType("torch")
torch.cuda = StandInCuda()
print("ready")
"""
)


@pytest.mark.parametrize("suspend_settings", [{"idle_suspend_after": 1.0}])
async def test_a_suspend_releases_a_pools_reserve_and_a_stand_in_torch_cache_and_moves_only_what_is_held(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude, suspend_settings
):
    kernel = await start_sliced(jp_fetch, vgpu_kernelspec, memory="4GiB", device=LARGE)
    assert (await run_in_kernel(kernel, cuda_prelude + POOL_AND_STAND_IN_TORCH)).strip() == "ready"
    # What the kernel holds on the device: 256 MiB, the pool's 2 GiB and the "cache"'s 1 GiB.
    assert nvml_device(LARGE)["free"] == 16 * GIB - (256 << 20) - 3 * GIB

    model = await suspended_when_idle(jp_fetch, kernel)
    assert model["host_memory_bytes"] == 256 << 20  # only what the program still holds moved
    assert model["notice"].startswith(
        "suspended after 1 s idle: released 1GiB cached by PyTorch and 2GiB kept by the driver's memory pools; "
        "256MiB moved to host memory; resumes when a cell runs"
    )
    check = "print(intact(), torch.cuda.calls)"
    assert (await asyncio.wait_for(run_in_kernel(kernel, check), 60)).strip() == "True ['empty_cache']"
