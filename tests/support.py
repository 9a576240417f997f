"""Helpers shared by test modules (importable because tests/conftest.py puts tests/ on sys.path)
and by the benchmarks (which put tests/ on sys.path themselves)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

JUPYTER = str(Path(sys.executable).with_name("jupyter"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_vgpu_kernelspec(folder: Path, display_name: str, config: dict[str, str] | None = None) -> None:
    """A kernelspec in `folder` (made) whose kernels the vGPU provisioner starts, with `config`
    (None: the provisioner's own defaults, as the kernelspec jupyter-vgpu ships)."""
    folder.mkdir(parents=True)
    provisioner: dict = {"provisioner_name": "vgpu-provisioner"}
    if config is not None:
        provisioner["config"] = config
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "metadata": {"kernel_provisioner": provisioner},
    }
    (folder / "kernel.json").write_text(json.dumps(spec))


def vgpu_server_config(tmp_path: Path, **vgpu_app) -> dict:
    """A test server's config with jupyter_vgpu enabled: its ledger and regions under `tmp_path`,
    default slices of 2GiB and 40% hard (not the built-in 4GiB, so a test can tell the server's
    default was used), no room hold, and `vgpu_app` on top."""
    defaults = {
        "ledger_path": str(tmp_path / "ledger.sqlite"),
        "region_dir": str(tmp_path / "regions"),
        "default_memory": "2GiB",
        "default_cores": 40,
        "default_policy": "hard",
        # Kernels a test started a moment ago make room at once; tests/server/test_room_policy.py
        # sets the hold it tests.
        "room_hold": 0.0,
    }
    return {"ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}}, "VGPUApp": defaults | vgpu_app}


def run_checked(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Runs `command` to its end (text output captured); fails the test with its stderr unless it
    exits 0."""
    result = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def venv_with_pinned_dependencies(tmp_path: Path) -> tuple[Path, Path]:
    """A new virtual environment under tmp_path, and a pip constraints file that pins every
    dependency at the version of the environment running the tests, so that pip's cache has them."""
    venv = tmp_path / "venv"
    run_checked([sys.executable, "-m", "venv", str(venv)], env=dict(os.environ), timeout=300)
    frozen = run_checked(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], env=dict(os.environ), timeout=300
    )
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        "".join(f"{line}\n" for line in frozen.stdout.splitlines() if "==" in line and " @ " not in line)
    )
    return venv, constraints


def watched_utilisation(watch_output: str, pid: int) -> list[tuple[int, int]]:
    """(query time in us, utilisation of pid) for every query in the output of
    tests/programs/pacing_monitor.c's `watch`: a `q TIME` line per query, then an `s PID UTIL`
    line for each process it saw (a query that did not see pid reads 0)."""
    series: list[tuple[int, int]] = []
    for words in (line.split() for line in watch_output.splitlines()):
        if words[0] == "q":
            series.append((int(words[1]), 0))
        elif words[0] == "s" and int(words[1]) == pid:
            series[-1] = (series[-1][0], int(words[2]))
    return series


def http_request(
    url: str, method: str, path: str, body: bytes | dict | None = None, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One raw HTTP request to ``url`` + ``path`` (not through a client, so that what a client never
    sends can be sent, and a refusal is seen as sent); a dict body goes as JSON. Returns (status,
    headers, body)."""
    parts = urlsplit(url)
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(method, parts.path + path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def ledger_slices(ledger, *fields: str) -> dict[str, tuple]:
    """Each slice a ledger holds, by kernel id: its allocation's ``fields``, in that order (what a
    test's model of the ledger keeps)."""
    return {
        allocation.kernel_id: tuple(getattr(allocation, name) for name in fields) for allocation in ledger.allocations()
    }


def compile_sim_program(name: str, folder: Path) -> Path:
    """tests/programs/<name>.c built optimised into ``folder`` against the simulated GPU's driver
    and NVML in jupyter_vgpu/_native/sim (built already), as the benchmarks run it."""
    root = Path(__file__).resolve().parent.parent
    program = folder / name
    command = [os.environ.get("CC", "cc"), "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{root / 'native' / 'include'}"]
    command += ["-o", str(program), str(root / "tests" / "programs" / f"{name}.c")]
    command += [
        f"-L{root / 'jupyter_vgpu' / '_native' / 'sim'}",
        "-l:libcuda.so.1",
        "-l:libnvidia-ml.so.1",
        "-lpthread",
    ]
    subprocess.run(command, check=True)
    return program


def running(pid: int) -> bool:
    """Whether process `pid` runs: it exists and is not a zombie (ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def folder_processes(folder: Path) -> dict[int, list[str]]:
    """The command lines of the live processes whose working folder or command line is in
    ``folder``, by pid: what a test that ran processes there left running."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        inside = cwd == str(folder) or cwd.startswith(f"{folder}{os.sep}") or any(str(folder) in arg for arg in argv)
        if inside and running(int(entry.name)):
            found[int(entry.name)] = argv
    return found


def cpu_waits(pid: int) -> dict[int, int]:
    """{thread id: nanoseconds it has waited on a run queue} of each thread of `pid`."""
    waits = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            waits[int(task.name)] = int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return waits


def thread_named(pid: int, name: str, timeout: float) -> int | None:
    """The id of `pid`'s thread called `name` (pthread_setname_np), once it exists; None after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                if (task / "comm").read_text().strip() == name:
                    return int(task.name)
            except OSError:
                continue  # a thread that ended meanwhile
        time.sleep(0.005)
    return None


@contextmanager
def controller_kept_from_its_cpu(load_pid: int, cpu: int):
    """Keeps the slice's limiter controller thread (libvgpu.so's "vgpu-pacer" in `load_pid`)
    waiting for a CPU each time it wakes, as on a busy machine, without touching the load's other
    threads: the thread is moved to `cpu`, where a CPU-bound process runs, and scheduled
    SCHED_BATCH (no wake-up preemption), so each wake waits for that process's time slice to end
    (a few milliseconds). Yields the thread's id."""
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        pacer = thread_named(load_pid, "vgpu-pacer", 2.0)
        assert pacer, "the slice's controller thread did not start"
        os.sched_setaffinity(pacer, {cpu})
        os.sched_setscheduler(pacer, os.SCHED_BATCH, os.sched_param(0))
        yield pacer
    finally:
        hog.kill()
        hog.wait()


def wait_for(condition, timeout: float, message: str = "condition", interval: float = 0.02):
    """Polls `condition` until it returns a truthy value or `timeout` seconds pass; returns the
    value, or fails the test with the last value seen."""
    deadline = time.monotonic() + timeout
    value = condition()
    while not value:
        if time.monotonic() > deadline:
            pytest.fail(f"{message} not met within {timeout} s (last: {value!r})")
        time.sleep(interval)
        value = condition()
    return value


# Runs one command of the checkpoint controller (holders/checkpoint.py) in a child process.
CHECKPOINT_CONTROLLER = r"""
import dataclasses, json, sys
from jupyter_vgpu.model.devices import use_simulator
use_simulator()
from jupyter_vgpu.holders.checkpoint import (
    CheckpointController, NoRoomToRestore, SuspendRefused, SuspendedProcess, Suspension,
)
command, arguments = sys.argv[1], json.loads(sys.argv[2])
controller = CheckpointController()
try:
    if command == "suspend":
        suspension = controller.suspend(arguments["pids"], lock_timeout=arguments["lock_timeout"])
        answer = {"processes": [dataclasses.asdict(p) for p in suspension.processes], "seconds": suspension.seconds}
    elif command == "resume":
        processes = tuple(SuspendedProcess(**process) for process in arguments["processes"])
        answer = {"seconds": controller.resume(Suspension(processes))}
    elif command == "states":
        answer = {str(pid): None if state is None else state.name for pid, state in controller.states(arguments["pids"]).items()}
    elif command == "probe":
        answer = {"reasons": list(controller.probe(arguments["pids"], managed_memory=arguments["managed"]).reasons)}
except SuspendRefused as refused:
    answer = {"refused": str(refused), "busy": list(refused.busy)}
except NoRoomToRestore as no_room:
    answer = {"no_room": str(no_room), "needed": no_room.needed, "free": no_room.free}
print(json.dumps(answer))
"""


def checkpoint_controller(env: dict[str, str], command: str, **arguments) -> dict:
    """What CheckpointController answers to ``command`` (suspend, resume, states, probe), run in a child
    process of its own on ``env``'s simulated machine, as a server runs it (cuInit once a process)."""
    finished = subprocess.run(
        [sys.executable, "-c", CHECKPOINT_CONTROLLER, command, json.dumps(arguments)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


def nvml_reading(env: dict[str, str]) -> dict:
    """Device 0's used memory and processes, as pynvml reads them in a child process."""
    code = (
        "import json, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "m = pynvml.nvmlDeviceGetMemoryInfo(h); "
        "print(json.dumps({'used': m.used, 'processes': "
        "{str(p.pid): p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}}))"
    )
    finished = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(finished.stdout)


class LineProgram:
    """A C test program that answers commands on stdin with "key value" lines on stdout, and whose
    stderr a test reads line by line (what libvgpu.so tells the user)."""

    def __init__(self, command: list[str], env: dict[str, str]):
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(command, env=env, stdin=pipe, stdout=pipe, stderr=pipe, text=True)
        self.lines: dict[str, str] = {}  # the latest line of each key
        self.wait_for("ready")

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for(self, key: str) -> str:
        """Reads output until a line starting with `key`; returns the rest of that line. No
        timeout of its own: the test's (pytest-timeout) ends a wait on a process that hangs."""
        while key not in self.lines:
            line = self.process.stdout.readline()
            if not line:
                raise AssertionError(f"{self.process.args[0]} ended before '{key}': {self.process.stderr.read()}")
            name, _, value = line.strip().partition(" ")
            self.lines[name] = value
        return self.lines[key]

    def send(self, command: str) -> None:
        """Sends one command line without waiting for its answer (see wait_for)."""
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def ask(self, command: str, answer: str) -> str:
        """Sends one command line and waits for its answer line."""
        self.lines.pop(answer, None)
        self.send(command)
        return self.wait_for(answer)

    def said(self) -> str:
        """The program's next line on stderr (blocking; as wait_for, the test's timeout ends a
        wait on a program that never says it)."""
        line = self.process.stderr.readline()
        if not line:
            raise AssertionError(f"{self.process.args[0]} closed its stderr")
        return line.rstrip("\n")

    def finish(self) -> str:
        """Closes stdin and waits for the program to end; returns what it said on stderr meanwhile."""
        _, rest = self.process.communicate()
        return rest

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


class CheckpointTarget(LineProgram):
    """`checkpoint_probe target BYTES` (tests/programs/checkpoint_probe.c): a process that has
    written a pattern into BYTES of device memory and obeys commands on stdin."""

    def __init__(self, program: Path, env: dict[str, str], size: str, launcher: tuple[str, ...] = ()):
        """`launcher`: what runs the program (an emulator for another architecture's build)."""
        super().__init__([*launcher, str(program), "target", size], env)


class RoomProbe(LineProgram):
    """`room_probe` (tests/programs/room_probe.c): a process that has not used the GPU yet, making
    each CUDA call a command asks for in a thread of its own."""

    def __init__(self, program: Path, env: dict[str, str]):
        super().__init__([str(program)], env)


def listed_slice(
    kernel_id: str,
    path: str = "",
    device: dict | None = None,
    memory: int = 4 << 30,
    cores: int = 30,
    policy: str = "hard",
    used: int = 1 << 30,
    util: float = 12.0,
    warnings=(),
) -> dict:
    """A slice as GET /api/vgpu/slices answers it (units in the field names, memory in bytes), on
    ``device`` ({"index", "uuid"}; by default device 0 of an all-zero uuid)."""
    return {
        "kernel_id": kernel_id,
        "kernelspec": "python3-vgpu",
        "path": path,
        "owner": "user",
        "holder": "local",
        "state": "running",
        "device": device or {"index": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000"},
        "limits": {"memory_bytes": memory, "cores": cores, "policy": policy},
        "usage": {"memory_bytes": used, "sm_util": util, "processes": []},
        "warnings": list(warnings),
    }


@contextmanager
def json_stand_in(respond):
    """A JSON HTTP server on 127.0.0.1 for the length of the block, answering GET and PATCH with
    ``respond(method, path, body, headers) -> (status, reply)``; yields ``http://127.0.0.1:PORT/``.
    A stand-in for a Jupyter server where a test needs exact replies (refusals, odd answers)."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, reply = respond(self.command, self.path, body, self.headers)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = _serve

        def log_message(self, *args):
            pass  # keep pytest's captured output to the test's own

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}/"
    finally:
        http.shutdown()
        thread.join()


class JupyterProcess:
    """`jupyter APP` (server or lab) as a user starts it, on a free port of 127.0.0.1 with
    `token`, more ``options`` after those, its stderr appended to `log`. Returns once GET
    api/status answers; fails at once, with the log, if the process exits first."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        token: str,
        *options: str,
        app: str = "server",
        timeout: float = 60,
        port: int | None = None,
    ):
        """``port``: the one to listen on (a restart's, where clients keep the URL), else a free one."""
        self.log, self.token, self.port = log, token, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        with log.open("a") as stderr:
            self.process = subprocess.Popen(
                [
                    JUPYTER,
                    app,
                    "--no-browser",
                    "--allow-root",
                    f"--port={self.port}",
                    f"--IdentityProvider.token={token}",
                    *options,
                ],
                # No room hold (VGPUApp.room_hold), as vgpu_server_config: kernels a test started a
                # moment ago make room at once; a test of the hold sets the variable itself.
                env={"JUPYTER_VGPU_ROOM_HOLD": "0", **env, "PYTHONFAULTHANDLER": "1"},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            wait_for(self.ready, timeout, f"jupyter {app} to answer")
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"jupyter exited ({self.process.returncode}):\n{self.log.read_text()[-4000:]}")
        try:
            self.api("GET", "api/status")
            return True
        except OSError:
            return False

    def api(self, method: str, path: str, body=None, timeout: float = 60):
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read() or b"null")

    def refusal(self, method: str, path: str, body=None) -> tuple[int, str]:
        """(status, message) of a request the server must refuse."""
        try:
            self.api(method, path, body)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())["message"]
        raise AssertionError(f"{method} {path} was not refused")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would: no shutdown, nothing released."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self, timeout: float = 30) -> float | None:
        """SIGTERM, as Ctrl-C or a service manager stops it; returns the seconds the process took
        to exit (0 if it had already), or None when it had not exited after `timeout` seconds (it
        is then killed)."""
        if self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            # SIGABRT first: Python's fault handler (PYTHONFAULTHANDLER, set at start) writes
            # every thread's stack to the log, which says where the server hung.
            self.process.send_signal(signal.SIGABRT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self.process.kill()
            self.process.wait()
            return None
        return time.monotonic() - started


def printed_by_cell(client, code: str, timeout: float, chunks: list[str] | None = None) -> str:
    """Runs ``code`` as a cell through a kernel client whose channels are started (and stopped
    after); what the cell printed (appended to ``chunks`` as it comes, where given, for a test
    that watches a cell still running). The cell must succeed."""
    chunks = [] if chunks is None else chunks
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(
            code,
            timeout=timeout,
            output_hook=lambda m: chunks.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(chunks)
    finally:
        client.stop_channels()


class VGPUServer(JupyterProcess):
    """`jupyter server` with jupyter-vgpu as a user starts it, with the shipped defaults (pending
    kernels: a start that does not fit waits in the line) on the simulated GPU of ``sim_env``: its
    ledger, regions, notebooks and Jupyter folders under ``folder``, and a vGPU kernelspec
    ``kernel_name`` asking for ``memory``. ``env`` is the user's environment beside it: in it,
    `jupyter vgpu status` finds this server (Jupyter's runtime files) and a program shares its GPU."""

    kernel_name = "vgpu-line"
    token = "vgpu-line-token"

    def __init__(self, folder: Path, sim_env: dict[str, str], *options: str, memory: str = "1GiB"):
        self.env = dict(sim_env)
        self.env.pop("LD_LIBRARY_PATH", None)  # the server points its kernels at the simulated driver
        self.env.pop("JUPYTER_TOKEN", None)
        self.env.update(
            JUPYTER_RUNTIME_DIR=str(folder / "runtime"),
            JUPYTER_DATA_DIR=str(folder / "data"),
            JUPYTER_CONFIG_DIR=str(folder / "config"),
        )
        write_vgpu_kernelspec(folder / "data" / "kernels" / self.kernel_name, "GPU slice (line)", {"memory": memory})
        (folder / "notebooks").mkdir()
        super().__init__(
            self.env,
            folder / "server.log",
            self.token,
            "--VGPUApp.simulate=True",
            f"--VGPUApp.ledger_path={folder / 'ledger.sqlite'}",
            f"--VGPUApp.region_dir={folder / 'regions'}",
            f"--ServerApp.root_dir={folder / 'notebooks'}",
            *options,
        )

    def slice_of(self, kernel_id: str) -> dict:
        """The kernel's item of GET /api/vgpu/slices."""
        (model,) = [item for item in self.api("GET", "api/vgpu/slices") if item["kernel_id"] == kernel_id]
        return model

    def kernel_client(self, kernel_id: str, timeout: float = 60):
        """A client of the kernel over its own channels (its connection file, written once its
        start is under way: a start answers before), channels started."""
        connection_file = Path(self.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"
        wait_for(connection_file.is_file, timeout, f"kernel {kernel_id}'s connection file", interval=0.1)
        return kernel_client(connection_file, timeout)


def kernel_client(connection_file: Path, timeout: float = 60):
    """A BlockingKernelClient of the kernel of ``connection_file``, channels started, that takes
    the kernel for dead only after ``timeout`` seconds without a heartbeat: the default (1 s)
    takes a kernel still starting on a loaded machine for a dead one, and wait_for_ready then
    gives up on it."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(connection_file))
    client.load_connection_file()
    client.hb_channel.time_to_dead = timeout
    client.start_channels()
    return client


# Program code for NVIDIA's cuda-bindings: `cu` (cuda.bindings.driver), ok(answer) -> the values of a
# call that must succeed, the driver initialised and `device` = device 0; no context yet.
CUDA_BINDINGS_PRELUDE = """
from cuda.bindings import driver as cu

def ok(answer):
    error, *rest = answer
    assert error == cu.CUresult.CUDA_SUCCESS, error
    return rest[0] if len(rest) == 1 else rest

ok(cu.cuInit(0))
device = ok(cu.cuDeviceGet(0))
"""


# Kernel (or program) code defining memory() -> (free, total) and allocate(size) -> CUresult over
# the CUDA driver, via ctypes.
CUDA_PRELUDE = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
device, context = ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGet(ctypes.byref(device), 0)
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
cuda.cuCtxSetCurrent(context)
def memory():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value, total.value
def allocate(size):
    pointer = ctypes.c_uint64()
    return cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
"""


def written_with_a_pattern(pointer: str, size: int) -> str:
    """Kernel code (after CUDA_PRELUDE): the first ``size`` bytes (in whole patterns) of the device
    memory at ``pointer``, a ctypes.c_uint64 the code allocated, written with a pattern; then
    ``intact()`` says whether they still hold it (after a suspend and resume)."""
    return f"""
pattern = bytes(range(251)) * ({size} // 251)
assert cuda.cuMemcpyHtoD_v2({pointer}, pattern, ctypes.c_size_t(len(pattern))) == 0
def intact():
    back = ctypes.create_string_buffer(len(pattern))
    assert cuda.cuMemcpyDtoH_v2(back, {pointer}, ctypes.c_size_t(len(pattern))) == 0
    return back.raw == pattern
"""


# A program outside any slice: allocates what its argument says, says so, and holds it until its
# stdin closes.
OUTSIDE_HOLDER = (
    CUDA_PRELUDE + "import sys\nassert allocate(int(sys.argv[1])) == 0\nprint('held', flush=True)\nsys.stdin.read()\n"
)


def hold_outside(env: dict[str, str], size: int) -> subprocess.Popen:
    """A program on the simulated GPU (``env``: sim_env) holding ``size`` bytes, in no slice; it
    ends when its stdin is closed."""
    program = subprocess.Popen(
        [sys.executable, "-c", OUTSIDE_HOLDER, str(size)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert program.stdout is not None and program.stdout.readline() == "held\n"
    return program


def dashboard_misreads(dashboard: dict, metrics: str) -> list[str]:
    """What a Grafana dashboard (docs/grafana) asks of a Prometheus text export that the export
    lacks: per panel, a query that names no vgpu_ metric, metrics it does not export, and labels
    grouped by or shown in a legend that none of its series carries. Empty when the dashboard reads
    only what is there."""
    exported = set(re.findall(r"^# TYPE (\w+) ", metrics, re.MULTILINE))
    labels = set(re.findall(r"[{,](\w+)=", metrics))
    misreads = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            asked = set(re.findall(r"\b(vgpu_\w+)", target["expr"]))
            grouped = set(re.findall(r"by \((\w+)\)", target["expr"])) | set(
                re.findall(r"{{(\w+)}}", target["legendFormat"])
            )
            if not asked or asked - exported or grouped - labels:
                misreads.append(
                    f"{panel['title']}: metrics {sorted(asked - exported)}, labels {sorted(grouped - labels)}"
                )
    return misreads
