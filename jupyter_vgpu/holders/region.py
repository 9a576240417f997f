"""A slice's shared memory: the limits page, through which the server (or the node's broker)
publishes the slice's device and limits, and the region, in which the interposer in every
process of the slice reports usage.

The layout is read through cffi from the very header the C side compiles
(``native/include/vgpu/region.h``), so the two cannot drift apart. Python writes limits and
reads counters; the C side owns the counters and only reads the page. Limits are published
through the two-copy sequence protocol the header describes, with an ``flock`` on the page
serialising writers.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cffi

from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.model.sizes import POLICIES
from jupyter_vgpu.native import region_header_path

if TYPE_CHECKING:
    from typing_extensions import Self

_U64 = (1 << 64) - 1


class RegionError(RuntimeError):
    """A region file that cannot be used: missing, of another version, or corrupt."""


@lru_cache(maxsize=1)
def _ffi() -> tuple[cffi.FFI, dict[str, int]]:
    text = region_header_path().read_text()
    match = re.search(r"/\* VGPU_REGION_CDEF_BEGIN \*/(.*)/\* VGPU_REGION_CDEF_END \*/", text, re.DOTALL)
    if not match:
        raise RegionError(f"{region_header_path()} has no VGPU_REGION_CDEF section")
    cdef = match.group(1)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    constants = {name: int(value, 0) for name, value in re.findall(r"#define\s+(VGPU_\w+)\s+(\S+)", cdef)}
    return ffi, constants


def constants() -> dict[str, int]:
    """The ``#define`` constants of the region header (magic, version, limits)."""
    return _ffi()[1]


def limits_check(memory_limit: int, sm_share: int, policy: int) -> int:
    """Python twin of ``vgpu_limits_check`` in region.h (modulo 2**64)."""
    magic = constants()["VGPU_REGION_MAGIC"]
    return (
        ((memory_limit * 0x9E3779B97F4A7C15) & _U64)
        ^ ((sm_share * 0xC2B2AE3D27D4EB4F) & _U64)
        ^ (((policy + 1) * 0x165667B19E3779F9) & _U64)
        ^ magic
    )


@dataclass(frozen=True)
class ReleaseAnswer:
    """What one process of the slice said to the limits page's release requests (region.h): the
    request its libvgpu.so answered last (the driver's pools trimmed) and the one its kernel's
    Python side answered last (the frameworks' caches emptied; only where it watches), with the
    bytes each gave back then."""

    pools_answered: int = 0
    frameworks_answered: int = 0
    frameworks_watching: bool = False
    pools_released: int = 0
    torch_released: int = 0
    cupy_released: int = 0

    def answered(self, request: int) -> bool:
        return self.pools_answered == request and (not self.frameworks_watching or self.frameworks_answered == request)


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    allocated: int
    driver_reserved: int
    launches: int
    throttled_ns: int
    sm_util_permille: int
    oom_refusals: int
    resume_requests: int = 0  # CUDA calls made while its slice was suspended
    managed_allocations: int = 0  # cuMemAllocManaged calls that succeeded

    @property
    def used(self) -> int:
        return self.allocated + self.driver_reserved


# What a process's usage says, by name: a region's slot (vgpu_proc_slot) and a pod agent's report
# (holders/pod.py) carry the same fields.
PROCESS_FIELDS = tuple(field.name for field in fields(ProcessUsage))


def proc_stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first), or an
    empty list when the process is gone. Readable for every user's processes."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return []
    return text[text.rindex(b")") + 2 :].split()


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, or 0 when the process is gone (as vgpu/proc.h)."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else 0


LIMITS_SUFFIX = ".limits"


def default_limits_path(region_path: str | os.PathLike[str]) -> Path:
    """Where a region's limits page is when nobody says otherwise (as libvgpu.so without
    $VGPU_LIMITS): beside the region, its name + ``.limits``."""
    path = Path(region_path)
    return path.with_name(path.name + LIMITS_SUFFIX)


def _create_file(path: Path, struct: str, mode: int, fill: Callable[[Any], None]) -> tuple[int, mmap.mmap]:
    """A new file holding ``struct``, filled by ``fill`` before it appears under ``path``: it is
    made aside and renamed in, so nothing that attaches sees it half made."""
    size = _ffi()[0].sizeof(struct)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        os.ftruncate(fd, size)
        buffer = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            fill(_ffi()[0].from_buffer(f"{struct} *", buffer))
        except BaseException:
            buffer.close()
            raise
        os.rename(staging, path)
    except BaseException:
        os.close(fd)
        staging.unlink(missing_ok=True)
        raise
    return fd, buffer


def _open_file(path: Path, struct: str, what: str, *, writable: bool) -> tuple[int, mmap.mmap, bool]:
    """Maps an existing file holding ``struct``; read-only where ``writable`` is false or the
    file is not this process's to write (a limits page the broker owns). Returns whether the
    mapping is writable."""
    size = _ffi()[0].sizeof(struct)
    fd = -1
    if writable:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            writable = False
        except FileNotFoundError:
            raise RegionError(f"{what} {path} does not exist") from None
    if fd < 0:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RegionError(f"{what} {path} does not exist") from None
        except PermissionError as error:
            raise RegionError(f"{what} {path} cannot be read ({error.strerror})") from None
    try:
        found = os.fstat(fd).st_size
        if found < size:
            raise RegionError(f"{what} {path} is {found} bytes, expected {size}")
        access = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, access), writable
    except BaseException:
        os.close(fd)
        raise


def _check_header(raw: Any, path: Path, what: str, magic: str, size: int, size_field: str) -> None:
    consts = constants()
    if raw.magic != consts[magic]:
        raise RegionError(f"{path} is not a jupyter-vgpu {what} (bad magic)")
    if raw.version != consts["VGPU_REGION_VERSION"]:
        raise RegionError(
            f"{what} {path} is version {raw.version}, this jupyter-vgpu reads version {consts['VGPU_REGION_VERSION']}"
        )
    if getattr(raw, size_field) != size:
        raise RegionError(
            f"{what} {path} is corrupt (its header says {getattr(raw, size_field)} bytes, expected {size})"
        )


class _MappedFile:
    """One of a slice's files, mapped, its fields reached through ``raw``: a cffi pointer typed
    as region.h's struct (which mypy cannot see, so it is typed Any)."""

    STRUCT = ""

    def __init__(self, path: Path, fd: int, buffer: mmap.mmap):
        self.path = path
        self._fd = fd
        self._mmap = buffer
        self.raw: Any = _ffi()[0].from_buffer(f"{self.STRUCT} *", buffer)

    def close(self) -> None:
        if self._fd < 0:
            return
        _ffi()[0].release(self.raw)
        self.raw = None
        self._mmap.close()
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class LimitsPage(_MappedFile):
    """A slice's limits page: its device and the limits in force, written only by the publisher
    (the server, or the node's broker) and read by every process of the slice."""

    STRUCT = "struct vgpu_limits_page"

    def __init__(self, path: Path, fd: int, buffer: mmap.mmap, *, writable: bool):
        super().__init__(path, fd, buffer)
        self.writable = writable

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        limits: SliceLimits,
        *,
        device_uuid: str,
        device_index: int,
        mode: int = 0o600,
    ) -> LimitsPage:
        """Create (or replace) the limits page of a new slice."""
        ffi, consts = _ffi()
        path = Path(path)

        def fill(raw: Any) -> None:
            raw.magic = consts["VGPU_LIMITS_MAGIC"]
            raw.version = consts["VGPU_REGION_VERSION"]
            raw.page_size = ffi.sizeof(cls.STRUCT)
            encoded = device_uuid.encode()[: consts["VGPU_DEVICE_UUID_SIZE"] - 1]
            ffi.memmove(raw.device_uuid, encoded, len(encoded))
            raw.device_index = device_index
            raw.queue_eta_s = consts["VGPU_QUEUE_NO_ESTIMATE"]
            _publish(raw, limits)

        fd, buffer = _create_file(path, cls.STRUCT, mode, fill)
        return cls(path, fd, buffer, writable=True)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = True) -> LimitsPage:
        """Attach to an existing page, validating it as the interposer does; read-only where the
        file is not this process's to write."""
        path = Path(path)
        fd, buffer, writable = _open_file(path, cls.STRUCT, "the slice's limits page", writable=writable)
        page = cls(path, fd, buffer, writable=writable)
        try:
            _check_header(page.raw, path, "limits page", "VGPU_LIMITS_MAGIC", _ffi()[0].sizeof(cls.STRUCT), "page_size")
            page.limits  # noqa: B018 - validates the published limits
        except RegionError:
            page.close()
            raise
        return page

    @property
    def device_uuid(self) -> str:
        uuid = _ffi()[0].string(self.raw.device_uuid)
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    @property
    def device_index(self) -> int:
        return int(self.raw.device_index)

    @property
    def limits(self) -> SliceLimits:
        """The limits in force, read with the sequence protocol of region.h."""
        raw = self.raw
        for _ in range(1000):
            copy = raw.limits[raw.active_limits & 1]
            before = copy.sequence
            memory_limit, sm_share, policy, check = copy.memory_limit, copy.sm_share, copy.policy, copy.check
            if before % 2 == 0 and copy.sequence == before:
                break
        else:
            raise RegionError(f"limits page {self.path}: limits kept changing while being read")
        if check != limits_check(memory_limit, sm_share, policy) or not 1 <= sm_share <= 100 or policy >= len(POLICIES):
            raise RegionError(f"limits page {self.path} is corrupt (limits fail their check)")
        return SliceLimits(memory_limit, sm_share, POLICIES[policy])

    def set_limits(
        self, memory_limit: int | None = None, sm_share: int | None = None, policy: str | None = None
    ) -> SliceLimits:
        """Publish new limits; every process of the slice applies them on its next hooked call."""
        with self._writing():
            current = self.limits
            new = SliceLimits(
                current.memory_limit if memory_limit is None else memory_limit,
                current.sm_share if sm_share is None else sm_share,
                current.policy if policy is None else policy,
            )
            _publish(self.raw, new)
            return new

    def restore(self, limits: SliceLimits) -> None:
        """Publish ``limits`` whatever the page holds now, a corrupt copy included: the publisher
        re-asserting the ledger's limits over a page someone else wrote."""
        with self._writing():
            _publish(self.raw, limits)

    @property
    def suspended(self) -> bool:
        """Whether the publisher holds the slice's processes suspended (checkpointed)."""
        return bool(self.raw.suspended)

    def set_suspended(self, suspended: bool) -> None:
        """Tell the slice's processes it is suspended (set before the checkpoint, cleared after
        the resume): their CUDA calls, hooked or not, then count resume requests (Region.resume_requests)
        and wait in libvgpu.so until it is cleared (or :meth:`leave_line`). Clearing it clears
        the reason of :meth:`set_taken_back` too."""
        with self._writing():
            if not suspended:
                self.raw.wait_reason = constants()["VGPU_WAIT_FOR_ROOM"]
            self.raw.suspended = int(suspended)

    def set_taken_back(self, taken_back: bool) -> None:
        """Borrowed room is being taken back from the slice (a classroom's broker): raise the
        suspended flag with that reason ahead of the suspend, so that its processes' CUDA calls
        wait in libvgpu.so (their GPU work drains before the driver's lock) and say why in the
        cell's output; False: the request lapsed, clear both."""
        consts = constants()
        with self._writing():
            self.raw.wait_reason = consts["VGPU_WAIT_TAKEN_BACK"] if taken_back else consts["VGPU_WAIT_FOR_ROOM"]
            self.raw.suspended = int(taken_back)

    @property
    def taken_back(self) -> bool:
        """Whether the page says the slice's room is taken back (see :meth:`set_taken_back`)."""
        return bool(self.raw.suspended) and self.raw.wait_reason == constants()["VGPU_WAIT_TAKEN_BACK"]

    # -- the slice's place in line, while its processes wait for room ---------------------------

    def set_queue(self, position: int, eta_seconds: float | None) -> None:
        """Publish the slice's place in its device's line (1: next; 0: not known, or not in line)
        and the seconds until its room is expected (None: no estimate). A process of the slice
        waiting for room in libvgpu.so prints it in the cell's output (again when it changes, at
        most once a second)."""
        consts = constants()
        if not 0 <= position <= 0xFFFFFFFF:
            raise ValueError(f"a place in line is 0 (not known) or a positive number, not {position}")
        if eta_seconds is None:
            eta = consts["VGPU_QUEUE_NO_ESTIMATE"]
        elif eta_seconds >= 0:
            eta = min(round(eta_seconds), consts["VGPU_QUEUE_NO_ESTIMATE"] - 1)
        else:
            raise ValueError(f"an estimate is seconds from now, 0 or more, not {eta_seconds}")
        with self._writing():
            raw = self.raw
            # region.h's queue_sequence protocol: odd while the pair is being written (x86-64 and
            # arm64 keep these aligned 4-byte stores whole, and CPython makes them in this order).
            sequence = raw.queue_sequence + 1 if raw.queue_sequence % 2 == 0 else raw.queue_sequence
            raw.queue_sequence = sequence & 0xFFFFFFFF
            raw.queue_position = position
            raw.queue_eta_s = eta
            raw.queue_sequence = (sequence + 1) & 0xFFFFFFFF

    @property
    def queue(self) -> tuple[int, int | None]:
        """The published place in line and estimate in seconds (None: no estimate), read with the
        sequence protocol of region.h; (0, None) when not in line or not known."""
        raw = self.raw
        for _ in range(1000):
            before = raw.queue_sequence
            position, eta = raw.queue_position, raw.queue_eta_s
            if before % 2 == 0 and raw.queue_sequence == before:
                break
        else:
            raise RegionError(f"limits page {self.path}: the place in line kept changing while being read")
        if position == 0:
            return 0, None
        return int(position), None if eta == constants()["VGPU_QUEUE_NO_ESTIMATE"] else int(eta)

    def leave_line(self) -> None:
        """The user interrupted the kernel: every CUDA call of the slice waiting for room gives up
        (CUDA_ERROR_OUT_OF_MEMORY, which frameworks raise as their out-of-memory error) and the
        process's calls fail at once for the next 2 s; the slice stays suspended."""
        with self._writing():
            self.raw.leave_line = (self.raw.leave_line + 1) & 0xFFFFFFFF

    @property
    def leave_line_count(self) -> int:
        """How many times the publisher made the slice's waiting calls leave the line, ever."""
        return int(self.raw.leave_line)

    def request_release(self) -> int:
        """Ask every process of the slice to give back cached device memory it does not use (the
        driver's stream-ordered pools trimmed by libvgpu.so, PyTorch's and CuPy's caches emptied by
        the kernel's Python side), never what the program holds; each answers in its region slot
        (:meth:`Region.release_answers`). Returns the request's number (never 0)."""
        with self._writing():
            request = (self.raw.release_request + 1) & 0xFFFFFFFF or 1
            self.raw.release_request = request
            return request

    @property
    def release_request(self) -> int:
        """The latest release request (0: none ever)."""
        return int(self.raw.release_request)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        if not self.writable:
            raise RegionError(
                f"limits page {self.path} is not this process's to write: its publisher (the node's GPU broker) sets the limits"
            )
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


def _publish(raw: Any, limits: SliceLimits) -> None:
    spare_index = (raw.active_limits & 1) ^ 1
    spare = raw.limits[spare_index]
    policy = POLICIES.index(limits.policy)
    # x86-64 and arm64 keep these aligned 8-byte stores whole; the odd sequence marks the copy
    # as being written, and readers only look at it once `active_limits` points to it.
    spare.sequence = spare.sequence + 1 if spare.sequence % 2 == 0 else spare.sequence
    spare.memory_limit = limits.memory_limit
    spare.sm_share = limits.sm_share
    spare.policy = policy
    spare.check = limits_check(limits.memory_limit, limits.sm_share, policy)
    spare.sequence += 1
    raw.active_limits = spare_index


class Region(_MappedFile):
    """A mapped region file and its limits page. Create one per slice with :meth:`create`;
    attach with :meth:`open`."""

    STRUCT = "struct vgpu_region"

    def __init__(self, path: Path, fd: int, buffer: mmap.mmap, page: LimitsPage):
        super().__init__(path, fd, buffer)
        self.page = page

    # -- life cycle --------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        memory_limit: int = 0,
        sm_share: int = 100,
        policy: str = "hard",
        device_uuid: str = "",
        device_index: int = -1,
        mode: int = 0o600,
        page: LimitsPage | None = None,
    ) -> Region:
        """Create (or replace) the region file of a new slice. Its limits page is ``page`` where
        someone else published it (the broker), else one made here beside the region with these
        limits and device."""
        ffi, consts = _ffi()
        path = Path(path)
        owned = page is None
        if page is None:
            page = LimitsPage.create(
                default_limits_path(path),
                SliceLimits(memory_limit, sm_share, policy),
                device_uuid=device_uuid,
                device_index=device_index,
                mode=mode,
            )

        def fill(raw: Any) -> None:
            raw.magic = consts["VGPU_REGION_MAGIC"]
            raw.version = consts["VGPU_REGION_VERSION"]
            raw.region_size = ffi.sizeof(cls.STRUCT)
            raw.max_procs = consts["VGPU_REGION_MAX_PROCS"]

        try:
            fd, buffer = _create_file(path, cls.STRUCT, mode, fill)
        except BaseException:
            if owned:
                page.close()
                page.path.unlink(missing_ok=True)
            raise
        return cls(path, fd, buffer, page)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        limits_path: str | os.PathLike[str] | None = None,
        publisher: bool = True,
    ) -> Region:
        """Attach to an existing region and its limits page (``limits_path``, else the default
        beside the region), validating both as the interposer does. Only a ``publisher`` (the
        server) asks to write the page; a reader inside the slice maps it read-only."""
        path = Path(path)
        # The region first: a slice whose region is gone is named by it, not by its page.
        fd, buffer, _ = _open_file(path, cls.STRUCT, "slice region", writable=True)
        try:
            page = LimitsPage.open(limits_path or default_limits_path(path), writable=publisher)
        except BaseException:
            buffer.close()
            os.close(fd)
            raise
        region = cls(path, fd, buffer, page)
        try:
            _check_header(
                region.raw, path, "slice region", "VGPU_REGION_MAGIC", _ffi()[0].sizeof(cls.STRUCT), "region_size"
            )
        except RegionError:
            region.close()
            raise
        return region

    def close(self) -> None:
        super().close()
        self.page.close()

    # -- limits (the page's) -----------------------------------------------------------------

    @property
    def limits(self) -> SliceLimits:
        return self.page.limits

    def set_limits(
        self, memory_limit: int | None = None, sm_share: int | None = None, policy: str | None = None
    ) -> SliceLimits:
        return self.page.set_limits(memory_limit, sm_share, policy)

    def restore(self, limits: SliceLimits) -> None:
        self.page.restore(limits)

    @property
    def device_uuid(self) -> str:
        return self.page.device_uuid

    @property
    def device_index(self) -> int:
        return self.page.device_index

    @property
    def suspended(self) -> bool:
        return self.page.suspended

    def set_suspended(self, suspended: bool) -> None:
        self.page.set_suspended(suspended)

    def set_queue(self, position: int, eta_seconds: float | None) -> None:
        self.page.set_queue(position, eta_seconds)

    @property
    def queue(self) -> tuple[int, int | None]:
        return self.page.queue

    def leave_line(self) -> None:
        self.page.leave_line()

    # -- usage -------------------------------------------------------------------------------

    def _slots(self) -> Iterator[Any]:
        raw = self.raw
        high = min(raw.procs_high_water, raw.max_procs)
        return (raw.procs[index] for index in range(high))

    def processes(self) -> list[ProcessUsage]:
        """Per-process usage of the live processes of the slice.

        A slot whose process is gone (or whose pid now belongs to another process) is left out.
        Python only reads here: freeing such slots is the interposer's job, done with
        compare-and-swap, which Python cannot do on shared memory without racing a claimant.
        """
        return [
            ProcessUsage(**{name: getattr(slot, name) for name in PROCESS_FIELDS})
            for slot in self._slots()
            if slot.pid > 0 and process_start_time(slot.pid) == slot.start_time
        ]

    def used_bytes(self) -> int:
        """Bytes the slice holds: what its live processes allocated plus their driver memory."""
        return sum(process.used for process in self.processes())

    def resume_requests(self) -> int:
        """CUDA calls the live processes made while the slice was suspended, ever: a
        watcher that sees this grow resumes the slice (those calls wait in libvgpu.so)."""
        return sum(process.resume_requests for process in self.processes())

    def release_answers(self) -> dict[int, ReleaseAnswer]:
        """Each live process's answers to the page's release requests, by pid."""
        return {
            slot.pid: ReleaseAnswer(
                pools_answered=slot.pools_answered,
                frameworks_answered=slot.frameworks_answered,
                frameworks_watching=bool(slot.frameworks_watching),
                pools_released=slot.pools_released,
                torch_released=slot.torch_released,
                cupy_released=slot.cupy_released,
            )
            for slot in self._slots()
            if slot.pid > 0 and process_start_time(slot.pid) == slot.start_time
        }

    def release_cached(self, *, wait: float, poll: float = 0.02) -> dict[str, int]:
        """Ask the slice's processes to give back cached device memory they do not use
        (:meth:`LimitsPage.request_release`) and wait up to ``wait`` seconds for every live one to
        answer. Returns the bytes given back by source ("pools", "torch", "cupy"; those that gave
        nothing left out) and "unanswered": how many processes had not answered in time. Nothing
        is asked where no process of the slice runs."""
        if not self.processes():
            return {}
        request = self.page.request_release()
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            answers = self.release_answers()
            waiting = [pid for pid, answer in answers.items() if not answer.answered(request)]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(poll)
        released = {"pools": 0, "torch": 0, "cupy": 0}
        for answer in answers.values():
            if answer.pools_answered == request:
                released["pools"] += answer.pools_released
            if answer.frameworks_watching and answer.frameworks_answered == request:
                released["torch"] += answer.torch_released
                released["cupy"] += answer.cupy_released
        found = {source: count for source, count in released.items() if count}
        if waiting:
            found["unanswered"] = len(waiting)
        return found

    def own_slot(self, pid: int | None = None) -> Any | None:
        """The slot of process ``pid`` (this one by default), or None: the slot its libvgpu.so
        claimed on its first GPU call. Only that process writes it (its Python side too: the
        frameworks' answers to a release request, jupyter_vgpu/notebook/release.py)."""
        pid = os.getpid() if pid is None else pid
        start = process_start_time(pid)
        for slot in self._slots():
            if slot.pid == pid and slot.start_time == start:
                return slot
        return None

    def uses_managed_memory(self) -> bool:
        """Whether a live process of the slice has allocated managed (unified) memory, which the
        driver cannot suspend (freed or not: the interposer counts allocations only)."""
        return any(process.managed_allocations for process in self.processes())

    @property
    def sm_util_permille(self) -> int:
        """SM utilisation of the whole slice over the controller's last period, per mille."""
        return int(self.raw.sm_util_permille)
