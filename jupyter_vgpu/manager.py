"""Slices of running kernels: the ledger's decisions carried out on region files.

The :class:`SliceManager` is what the server extension, its REST handlers and the kernel
provisioner share: admitting a slice takes a ledger decision and then creates the slice's
region; resizing re-decides and then publishes the new limits into the region, where every
process of the kernel applies them on its next CUDA call; releasing does the reverse. Imports
go one way: handlers and the provisioner -> slices -> ledger, region.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import LoggingConfigurable

from jupyter_vgpu.model.devices import Device
from jupyter_vgpu.ledger.embedded import Allocation, Ledger, SliceRequest, UnknownSlice
from jupyter_vgpu.holders.region import ProcessUsage, Region, RegionError, process_start_time
from jupyter_vgpu.holders.local import slice_environment


@dataclass(frozen=True)
class SliceStatus:
    """A slice as the REST API and the CLI show it."""

    allocation: Allocation
    processes: list[ProcessUsage]
    memory_used: int
    sm_util_percent: float
    state: str  # "running" | "idle" (no process of the kernel is in the slice) | "lost" (region gone)


class SliceManager(LoggingConfigurable):
    """Owns the regions of the slices in a ledger. One per server process."""

    _current: SliceManager | None = None

    @classmethod
    def current(cls) -> SliceManager | None:
        """The server's manager, which kernel provisioners in the same process use."""
        return cls._current

    def make_current(self) -> None:
        SliceManager._current = self

    def __init__(self, ledger: Ledger, devices: list[Device], region_dir: Path, simulate: bool, **kwargs):
        super().__init__(**kwargs)
        self.ledger = ledger
        self.devices = devices
        self.region_dir = Path(region_dir)
        self.region_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.simulate = simulate
        self._regions: dict[str, Region] = {}

    # -- decisions ---------------------------------------------------------------------------

    def admit(
        self, kernel_id: str, request: SliceRequest, *, owner: str = "", device=None, metadata: dict | None = None
    ) -> Allocation:
        """A slice for a kernel about to start: a ledger decision, then its region."""
        allocation = self.ledger.admit(kernel_id, request, owner=owner, device=device, metadata=metadata)
        try:
            path = self.region_dir / f"{kernel_id}.region"
            self._regions[kernel_id] = Region.create(
                path,
                memory_limit=allocation.memory_limit,
                sm_share=allocation.sm_share,
                policy=allocation.policy,
                device_uuid=allocation.device_uuid,
                device_index=allocation.device_index,
            )
            return self.ledger.update_metadata(kernel_id, region=str(path))
        except BaseException:
            self.ledger.release(kernel_id)
            raise

    def resize(self, kernel_id: str, *, memory_limit=None, sm_share=None, policy=None) -> Allocation:
        """Re-decide a slice and publish the new limits to every process in it."""
        allocation = self.ledger.resize(kernel_id, memory_limit=memory_limit, sm_share=sm_share, policy=policy)
        self.region(kernel_id).set_limits(
            memory_limit=allocation.memory_limit, sm_share=allocation.sm_share, policy=allocation.policy
        )
        return allocation

    def release(self, kernel_id: str) -> Allocation | None:
        allocation = self.ledger.release(kernel_id)
        region = self._regions.pop(kernel_id, None)
        if region is not None:
            region.close()
        if allocation is not None and allocation.metadata.get("region"):
            Path(allocation.metadata["region"]).unlink(missing_ok=True)
        return allocation

    def record_kernel_process(self, kernel_id: str, pid: int) -> None:
        """Remember the kernel's process so a restarted server can tell whether it still runs."""
        self.ledger.update_metadata(kernel_id, pid=pid, pid_start_time=process_start_time(pid))

    def issue_kernel_credential(self, kernel_id: str) -> str:
        """A fresh secret for the kernel's process to call the REST API with (see handlers.py for
        what it allows). Only its hash is kept in the ledger; a restart issues a new one."""
        credential = secrets.token_urlsafe(32)
        self.ledger.update_metadata(kernel_id, credential_sha256=_digest(credential))
        return credential

    def kernel_with_credential(self, credential: str) -> str | None:
        """The kernel whose current credential this is, if any."""
        digest = _digest(credential)
        for allocation in self.ledger.allocations():
            if hmac.compare_digest(allocation.metadata.get("credential_sha256", ""), digest):
                return allocation.kernel_id
        return None

    # -- reading -----------------------------------------------------------------------------

    def get(self, kernel_id: str) -> Allocation:
        allocation = self.ledger.get(kernel_id)
        if allocation is None:
            raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}")
        return allocation

    def region(self, kernel_id: str) -> Region:
        region = self._regions.get(kernel_id)
        if region is None:
            region = self._regions[kernel_id] = Region.open(self.get(kernel_id).metadata["region"])
        return region

    def environment(self, kernel_id: str, base_env: dict[str, str] | None = None) -> dict[str, str]:
        return slice_environment(self.region(kernel_id), simulate=self.simulate, base_env=base_env)

    def status(self, allocation: Allocation) -> SliceStatus:
        try:
            region = self.region(allocation.kernel_id)
        except (RegionError, KeyError):
            return SliceStatus(allocation, [], 0, 0.0, "lost")
        processes = region.processes()
        return SliceStatus(
            allocation=allocation,
            processes=processes,
            memory_used=sum(process.used for process in processes),
            sm_util_percent=region.sm_util_permille / 10 if processes else 0.0,
            state="running" if processes else "idle",
        )

    def statuses(self) -> list[SliceStatus]:
        return [self.status(allocation) for allocation in self.ledger.allocations()]

    # -- after a restart ---------------------------------------------------------------------

    def reconcile(self) -> list[Allocation]:
        """Release slices whose kernels are gone, and stop orphans a crashed server left behind.

        jupyter_server does not re-adopt kernels it did not start in this process, so a kernel
        that outlived its server would hold GPU memory no one can reach: it is stopped and its
        slice released. Returns what was released.
        """
        for allocation in self.ledger.allocations():
            pid, start_time = allocation.metadata.get("pid"), allocation.metadata.get("pid_start_time")
            if pid and start_time and process_start_time(pid) == start_time:
                self.log.warning("stopping orphaned kernel %s (pid %s) left by a previous server", allocation.kernel_id, pid)
                try:
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        released = self.ledger.reconcile(lambda allocation: False)
        for allocation in released:
            self.release(allocation.kernel_id)
        return released


def _digest(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()
