"""Fixtures shared by every test: the native libraries built from this checkout, C test programs
linked against the simulated GPU, and slices (a region plus the environment of a process in it)."""

from __future__ import annotations

import ctypes
import itertools
import os
import runpy
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from jupyter_client.channels import HBChannel
from private_machine import environment_changed, private_machine_environment
from support import CUDA_PRELUDE

pytest_plugins = ["pytest_jupyter.jupyter_server", "cluster.fixtures"]

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
SIM_DEVICE_DEFAULT = "name=jupyter-vgpu test GPU,memory=16GiB,sms=100,context_memory=0"


@pytest.fixture(scope="session", autouse=True)
def private_machine(tmp_path_factory):
    """Every test's processes on a machine of the session's own (tests/private_machine.py): a
    user's own JupyterLab with jupyter-vgpu, or another test session, on this machine is neither
    joined (its ledger) nor shared (its simulated GPU). Tests that need a place of their own still
    set it; this is what the rest inherit."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in private_machine_environment(tmp_path_factory.mktemp("machine")).items():
            patch.setenv(name, value)
        yield


@dataclass(frozen=True)
class NativeLibs:
    vgpu: Path
    sim_dir: Path
    include: Path


@pytest.fixture(scope="session")
def native_libs() -> NativeLibs:
    """Builds native/ from this checkout once per test session, so tests always run the C
    code as it is in the tree (not a stale build from install time)."""
    build = runpy.run_path(str(ROOT / "native" / "build.py"))
    output = ROOT / "jupyter_vgpu" / "_native"
    build["build"](output)
    return NativeLibs(vgpu=output / "libvgpu.so", sim_dir=output / "sim", include=ROOT / "native" / "include")


# Debian's aarch64 cross compiler and a static qemu-user (a static emulator, so that the
# LD_PRELOAD meant for the emulated program does not reach the emulator's own loader).
AARCH64_COMPILER = "aarch64-linux-gnu-gcc"
AARCH64_EMULATOR = ("qemu-aarch64-static", "-L", "/usr/aarch64-linux-gnu")
C_FLAGS = ("-std=c11", "-D_GNU_SOURCE", "-O2", "-g", "-Wall", "-Wextra", "-Werror")


@dataclass
class Machine:
    """Where a test's C code runs: this machine's own architecture, or aarch64 under qemu-user
    (libvgpu.so's dlsym entry point is assembly, written once per architecture). Builds the
    test programs of tests/programs for that machine, against its build of native/."""

    name: str
    compiler: tuple[str, ...]
    libs: NativeLibs
    emulator: tuple[str, ...]
    workdir: Path
    host_libs: NativeLibs
    built: dict = field(default_factory=dict)

    def compile(self, name: str, *flags: str) -> Path:
        """tests/programs/<name>.c as a program linked against the simulated GPU."""
        suffix = "".join(flag.strip("-").replace("=", "_").replace("/", "_") for flag in flags)
        return self._build(
            ("program", name, flags),
            self.workdir / "programs" / f"{name}{suffix}",
            [
                *C_FLAGS,
                f"-I{self.libs.include}",
                *flags,
                "-o",
                "{output}",
                str(PROGRAMS / f"{name}.c"),
                f"-L{self.libs.sim_dir}",
                "-l:libcuda.so.1",
                "-l:libnvidia-ml.so.1",
                "-lpthread",
                "-ldl",
            ],
        )

    def build_shared(self, name: str, filename: str) -> Path:
        """tests/programs/<name>.c as a shared library called `filename` (its soname too), in a
        directory of its own."""
        return self._build(
            ("shared", name, filename),
            self.workdir / f"lib-{name}" / filename,
            [
                *C_FLAGS,
                "-fPIC",
                "-shared",
                f"-I{self.libs.include}",
                f"-Wl,-soname,{filename}",
                "-o",
                "{output}",
                str(PROGRAMS / f"{name}.c"),
                "-ldl",
            ],
        )

    def _build(self, key: tuple, output: Path, arguments: list[str]) -> Path:
        if key not in self.built:
            output.parent.mkdir(parents=True, exist_ok=True)
            command = [*self.compiler, *(str(output) if a == "{output}" else a for a in arguments)]
            subprocess.run(command, check=True)
            self.built[key] = output
        return self.built[key]

    def command(self, program: Path, *arguments: str) -> list[str]:
        return [*self.emulator, str(program), *arguments]

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """`env` (made for this machine's own architecture) with this machine's libvgpu.so and
        simulated driver in place of the host's."""
        replaced = dict(env)
        for name in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
            if name in replaced:
                replaced[name] = (
                    replaced[name]
                    .replace(str(self.host_libs.vgpu), str(self.libs.vgpu))
                    .replace(str(self.host_libs.sim_dir), str(self.libs.sim_dir))
                )
        return replaced


@pytest.fixture(scope="session")
def host_machine(native_libs, tmp_path_factory) -> Machine:
    compiler = tuple(shlex.split(os.environ.get("CC", "cc")))
    return Machine("host", compiler, native_libs, (), tmp_path_factory.mktemp("host"), native_libs)


@pytest.fixture(scope="session")
def aarch64_machine(native_libs, tmp_path_factory) -> Machine:
    """native/ cross-built for aarch64 with the build that makes the wheel's (native/build.py)."""
    missing = [tool for tool in (AARCH64_COMPILER, AARCH64_EMULATOR[0]) if not shutil.which(tool)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: the aarch64 tests need Debian's gcc-aarch64-linux-gnu, "
            "libc6-dev-arm64-cross and qemu-user-static (README.md's install block installs them as root)"
        )
    workdir = tmp_path_factory.mktemp("aarch64")
    output = workdir / "native"
    subprocess.run(
        [sys.executable, str(ROOT / "native" / "build.py"), str(output)],
        env=dict(os.environ, CC=AARCH64_COMPILER),
        check=True,
        capture_output=True,
    )
    libs = NativeLibs(vgpu=output / "libvgpu.so", sim_dir=output / "sim", include=ROOT / "native" / "include")
    return Machine("aarch64", (AARCH64_COMPILER,), libs, AARCH64_EMULATOR, workdir, native_libs)


@pytest.fixture(params=["host", "aarch64"])
def machine(request) -> Machine:
    """Runs a test once on this machine and once on aarch64 (emulated)."""
    return request.getfixturevalue(f"{request.param}_machine")


@pytest.fixture(scope="session")
def compile_c(host_machine):
    """compile_c(name, *flags) -> Path of tests/programs/<name>.c built against the simulated GPU."""
    return host_machine.compile


@pytest.fixture
def checkpoint_targets(compile_c):
    """start(env, size) -> a running support.CheckpointTarget; any still running at the end is killed."""
    from support import CheckpointTarget

    program = compile_c("checkpoint_probe")
    started: list[CheckpointTarget] = []

    def start(env: dict[str, str], size: str) -> CheckpointTarget:
        started.append(CheckpointTarget(program, env, size))
        return started[-1]

    yield start
    for target in started:
        target.kill()


# A Jupyter server started in the test process (pytest-jupyter's jp_fetch) loads the simulated
# driver and NVML into it, and they read their device list and state file once per process, as a
# real driver sees one machine: every in-process server of the session (tests/server,
# tests/clients) runs on this one simulated machine. A second machine would leave the process's
# driver on the first one (its NVML figures and checkpoint calls then miss the later servers'
# kernels).
IN_PROCESS_SIM_DEVICES = (
    "name=Sim Small,memory=8GiB,sms=50,context_memory=0;name=Sim Large,memory=16GiB,sms=100,context_memory=0"
)


@pytest.fixture(scope="session")
def in_process_sim_state(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("in-process-sim") / "sim.state")


@pytest.fixture(scope="session")
def in_process_driver(native_libs, in_process_sim_state) -> None:
    """This process's simulated CUDA driver, initialised on the session's in-process machine.
    The driver binds to a machine at its first cuInit, for good (NVML reads its environment
    again at each nvmlInit): a test that reads a private machine's NVML in this process
    (tests/ledger's property test) must not be the first to initialise it, or every later
    in-process server's checkpoint calls go to that private machine."""
    from jupyter_vgpu.model import use_simulator

    with environment_changed({"VGPU_SIM_STATE": in_process_sim_state, "VGPU_SIM_DEVICES": IN_PROCESS_SIM_DEVICES}):
        use_simulator()
        assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0


@pytest.fixture
def in_process_sim(in_process_driver, in_process_sim_state, monkeypatch) -> None:
    """The session's one simulated machine for a server in the test process."""
    monkeypatch.setenv("VGPU_SIM_STATE", in_process_sim_state)
    monkeypatch.setenv("VGPU_SIM_DEVICES", IN_PROCESS_SIM_DEVICES)


@pytest.fixture
def sim_env(native_libs, tmp_path) -> dict[str, str]:
    """Environment of a process on a private simulated machine (its own state file)."""
    env = dict(os.environ)
    for name in ("LD_PRELOAD", "VGPU_REGION", "VGPU_LIMITS", "CUDA_VISIBLE_DEVICES", "VGPU_LOG_LEVEL"):
        env.pop(name, None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(native_libs.sim_dir), env.get("LD_LIBRARY_PATH")]))
    env["VGPU_SIM_STATE"] = str(tmp_path / "sim-state")
    env["VGPU_SIM_DEVICES"] = SIM_DEVICE_DEFAULT
    return env


def simulated_device_uuid(env: dict[str, str], index: int = 0) -> str:
    """UUID of a simulated device, as NVML reports it, read in a child with the env's setup."""
    code = (
        f"import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex({index})))"
    )
    result = subprocess.run(
        [os.environ.get("PYTHON", sys.executable), "-c", code],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


@pytest.fixture
def region_files():
    """region_files(path, memory_limit=, sm_share=, policy=, device_uuid=, device_index=) -> a real
    region file created at path (Region.create), closed when the test ends."""
    from jupyter_vgpu.holders.region import Region

    regions = []

    def create(path: Path, **fields):
        region = Region.create(path, **fields)
        regions.append(region)
        return region

    yield create
    for region in regions:
        region.close()


@pytest.fixture
def make_slice(native_libs, tmp_path, region_files):
    """make_slice(env, memory_limit=..., sm_share=100, policy="hard") -> (slice_env, region)."""
    numbers = itertools.count()

    def create(
        env: dict[str, str], memory_limit: int = 0, sm_share: int = 100, policy: str = "hard", device_index: int = 0
    ):
        path = tmp_path / f"slice-{next(numbers)}.region"
        region = region_files(
            path,
            memory_limit=memory_limit,
            sm_share=sm_share,
            policy=policy,
            device_uuid=simulated_device_uuid(env, device_index),
            device_index=device_index,
        )
        slice_env = dict(env)
        slice_env["LD_PRELOAD"] = str(native_libs.vgpu)
        slice_env["VGPU_REGION"] = str(path)
        return slice_env, region

    return create


# -- kernels of a real server (tests/server, tests/pods) ------------------------------------------


@pytest.fixture
def run_in_kernel(jp_serverapp):
    """run_in_kernel(kernel_id, code) -> the kernel's stdout for that code."""
    clients = []

    async def run(kernel_id: str, code: str) -> str:
        client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
        client.start_channels()
        clients.append(client)
        await client.wait_for_ready(timeout=60)
        chunks = []

        def collect(message):
            if message["msg_type"] == "stream":
                chunks.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                chunks.append("\n".join(message["content"]["traceback"]))

        reply = await client.execute_interactive(code, output_hook=collect, timeout=60)
        assert reply["content"]["status"] == "ok", "".join(chunks)
        return "".join(chunks)

    yield run
    for client in clients:
        client.stop_channels()


@pytest.fixture
def cuda_prelude() -> str:
    """Kernel code defining memory() and allocate(size) over the CUDA driver, via ctypes."""
    return CUDA_PRELUDE


# The fast lane (`python -m pytest -m "not slow"`, CONTRIBUTING.md) leaves out the end-to-end
# tests: a browser, a hub, a server process of their own, a wheel build, a peer project's pytest,
# or over 30 s here. Measured on the shared two-core machine under load (one run, 2026-11-28):
# test_fuzz.py 110-147 s a case, test_device_memory.py 47-158 s a test, the outliving kernels
# 101 s, the classroom's suspend 66-98 s, each peer-suite test about 27 s. CI runs everything.
SLOW_TESTS = (
    "browser/",
    "docs/test_site_commands.py::test_the_commands_that_need_no_server_run_as_written",
    "docs/test_site_commands.py::test_the_commands_for_a_running_server_run_as_written_against_one",
    "hub/test_borrowing_hub.py",
    "hub/test_broker_line.py",
    "hub/test_classroom_hub.py",
    "hub/test_prometheus_scrape.py",
    "hub/test_spawn_form.py",
    "packaging/test_beside_a_users_server.py",
    "packaging/test_install_docs.py",
    "packaging/test_wheel.py",
    "peers/test_peer_suites.py",
    "server/test_adopted_kernel_state.py",
    "server/test_device_memory.py",
    "server/test_fuzz.py",
    "server/test_kernels_outlive_server.py::test_kernels_outlive_their_servers_sigkill_and_the_restarted_server_adopts_them",
    "server/test_server_process.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    stale = [entry for entry in SLOW_TESTS if not (tests / entry.split("::")[0]).exists()]
    if stale:  # a renamed file would silently join the fast lane
        raise pytest.UsageError(f"tests/conftest.py's SLOW_TESTS names what is not there: {', '.join(stale)}")
    for item in items:
        where = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        test = f"{where}::{item.name.split('[')[0]}"
        if any(test.startswith(entry) for entry in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def patient_heartbeat(monkeypatch):
    """A kernel client calls its kernel dead after 1 s without a heartbeat ("Kernel died before
    replying to kernel_info"), which a kernel still starting on a busy two-core machine misses; a
    test's reading, not what any test is about. Tests that need a kernel's death see its process."""
    monkeypatch.setattr(HBChannel, "time_to_dead", 10.0)
