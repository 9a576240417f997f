"""What each GPU really holds, from NVML, set against the slices' promises.

The ledger counts what it admitted; NVML counts what processes hold. The difference is memory
the ledger must not promise again: held by processes of no slice (a program started outside
any, a child that outlived its kernel, what a dead server left) or by a slice past its cap (a
kernel that raised its own cap and allocated before the server put the cap back).

A process belongs to a slice when its pid is one the slice's holder knows (the region's process
slots, the kernel's own pid) or when one of its ancestors is; a process whose parent died is
re-parented and belongs to no slice any more, which is what it then is to everyone else.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pynvml

from jupyter_vgpu.holders.region import proc_stat, process_start_time
from jupyter_vgpu.ledger import Allocation
from jupyter_vgpu.ledger.base import UnpromisedMemory

# How many parents up a process is looked for in a slice: deep enough for a kernel's
# subprocess's subprocess, bounded so a reading never walks a long chain of shells.
ANCESTRY_DEPTH = 16


@dataclass(frozen=True)
class DeviceHolding:
    """One device as NVML sees it: ``used`` bytes in all (the driver's own reserve left out where
    NVML tells it apart), and the bytes each process holds (``None``: NVML does not say, as under
    some virtualised drivers)."""

    used: int
    processes: Mapping[int, int | None]


def read_devices() -> dict[str, DeviceHolding]:
    """Every device's holding, by UUID (NVML opened and closed again: a reading costs one
    nvmlInit, one memory query and one process list per device). No NVML (a machine without a
    driver, a server of pod kernels only): nothing is seen."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        holdings = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
                used = memory.used  # v2 keeps the driver's reserve out of "used"
            except pynvml.NVMLError:
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            try:
                listed = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                listed = []  # then all it holds counts as outside any slice: never promised twice
            processes = {process.pid: process.usedGpuMemory for process in listed}
            holdings[pynvml.nvmlDeviceGetUUID(handle)] = DeviceHolding(used, processes)
        return holdings
    finally:
        pynvml.nvmlShutdown()


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` from /proc, 0 when gone."""
    fields = proc_stat(pid)
    return int(fields[1]) if fields else 0


def process_running(pid: int, start_time: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start_time`` and has not exited (a
    zombie, waiting for a parent to reap it, holds no GPU memory any more)."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] not in (b"Z", b"X") and int(fields[19]) == start_time


def ancestors(pid: int, depth: int = ANCESTRY_DEPTH) -> Iterable[int]:
    """``pid``'s parent, its parent's parent, ... up to ``depth`` of them, stopping at init."""
    for _ in range(depth):
        pid = parent_pid(pid)
        if pid <= 1:
            return
        yield pid


# The pids a slice's holder knows for an allocation, each with the bytes the holder saw it hold
# (the interposer's count in the region; 0 where the holder knows only the pid).
KnownProcesses = Callable[[Allocation], Mapping[int, int]]


def slice_processes(
    allocations: Iterable[Allocation], processes: Iterable[int], known: KnownProcesses
) -> tuple[dict[int, Allocation], dict[int, int]]:
    """Which of ``processes`` belongs to which allocation (known pids and their descendants), and
    the bytes the holders saw the known ones hold."""
    owner: dict[int, Allocation] = {}
    seen: dict[int, int] = {}
    for allocation in allocations:
        for pid, used in known(allocation).items():
            owner[pid] = allocation
            seen[pid] = used
    found = {}
    for pid in processes:
        mine = owner.get(pid) or next((owner[up] for up in ancestors(pid) if up in owner), None)
        if mine is not None:
            found[pid] = mine
    return found, seen


def unpromised(
    allocations: list[Allocation], holdings: Mapping[str, DeviceHolding], known: KnownProcesses
) -> dict[str, UnpromisedMemory]:
    """What each device holds beyond the allocations' promises."""
    pids = [pid for holding in holdings.values() for pid in holding.processes]
    owners, seen = slice_processes(allocations, pids, known)
    result = {}
    for uuid, holding in holdings.items():
        held: dict[str, int] = defaultdict(int)
        caps: dict[str, int] = {}
        for pid, used in holding.processes.items():
            allocation = owners.get(pid)
            if allocation is None or allocation.device_uuid != uuid:
                continue  # a process of no slice, or a slice's process on a device it was not given
            held[allocation.kernel_id] += seen.get(pid, 0) if used is None else used
            caps[allocation.kernel_id] = allocation.memory_limit
        over_cap = sum(max(0, held[kernel_id] - cap) for kernel_id, cap in caps.items())
        result[uuid] = UnpromisedMemory(outside=max(0, holding.used - sum(held.values())), over_cap=over_cap)
    return result


class DeviceMemoryReader:
    """A :data:`~jupyter_vgpu.ledger.base.DeviceReader` over NVML: called with the ledger's
    allocations inside a decision, it reads the devices afresh."""

    def __init__(self, known: KnownProcesses, read: Callable[[], Mapping[str, DeviceHolding]] = read_devices):
        self.known = known
        self.read = read

    def __call__(self, allocations: list[Allocation]) -> dict[str, UnpromisedMemory]:
        return unpromised(allocations, self.read(), self.known)


def still_held(
    allocation: Allocation, known: KnownProcesses, read: Callable[[], Mapping[str, DeviceHolding]] = read_devices
) -> dict[int, int | None]:
    """The processes of ``allocation`` (its known pids and their descendants) that any device's
    NVML process list still shows, with the bytes each holds there (None: NVML does not say). A
    checkpointed process is off every list: the driver released its memory, context included."""
    held: dict[int, int | None] = {}
    for holding in read().values():
        owners, _ = slice_processes([allocation], holding.processes, known)
        for pid in owners:
            used = holding.processes[pid]
            held[pid] = used if used is None or pid not in held else (held[pid] or 0) + used
    return held


def kernel_pid(allocation: Allocation) -> dict[int, int]:
    """The kernel's own pid, where its provisioner recorded it and that process still runs (what
    the broker knows of a user's slice: the regions are the user's)."""
    info = allocation.metadata.get("provisioner_info", {})
    pid, start_time = info.get("pid"), info.get("pid_start_time")
    alive = isinstance(pid, int) and pid > 0 and bool(start_time) and process_start_time(pid) == start_time
    return {pid: 0} if alive else {}
