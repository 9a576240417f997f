"""A slice's region: the shared-memory file through which the server publishes limits and the
interposer in every process of the slice reports usage.

The layout is read through cffi from the very header the C side compiles
(``native/include/vgpu/region.h``), so the two cannot drift apart. Python writes settings and
reads counters; the C side owns the counters. Limits are published through the two-copy
sequence protocol the header describes, with an ``flock`` serialising writers.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
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
class ProcessUsage:
    pid: int
    allocated: int
    driver_reserved: int
    launches: int
    throttled_ns: int
    sm_util_permille: int
    oom_refusals: int

    @property
    def used(self) -> int:
        return self.allocated + self.driver_reserved


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, or 0 when the process is gone (as vgpu/proc.h)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return 0
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[19])


class Region:
    """A mapped region file. Create one per slice with :meth:`create`; attach with :meth:`open`."""

    def __init__(self, path: Path, fd: int, buffer: mmap.mmap):
        ffi, _ = _ffi()
        self.path = path
        self._fd = fd
        self._mmap = buffer
        # A cffi pointer into the mapping: its fields are region.h's struct vgpu_region, which
        # mypy cannot see, so it is typed Any.
        self.raw: Any = ffi.from_buffer("struct vgpu_region *", buffer)

    # -- life cycle --------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        memory_limit: int,
        sm_share: int = 100,
        policy: str = "hard",
        device_uuid: str,
        device_index: int,
        mode: int = 0o600,
    ) -> Region:
        """Create (or replace) the region file of a new slice, with its first limits."""
        ffi, consts = _ffi()
        path = Path(path)
        size = ffi.sizeof("struct vgpu_region")
        # Build the file aside and rename it in, so an attaching process never sees it half made.
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.ftruncate(fd, size)
            buffer = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            region = cls(path, fd, buffer)
            raw = region.raw
            raw.magic = consts["VGPU_REGION_MAGIC"]
            raw.version = consts["VGPU_REGION_VERSION"]
            raw.region_size = size
            raw.max_procs = consts["VGPU_REGION_MAX_PROCS"]
            encoded = device_uuid.encode()[: consts["VGPU_DEVICE_UUID_SIZE"] - 1]
            ffi.memmove(raw.device_uuid, encoded, len(encoded))
            raw.device_index = device_index
            region._publish(SliceLimits(memory_limit, sm_share, policy))
            os.rename(staging, path)
        except BaseException:
            os.close(fd)
            staging.unlink(missing_ok=True)
            raise
        return region

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Region:
        """Attach to an existing region, validating it as the interposer does."""
        ffi, consts = _ffi()
        path = Path(path)
        size = ffi.sizeof("struct vgpu_region")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RegionError(f"slice region {path} does not exist") from None
        try:
            if os.fstat(fd).st_size < size:
                raise RegionError(f"slice region {path} is {os.fstat(fd).st_size} bytes, expected {size}")
            region = cls(path, fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        except BaseException:
            os.close(fd)
            raise
        magic, version, region_size = region.raw.magic, region.raw.version, region.raw.region_size
        try:
            if magic != consts["VGPU_REGION_MAGIC"]:
                raise RegionError(f"slice region {path} is not a jupyter-vgpu region (bad magic)")
            if version != consts["VGPU_REGION_VERSION"] or region_size != size:
                raise RegionError(
                    f"slice region {path} is version {version}, this jupyter-vgpu reads version "
                    f"{consts['VGPU_REGION_VERSION']}"
                )
            region.limits  # noqa: B018 - validates the published limits
        except RegionError:
            region.close()
            raise
        return region

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

    # -- limits ------------------------------------------------------------------------------

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
            raise RegionError(f"slice region {self.path}: limits kept changing while being read")
        if check != limits_check(memory_limit, sm_share, policy) or not 1 <= sm_share <= 100 or policy >= len(POLICIES):
            raise RegionError(f"slice region {self.path} is corrupt (limits fail their check)")
        return SliceLimits(memory_limit, sm_share, POLICIES[policy])

    def set_limits(
        self, memory_limit: int | None = None, sm_share: int | None = None, policy: str | None = None
    ) -> SliceLimits:
        """Publish new limits; every process of the slice applies them on its next hooked call."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            current = self.limits
            new = SliceLimits(
                current.memory_limit if memory_limit is None else memory_limit,
                current.sm_share if sm_share is None else sm_share,
                current.policy if policy is None else policy,
            )
            self._publish(new)
            return new
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def restore(self, limits: SliceLimits) -> None:
        """Publish ``limits`` whatever the region holds now, a corrupt copy included: the server
        re-asserting the ledger's limits over a region someone else wrote."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._publish(limits)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _publish(self, limits: SliceLimits) -> None:
        raw = self.raw
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

    # -- usage -------------------------------------------------------------------------------

    @property
    def device_uuid(self) -> str:
        uuid = _ffi()[0].string(self.raw.device_uuid)
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    @property
    def device_index(self) -> int:
        return int(self.raw.device_index)

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
            ProcessUsage(
                pid=slot.pid,
                allocated=slot.allocated,
                driver_reserved=slot.driver_reserved,
                launches=slot.launches,
                throttled_ns=slot.throttled_ns,
                sm_util_permille=slot.sm_util_permille,
                oom_refusals=slot.oom_refusals,
            )
            for slot in self._slots()
            if slot.pid > 0 and process_start_time(slot.pid) == slot.start_time
        ]

    def used_bytes(self) -> int:
        """Bytes the slice holds: what its live processes allocated plus their driver memory."""
        return sum(process.used for process in self.processes())

    @property
    def sm_util_permille(self) -> int:
        """SM utilisation of the whole slice over the controller's last period, per mille."""
        return int(self.raw.sm_util_permille)
