"""Suspending a slice's processes to host memory and resuming them: the CUDA driver's checkpoint
API (CUDA 12.8+, driver r570+), called by pid from the server's own process.

:class:`CheckpointDriver` is the API itself, through ctypes on ``libcuda.so.1`` (the simulated
driver when the server simulates: :func:`jupyter_vgpu.model.devices.use_simulator` loads it
first). It calls ``cuInit`` once, because a restore needs a controller that has initialised the
driver where persistence mode is off. :class:`CheckpointController` suspends and resumes a set of
pids (a slice's processes) as one: every process is locked first, with a timeout, so that a
process still running GPU work is left running (and reported) before anything is copied; then
each is checkpointed, its device memory moved to host memory and released. A resume restores
only when NVML shows the device has room for what the processes held, since on current drivers
a restore that fails for lack of memory can leave a process unrecoverable.

Every call blocks (a lock waits up to its timeout, a checkpoint or restore copies the slice's
bytes): call them from a worker thread, never the event loop. One controller carries out one
suspend or resume at a time.
"""

from __future__ import annotations

import ctypes
import enum
import platform
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

# The driver API version that introduced the checkpoint entry points with a lock timeout.
CHECKPOINT_API_VERSION = 12080
ENTRY_POINTS = (
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1  # the checkpoint API's answer for a pid that is no CUDA process
CUDA_ERROR_TIMEOUT = 909


class ProcessState(enum.IntEnum):
    """CUprocessState."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3  # an uncorrectable error during checkpoint or restore: the process's GPU state is lost


class CheckpointError(RuntimeError):
    """A checkpoint call failed; ``result`` is the CUresult (0 where no driver call failed)."""

    def __init__(self, message: str, result: int = 0):
        super().__init__(message)
        self.result = result


class CheckpointUnavailable(CheckpointError):
    """This machine's driver cannot suspend processes; the message says why."""


class SuspendRefused(CheckpointError):
    """Nothing was suspended: ``busy`` processes did not stop their GPU work within the lock's
    timeout (they, and the others, were left running), or a process was in another state."""

    def __init__(self, message: str, busy: Iterable[int] = ()):
        super().__init__(message)
        self.busy = tuple(busy)


class NoRoomToRestore(CheckpointError):
    """A resume was not attempted: the device has less free memory than the processes held."""

    def __init__(self, message: str, device_uuid: str, needed: int, free: int):
        super().__init__(message)
        self.device_uuid, self.needed, self.free = device_uuid, needed, free


class _LockArgs(ctypes.Structure):
    """CUcheckpointLockArgs: 64 bytes in every CUDA version that has it."""

    _fields_ = (
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    )


class CheckpointDriver:
    """The checkpoint entry points of the loaded CUDA driver. ``unavailable`` says why they
    cannot be used here (None when they can); every call then raises CheckpointUnavailable.

    Only the lock takes arguments: checkpoint, restore and unlock are passed NULL, which every
    version documents as "no options". That keeps this code clear of
    ``CUcheckpointRestoreArgs``, whose 64 bytes changed meaning between CUDA 12.9, 13.0 and 13.3
    (GPU remapping pairs, then custom storage); a restore onto another GPU would fill it by
    ``driver_version``.
    """

    def __init__(self, library: str = "libcuda.so.1"):
        self.driver_version = 0
        self.unavailable: str | None = None
        self._functions: dict[str, Callable[[int, ctypes.c_void_p | None], int]] = {}
        try:
            self._cuda = ctypes.CDLL(library)
        except OSError as error:
            self.unavailable = f"the CUDA driver ({library}) does not load: {error}"
            return
        version = ctypes.c_int()
        if self._cuda.cuDriverGetVersion(ctypes.byref(version)) != CUDA_SUCCESS:
            self.unavailable = "the CUDA driver does not report its version"
            return
        self.driver_version = version.value
        if version.value < CHECKPOINT_API_VERSION:
            self.unavailable = (
                f"the CUDA driver supports CUDA {_cuda_version(version.value)}; suspending needs CUDA "
                f"{_cuda_version(CHECKPOINT_API_VERSION)} or later (driver r570+)"
            )
            return
        result = self._cuda.cuInit(0)
        if result != CUDA_SUCCESS:
            self.unavailable = f"cuInit failed ({self._error_name(result)})"
            return
        get_proc_address = self._cuda.cuGetProcAddress
        get_proc_address.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64)
        missing = []
        for name in ENTRY_POINTS:
            pointer = ctypes.c_void_p()
            if get_proc_address(name.encode(), ctypes.byref(pointer), CHECKPOINT_API_VERSION, 0) or not pointer.value:
                missing.append(name)
                continue
            self._functions[name] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(pointer.value)
        if missing:
            self.unavailable = f"the CUDA driver lacks {', '.join(missing)}"

    def _error_name(self, result: int) -> str:
        name = ctypes.c_char_p()
        self._cuda.cuGetErrorName.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        if self._cuda.cuGetErrorName(result, ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return name.value.decode()
        return f"CUresult {result}"

    def _call(self, name: str, pid: int, argument: Any) -> int:
        if self.unavailable:
            raise CheckpointUnavailable(f"cannot suspend processes: {self.unavailable}")
        pointer = ctypes.cast(argument, ctypes.c_void_p) if argument is not None else None
        return int(self._functions[name](pid, pointer))

    def _check(self, name: str, pid: int, result: int) -> None:
        if result != CUDA_SUCCESS:
            raise CheckpointError(f"{name} of process {pid} failed: {self._error_name(result)}", result)

    def state(self, pid: int) -> ProcessState | None:
        """The process's state; None when it is not a CUDA process (or is gone)."""
        state = ctypes.c_int()
        result = self._call("cuCheckpointProcessGetState", pid, ctypes.pointer(state))
        if result == CUDA_ERROR_INVALID_VALUE:
            return None
        self._check("cuCheckpointProcessGetState", pid, result)
        return ProcessState(state.value)

    def restore_thread_id(self, pid: int) -> int:
        tid = ctypes.c_int()
        result = self._call("cuCheckpointProcessGetRestoreThreadId", pid, ctypes.pointer(tid))
        self._check("cuCheckpointProcessGetRestoreThreadId", pid, result)
        return tid.value

    def lock(self, pid: int, timeout: float) -> bool:
        """Locks a running process: False when its work did not end within ``timeout`` seconds
        (it is then still running). A timeout of 0 waits as long as it takes."""
        args = _LockArgs(timeoutMs=max(1, round(timeout * 1000)) if timeout > 0 else 0)
        result = self._call("cuCheckpointProcessLock", pid, ctypes.pointer(args))
        if result == CUDA_ERROR_TIMEOUT:
            return False
        self._check("cuCheckpointProcessLock", pid, result)
        return True

    def checkpoint(self, pid: int) -> None:
        self._check("cuCheckpointProcessCheckpoint", pid, self._call("cuCheckpointProcessCheckpoint", pid, None))

    def restore(self, pid: int) -> None:
        self._check("cuCheckpointProcessRestore", pid, self._call("cuCheckpointProcessRestore", pid, None))

    def unlock(self, pid: int) -> None:
        self._check("cuCheckpointProcessUnlock", pid, self._call("cuCheckpointProcessUnlock", pid, None))


def _cuda_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class SuspendedProcess:
    """A checkpointed process: the device it was on and the bytes NVML showed it holding there,
    which a resume needs free again (keep them with the slice: they outlive this server). A CUDA
    process that held nothing on a GPU has device_uuid "" and memory 0."""

    pid: int
    device_uuid: str
    memory: int


@dataclass(frozen=True)
class Suspension:
    processes: tuple[SuspendedProcess, ...]
    seconds: float = 0.0

    @property
    def memory(self) -> int:
        """Bytes moved to host memory."""
        return sum(process.memory for process in self.processes)

    def memory_by_device(self) -> dict[str, int]:
        needed: dict[str, int] = {}
        for process in self.processes:
            needed[process.device_uuid] = needed.get(process.device_uuid, 0) + process.memory
        return needed


@dataclass(frozen=True)
class Suspendability:
    """Whether a slice's processes can be suspended here, and if not, every reason why (each a
    sentence for the slice's notice)."""

    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def possible(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class _GpuProcess:
    device_uuid: str
    memory: int
    mps: bool


def _mps_clients(handle: object) -> list[Any]:
    # The versioned query: the unversioned one refuses to run when pynvml and the library differ.
    query = getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses_v3", None)
    return list((query or pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v2)(handle))


def _gpu_processes() -> dict[int, list[_GpuProcess]]:
    """Where each process holds GPU memory, per NVML (MPS clients marked)."""
    found: dict[int, list[_GpuProcess]] = {}
    pynvml.nvmlInit()
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                found.setdefault(process.pid, []).append(_GpuProcess(uuid, process.usedGpuMemory or 0, False))
            try:
                clients = _mps_clients(handle)
            except pynvml.NVMLError:  # no MPS query in this NVML (the simulated one): no MPS clients
                clients = []
            for process in clients:
                found.setdefault(process.pid, []).append(_GpuProcess(uuid, process.usedGpuMemory or 0, True))
        return found
    finally:
        pynvml.nvmlShutdown()


def _device_facts(uuids: Iterable[str]) -> dict[str, tuple[int, bool]]:
    """Free bytes and whether MIG is on, per device UUID."""
    facts = {}
    pynvml.nvmlInit()
    try:
        for uuid in uuids:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            try:
                mig = pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:  # a GPU without MIG (or an NVML without the query)
                mig = False
            facts[uuid] = (pynvml.nvmlDeviceGetMemoryInfo(handle).free, mig)
        return facts
    finally:
        pynvml.nvmlShutdown()


class CheckpointController:
    """Suspends and resumes sets of processes (a slice's) through a :class:`CheckpointDriver`."""

    def __init__(self, driver: CheckpointDriver | None = None):
        self.driver = driver or CheckpointDriver()
        self._busy = threading.Lock()

    def probe(self, pids: Iterable[int], *, managed_memory: bool = False) -> Suspendability:
        """Whether these processes can be suspended. ``managed_memory``: whether the slice has
        allocated unified memory (the interposer sees ``cuMemAllocManaged``), which the driver
        cannot checkpoint."""
        reasons = []
        if self.driver.unavailable:
            reasons.append(f"the driver cannot suspend processes: {self.driver.unavailable}")
        if platform.machine() not in ("x86_64", "AMD64"):
            reasons.append(f"the driver suspends processes on x86-64 only, not {platform.machine()}")
        if managed_memory:
            reasons.append("the kernel uses managed (unified) memory, which the driver cannot suspend")
        on_gpu = _gpu_processes()
        held = [process for pid in pids for process in on_gpu.get(pid, [])]
        devices = sorted({process.device_uuid for process in held})
        if len(devices) > 1:
            reasons.append(f"the kernel's processes use {len(devices)} GPUs; only single-GPU kernels are suspended")
        if any(process.mps for process in held):
            reasons.append("the kernel is an MPS client, which the driver cannot suspend")
        if any(mig for _, mig in _device_facts(devices).values()):
            reasons.append("the kernel's GPU is in MIG mode, which the driver cannot suspend")
        return Suspendability(tuple(reasons))

    def states(self, pids: Iterable[int]) -> dict[int, ProcessState | None]:
        """Each process's checkpoint state (None: not a CUDA process, or gone)."""
        return {pid: self.driver.state(pid) for pid in pids}

    def suspend(self, pids: Iterable[int], *, lock_timeout: float) -> Suspension:
        """Locks every CUDA process of ``pids`` (each within ``lock_timeout`` seconds), then
        checkpoints them all. Raises SuspendRefused, with everything left running, if one does not
        stop its GPU work in time or is not running; processes without CUDA are left alone."""
        with self._busy:
            started = time.monotonic()
            states = {pid: self.driver.state(pid) for pid in dict.fromkeys(pids)}
            cuda_pids = [pid for pid, state in states.items() if state is not None]
            not_running = {pid: state for pid, state in states.items() if state not in (None, ProcessState.RUNNING)}
            if not_running:
                described = ", ".join(f"{pid} is {state.name.lower()}" for pid, state in not_running.items() if state)
                raise SuspendRefused(f"cannot suspend: process {described}")
            locked: list[int] = []
            try:
                busy = []
                for pid in cuda_pids:
                    if self.driver.lock(pid, lock_timeout):
                        locked.append(pid)
                    else:
                        busy.append(pid)
                        break
                if busy:
                    raise SuspendRefused(
                        f"process {busy[0]} did not finish its GPU work within {lock_timeout:g} s; left running",
                        busy,
                    )
                # What each holds, read while locked (nothing allocates) and before the checkpoint frees it.
                on_gpu = _gpu_processes()
                processes = tuple(
                    SuspendedProcess(pid, place.device_uuid, place.memory)
                    for pid in cuda_pids
                    for place in on_gpu.get(pid) or [_GpuProcess("", 0, False)]
                )
                checkpointed: list[int] = []
                try:
                    for pid in cuda_pids:
                        self.driver.checkpoint(pid)
                        checkpointed.append(pid)
                except CheckpointError:
                    # Back as it was: the memory these just gave up is still free (they are locked,
                    # and nothing else was admitted to it).
                    for pid in checkpointed:
                        self.driver.restore(pid)
                    raise
            except BaseException:
                for pid in locked:
                    self.driver.unlock(pid)
                raise
            return Suspension(processes, time.monotonic() - started)

    def resume(self, suspension: Suspension) -> float:
        """Restores and unlocks the processes of ``suspension``; returns the seconds it took.
        Raises NoRoomToRestore, touching nothing, when a device has less free memory than they
        held there. Processes already running or gone are skipped; one locked but restored (a
        resume cut short) is unlocked."""
        with self._busy:
            started = time.monotonic()
            pids = list(dict.fromkeys(process.pid for process in suspension.processes))
            states = {pid: self.driver.state(pid) for pid in pids}
            to_restore = {pid for pid, state in states.items() if state == ProcessState.CHECKPOINTED}
            needed: dict[str, int] = {}
            for process in suspension.processes:
                if process.pid in to_restore and process.memory:
                    needed[process.device_uuid] = needed.get(process.device_uuid, 0) + process.memory
            for uuid, (free, _) in _device_facts(needed).items():
                if free < needed[uuid]:
                    raise NoRoomToRestore(
                        f"not resumed: GPU {uuid} has {free} bytes free, the suspended processes need {needed[uuid]}",
                        uuid,
                        needed[uuid],
                        free,
                    )
            failed = [f"process {pid} is failed" for pid, state in states.items() if state == ProcessState.FAILED]
            for pid in pids:
                try:
                    if pid in to_restore:
                        self.driver.restore(pid)
                    if pid in to_restore or states[pid] == ProcessState.LOCKED:
                        self.driver.unlock(pid)
                except CheckpointError as error:
                    failed.append(str(error))
            if failed:
                raise CheckpointError(f"resume incomplete: {'; '.join(failed)}")
            return time.monotonic() - started
