"""The local holder: a slice as a region file on this machine, and the environment that puts a
process (and every process it starts, since children inherit the environment) inside it.

Every region of this machine is made here, by a server's slices, ``jupyter vgpu run``, the
doctor's probe and kernels started without a server alike, in one private folder.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir

from jupyter_vgpu.holders.base import SliceUsage
from jupyter_vgpu.holders.device_memory import kernel_pid, process_running, read_devices, slice_processes
from jupyter_vgpu.holders.pages import page_path
from jupyter_vgpu.holders.region import LimitsPage, Region, RegionError, default_limits_path, process_start_time
from jupyter_vgpu.ledger import Allocation, LedgerError, UnknownSlice
from jupyter_vgpu.model import Device, SliceLimits, format_size
from jupyter_vgpu.model.devices import simulator_environment
from jupyter_vgpu.native import interposer_path

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
REGION_SUFFIX = ".region"
# Region files and the folder holding them: the user's own, nobody else's. A region's limits are
# what the interposer enforces; the folder also names every running kernel.
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700
# The variables naming a process's region and its limits page (read by libvgpu.so, and by %vgpu
# in a kernel that no server started).
REGION_VARIABLE = "VGPU_REGION"
LIMITS_VARIABLE = "VGPU_LIMITS"
# An allocation's metadata key naming its region file where that is not in the holder's own
# folder: the slice of a batch kernel (nbconvert, papermill) admitted to a server's ledger by a
# provisioner outside that server, whose region is in the standalone folder.
REGION_PATH_KEY = "region_path"
# Beside a kernel's region: the server that adopted the kernel after the one that started it went
# away (server/adopt.py), as JSON {"pid", "pid_start_time", "url"}. The kernel's parent poller
# (notebook/survive.py) watches that server in place of its parent; %vgpu calls its URL.
ADOPTED_BY_SUFFIX = ".adopted-by"
# The kernel's environment variable saying how many seconds it outlives its server, waiting to be
# adopted (VGPUApp.kernel_survival; absent or 0: it ends with its server, as ipykernel's).
SURVIVAL_VARIABLE = "JUPYTER_VGPU_KERNEL_SURVIVAL_S"
# How long a stopped slice's processes may take to exit after SIGKILL (the kernel tears down its
# GPU memory on exit; a process stuck in the driver may take a moment).
STOP_WAIT_S = 5.0
# Beside a region in the standalone folder: the processes whose life keeps it in use (see
# LocalHolder.mark_owners), so the next program there can tell a left-over region from one in use.
OWNERS_SUFFIX = ".owners"


def default_region_dir(*, standalone: bool = False) -> Path:
    """Where regions live: the slices of Jupyter servers (which share the user's ledger) in one
    folder, those of programs started without a server (``jupyter vgpu run``, the doctor's probe,
    kernels of nbconvert) in a folder of their own, so a server's sweep never takes theirs."""
    folder = Path(jupyter_runtime_dir()) / "vgpu" / "regions"
    return folder / "standalone" if standalone else folder


def private_folder(path: Path) -> Path:
    """``path`` made (with its parents) and closed to other users, whatever umask made it. The
    parents it makes are private too: `jupyter vgpu run` makes regions/standalone, and the
    regions folder it made on the way is a server's region folder later."""
    if not path.parent.exists():
        private_folder(path.parent)
    path.mkdir(exist_ok=True, mode=PRIVATE_FOLDER)
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_FOLDER)
    return path


def private_file(path: Path) -> Path:
    """``path`` made (empty, where it is not there) and closed to other users, whatever umask
    made it or an earlier version left it. SQLite gives a database's journal and WAL files the
    mode of the database file, so a private database stays private."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE))
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_FILE)
    return path


def slice_environment(region: Region, *, simulate: bool, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process in the slice: the interposer preloaded, the region named,
    only the slice's device visible, and the simulated driver on the library path if asked."""
    env = dict(os.environ if base_env is None else base_env)
    if simulate:
        env.update(simulator_environment(env))
    env["LD_PRELOAD"] = " ".join(filter(None, [str(interposer_path()), env.get("LD_PRELOAD", "")]))
    env[REGION_VARIABLE] = str(region.path)
    env[LIMITS_VARIABLE] = str(region.page.path)
    env["CUDA_VISIBLE_DEVICES"] = region.device_uuid
    return env


def adopted_by_path(region_path: str | os.PathLike[str]) -> Path:
    """Where a region's adopting server is named (see ``ADOPTED_BY_SUFFIX``)."""
    path = Path(region_path)
    return path.with_name(path.name + ADOPTED_BY_SUFFIX)


def read_adopted_by(region_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The server that adopted the kernel of this region, if one did and the file can be read."""
    try:
        found = json.loads(adopted_by_path(region_path).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _limits_text(limits: SliceLimits) -> str:
    return f"memory cap {format_size(limits.memory_limit)}, SM share {limits.sm_share}%, policy {limits.policy}"


class LocalHolder:
    """Slices as region files in ``region_dir``, one per kernel, named by the kernel id.

    Each region's limits page is made here, beside it, unless ``limits_dir`` names the folder in
    which the node's broker publishes the pages: the holder then only reads them, and the kernel
    obeys a page its own account cannot write.
    """

    kind = "local"

    def __init__(self, region_dir: Path | None = None, *, simulate: bool = False, limits_dir: Path | None = None):
        self.region_dir = private_folder(Path(region_dir) if region_dir else default_region_dir())
        self.simulate = simulate
        self.limits_dir = limits_dir
        self._regions: dict[str, Region] = {}

    # -- regions -------------------------------------------------------------------------

    def path(self, kernel_id: str) -> Path:
        return self.region_dir / f"{kernel_id}{REGION_SUFFIX}"

    def new_region(self, name: str, limits: SliceLimits, device: Device) -> Region:
        """A fresh region for a slice called ``name`` (a kernel id, or any unique name)."""
        return Region.create(
            self.path(name),
            memory_limit=limits.memory_limit,
            sm_share=limits.sm_share,
            policy=limits.policy,
            device_uuid=device.uuid,
            device_index=device.index,
            mode=PRIVATE_FILE,
        )

    def published_page(self, kernel_id: str) -> Path | None:
        """The broker's page of ``kernel_id``'s slice, where the broker publishes them."""
        return page_path(self.limits_dir, kernel_id) if self.limits_dir else None

    def region(self, kernel_id: str) -> Region:
        region = self._regions.get(kernel_id)
        if region is None:
            region = self._regions[kernel_id] = Region.open(
                self.path(kernel_id), limits_path=self.published_page(kernel_id), publisher=self.limits_dir is None
            )
        return region

    @contextmanager
    def _region_of(self, allocation: Allocation) -> Iterator[Region]:
        """The allocation's region: in this holder's folder (kept open), or the file its metadata
        names (a batch kernel's, opened for each use: its provisioner removes it when the kernel
        ends, without telling this holder)."""
        named = allocation.metadata.get(REGION_PATH_KEY)
        if named and Path(named) != self.path(allocation.kernel_id):
            with Region.open(named) as region:
                yield region
        else:
            yield self.region(allocation.kernel_id)

    def environment(self, allocation: Allocation, base_env: dict[str, str] | None = None) -> dict[str, str]:
        with self._region_of(allocation) as region:
            return slice_environment(region, simulate=self.simulate, base_env=base_env)

    # -- the Holder protocol -------------------------------------------------------------

    def create(self, allocation: Allocation) -> None:
        published = self.published_page(allocation.kernel_id)
        if published is None:
            device = Device(allocation.device_uuid, allocation.device_index, "", 0, 0)
            self._regions[allocation.kernel_id] = self.new_region(allocation.kernel_id, allocation.limits, device)
            return
        # The broker made the page when it admitted the slice, before it answered.
        try:
            page = LimitsPage.open(published, writable=False)
        except RegionError as error:
            raise LedgerError(f"the node's GPU broker published no usable limits for this kernel ({error})") from None
        try:
            region = Region.create(self.path(allocation.kernel_id), page=page, mode=PRIVATE_FILE)
        except BaseException:
            page.close()
            raise
        self._regions[allocation.kernel_id] = region

    def check_limits(self, allocation: Allocation, wanted: SliceLimits) -> None:
        """A region holds any limits; the ledger checks the device's capacity."""

    def apply_limits(self, allocation: Allocation) -> None:
        if self.limits_dir:
            return  # the broker published them when it decided the resize
        try:
            with self._region_of(allocation) as region:
                region.set_limits(
                    memory_limit=allocation.memory_limit, sm_share=allocation.sm_share, policy=allocation.policy
                )
        except RegionError as error:
            # The kernel ended a moment ago (its provisioner removed the region): nothing to resize.
            raise UnknownSlice(
                f"the slice of kernel {allocation.kernel_id!r} is gone ({error}); its kernel has ended"
            ) from None

    def usage(self, allocation: Allocation) -> SliceUsage:
        try:
            with self._region_of(allocation) as region:
                return self._read_usage(region, allocation)
        except RegionError:
            return SliceUsage("lost")

    def _read_usage(self, region: Region, allocation: Allocation) -> SliceUsage:
        warnings = []
        drift = self._restore_limits(region, allocation)
        if drift:
            warnings.append(drift)
        processes = region.processes()
        return SliceUsage(
            state="running" if processes else "unused",
            processes=processes,
            sm_util_percent=region.sm_util_permille / 10 if processes else 0.0,
            warnings=warnings,
        )

    def _restore_limits(self, region: Region, allocation: Allocation) -> str | None:
        """Put the ledger's limits back into a region a process of the slice rewrote (a process
        in the same Unix account can write its region), and say what was found. A page this
        server cannot write is the broker's, which nothing in the kernel can change either."""
        if not region.page.writable:
            return None
        try:
            found = region.limits
            if found == allocation.limits:
                return None
            what = _limits_text(found)
        except RegionError:
            what = "unreadable limits"
        region.restore(allocation.limits)
        return (
            f"the slice's limits were changed from inside the kernel ({what} instead of "
            f"{_limits_text(allocation.limits)}); the server restored them"
        )

    def known_processes(self, allocation: Allocation) -> dict[int, int]:
        """The slice's processes this holder knows, with the bytes each holds by the interposer's
        count: every live process in the region's slots (children of the kernel included, since
        they inherit the preload), and the kernel's own pid."""
        known = kernel_pid(allocation)
        try:
            with self._region_of(allocation) as region:
                known.update((process.pid, process.used) for process in region.processes())
        except RegionError:
            pass  # the region is gone: the kernel's pid is all there is
        return known

    def is_alive(self, allocation: Allocation) -> bool:
        info = allocation.metadata.get("provisioner_info", {})
        pid, start_time = info.get("pid"), info.get("pid_start_time")
        # A zombie has ended (it holds no GPU memory) whether or not its parent reaped it yet.
        return bool(pid and start_time and process_running(pid, start_time))

    def slice_processes(self, allocation: Allocation) -> dict[int, int]:
        """Every process of the slice that still runs, with its start time: the kernel, the live
        processes in the region's slots (a child in a session of its own, a grandchild: whatever
        inherited the preload and used the GPU), and those NVML lists as holding a device that
        descend from one of them (a child that cleared the preload)."""
        known = set(self.known_processes(allocation))
        listed = [pid for holding in read_devices().values() for pid in holding.processes]
        known.update(slice_processes([allocation], listed, self.known_processes)[0])
        return {pid: start for pid in known if (start := process_start_time(pid)) and process_running(pid, start)}

    # -- suspending (issue 18; the checkpointing itself is holders/suspender.py's) -------------

    def set_suspended(self, allocation: Allocation, suspended: bool) -> None:
        """Raise or clear the limits page's suspended flag, which makes the slice's processes
        count their CUDA calls as resume requests (see :meth:`resume_requests`)."""
        with self._region_of(allocation) as region:
            if not region.page.writable:
                return  # the node's broker publishes the page: it raises the flag when it lends the room
            region.set_suspended(suspended)

    def show_place(self, allocation: Allocation, position: int, eta_seconds: float | None) -> None:
        """Publish a suspended slice's place in the line on its limits page, where its waiting
        processes read it (and print it in the cell's output)."""
        with self._region_of(allocation) as region:
            if region.page.writable:
                region.page.set_queue(position, eta_seconds)

    def leave_line(self, allocation: Allocation) -> None:
        """Tell the slice's waiting processes that their user gave up waiting (an interrupt):
        their waiting CUDA calls fail at once; the slice stays suspended."""
        with self._region_of(allocation) as region:
            if region.page.writable:
                region.page.leave_line()

    def release_cached(self, allocation: Allocation, *, wait: float) -> dict[str, int]:
        """Before a suspend: ask the slice's processes to give back cached device memory they do
        not use (the limits page's release request: libvgpu.so trims the driver's stream-ordered
        pools, the kernel's Python side empties PyTorch's and CuPy's caches; never memory the
        program holds) and wait up to ``wait`` seconds for every live process to answer. Returns
        the bytes given back by source ("pools", "torch", "cupy"; those that gave nothing left
        out), and "unanswered": how many processes had not answered in time."""
        with self._region_of(allocation) as region:
            if not region.page.writable:
                return {}  # a broker's page: the broker asks
            return region.release_cached(wait=wait)

    def resume_requests(self, allocation: Allocation) -> int:
        """CUDA calls the slice's live processes made while it was suspended, ever."""
        try:
            with self._region_of(allocation) as region:
                return region.resume_requests()
        except RegionError:
            return 0

    def uses_managed_memory(self, allocation: Allocation) -> bool:
        with self._region_of(allocation) as region:
            return region.uses_managed_memory()

    def stop(self, allocation: Allocation) -> list[str]:
        """Stop the kernel and every other process of its slice (SIGKILL), and wait for them to
        exit, so that what they held is free before the slice is released. Returns why a process
        could not be stopped (another user's, or one that does not exit), for which the slice must
        be kept; an empty list when none of its processes runs any more."""
        if self.is_alive(allocation):
            pid = allocation.metadata["provisioner_info"]["pid"]
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)  # its process group first, in one call
        running = self.slice_processes(allocation)
        problems = []
        for pid in list(running):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                running.pop(pid)
            except PermissionError:
                running.pop(pid)
                problems.append(f"process {pid} is {_owner_of(pid)}'s, which this server cannot stop")
        deadline = time.monotonic() + STOP_WAIT_S
        while running and time.monotonic() < deadline:
            running = {pid: start for pid, start in running.items() if process_running(pid, start)}
            if running:
                time.sleep(0.01)  # SIGKILL is sent; an exit has no event to wait on from here
        problems += [f"process {pid} did not exit within {STOP_WAIT_S:g} s of SIGKILL" for pid in running]
        return problems

    def adopted_by(self, allocation: Allocation, server: dict[str, Any]) -> None:
        """Name the server that adopted the slice's kernel beside its region (written aside and
        renamed in: the kernel never reads half of it)."""
        path = adopted_by_path(allocation.metadata.get(REGION_PATH_KEY) or self.path(allocation.kernel_id))
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        with os.fdopen(descriptor, "w") as file:
            json.dump(server, file)
        staging.replace(path)

    def release(self, kernel_id: str) -> None:
        region = self._regions.pop(kernel_id, None)
        if region is not None:
            region.close()
        adopted_by_path(self.path(kernel_id)).unlink(missing_ok=True)
        self.path(kernel_id).unlink(missing_ok=True)
        default_limits_path(self.path(kernel_id)).unlink(missing_ok=True)
        self._owners_path(kernel_id).unlink(missing_ok=True)

    # -- left-over regions of programs without a server ------------------------------------

    def _owners_path(self, name: str) -> Path:
        return self.region_dir / f"{name}{OWNERS_SUFFIX}"

    def _owners(self, name: str) -> dict[str, int]:
        try:
            owners = json.loads(self._owners_path(name).read_text())
        except (OSError, ValueError):
            return {}
        return (
            {str(pid): start for pid, start in owners.items() if isinstance(start, int)}
            if isinstance(owners, dict)
            else {}
        )

    def mark_owners(self, name: str, *pids: int) -> None:
        """Record processes whose life keeps the region ``name`` in use (a batch kernel's: the
        program running it, then the kernel; a `jupyter vgpu run`'s: the command), so that
        :meth:`sweep_stale` tells a region left behind from one in use, even before any process
        of the slice made a CUDA call (which is when it appears in the region)."""
        owners = self._owners(name)
        owners.update({str(pid): process_start_time(pid) for pid in pids})
        path = self._owners_path(name)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        with os.fdopen(fd, "w") as file:
            json.dump(owners, file)
        os.replace(staging, path)

    def sweep_stale(self) -> list[str]:
        """Release the regions marked with owners (:meth:`mark_owners`) of which none runs any
        more, and in which no process of the slice runs: what a batch kernel left that was never
        shut down, only garbage-collected, or whose program was killed. Returns their names.
        A region without owners is left alone: nothing here tells whether it is in use."""
        swept = []
        for path in self.region_dir.glob(f"*{OWNERS_SUFFIX}"):
            name = path.name[: -len(OWNERS_SUFFIX)]
            owners = self._owners(name)
            if not owners or any(process_running(int(pid), start) for pid, start in owners.items()):
                continue
            try:
                with Region.open(self.path(name), publisher=False) as region:
                    if region.processes():
                        continue
            except RegionError:
                pass  # gone, or never made whole: nothing runs in it
            self.release(name)
            swept.append(name)
        return swept

    def sweep(self, kept: set[str]) -> list[str]:
        swept = []
        for path in self.region_dir.glob(f"*{REGION_SUFFIX}"):
            kernel_id = path.name[: -len(REGION_SUFFIX)]
            if kernel_id not in kept:
                self.release(kernel_id)
                swept.append(kernel_id)
        return swept


def _owner_of(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return "another user"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"user {uid}"


def run_command(command: Sequence[str], env: dict[str, str], *, started: Callable[[int], None] | None = None) -> int:
    """Run a command with ``env`` and return its exit status (128 + N if killed by signal N),
    telling ``started`` its pid once it runs.

    Signals sent to this process are passed on to the command, so Ctrl-C reaches the program
    rather than leaving it running in a slice whose region is being removed.
    """
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as error:
        raise FileNotFoundError(f"cannot start {command[0]!r}: {error.strerror}") from None
    previous = {sig: signal.signal(sig, lambda number, _frame: child.send_signal(number)) for sig in FORWARDED_SIGNALS}
    try:
        if started is not None:
            started(child.pid)
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - status if status < 0 else status


def run_in_slice(command: Sequence[str], limits: SliceLimits, device: Device, *, simulate: bool) -> int:
    """Run a command inside a fresh slice that no ledger counts and return its exit status."""
    holder, name = LocalHolder(default_region_dir(standalone=True), simulate=simulate), uuidlib.uuid4().hex
    region = holder.new_region(name, limits, device)
    try:
        holder.mark_owners(name, os.getpid())
        return run_command(
            command, slice_environment(region, simulate=simulate), started=lambda pid: holder.mark_owners(name, pid)
        )
    finally:
        region.close()
        holder.release(name)
