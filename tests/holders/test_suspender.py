"""The order of the Suspender's steps (jupyter_vgpu.holders.suspender), with a real ledger and a
holder and checkpoint controller that only record: what the processes of a slice do while it is
being suspended. Real processes suspended and resumed are tests/holders/test_checkpoint.py's and
tests/server/test_suspend.py's."""

from __future__ import annotations

import pytest

from jupyter_vgpu.holders.checkpoint import CheckpointError, Suspendability, SuspendedProcess, Suspension
from jupyter_vgpu.holders.suspender import Suspender
from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger
from jupyter_vgpu.model import Device, SliceLimits

GIB = 1 << 30
GPU = Device("GPU-0", 0, "test", 16 * GIB, 100)


class Holder:
    """The slice's page flag and its processes' resume requests, as LocalHolder keeps them."""

    kind = "local"

    def __init__(self):
        self.suspended = False
        self.requests = 0
        self.released = {}  # what release_cached answers
        self.flag_when_released = None

    def release_cached(self, allocation, *, wait: float) -> dict[str, int]:
        self.flag_when_released = self.suspended
        return self.released

    def set_suspended(self, allocation, suspended: bool) -> None:
        self.suspended = suspended

    def resume_requests(self, allocation) -> int:
        return self.requests

    def slice_processes(self, allocation) -> dict[int, int]:
        return {4242: 1}

    def uses_managed_memory(self, allocation) -> bool:
        return False


class Controller:
    """Suspends at once; `meanwhile` runs while the processes are being locked."""

    def __init__(self, meanwhile):
        self.meanwhile = meanwhile

    def probe(self, pids, *, managed_memory: bool = False) -> Suspendability:
        return Suspendability()

    def suspend(self, pids, *, lock_timeout: float) -> Suspension:
        self.meanwhile()
        return Suspension(tuple(SuspendedProcess(pid, GPU.uuid, GIB) for pid in pids), seconds=0.1)


def test_a_cuda_call_made_while_the_slice_is_being_suspended_asks_for_its_resume(tmp_path):
    holder = Holder()

    def a_background_thread_calls_cuda():
        # The page says suspended from here on: libvgpu.so counts the call, which then waits for
        # the flag to clear, and nothing else would wake the kernel.
        assert holder.suspended
        holder.requests += 1

    with EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU]) as ledger:
        suspender = Suspender(ledger, holder, controller=Controller(a_background_thread_calls_cuda))
        suspended = suspender.suspend(ledger.admit("k", SliceLimits(2 * GIB, 30)), lock_timeout=5)
        assert suspended.suspended
        assert suspender.resume_requested(suspended)


def test_cached_memory_is_released_before_the_flag_goes_up_and_the_notice_says_what(tmp_path):
    from jupyter_vgpu.server.suspend import suspended_notice

    holder = Holder()
    holder.released = {"torch": 2 * GIB, "pools": 512 << 20}
    with EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU]) as ledger:
        suspender = Suspender(ledger, holder, controller=Controller(lambda: None))
        suspended = suspender.suspend(ledger.admit("k", SliceLimits(2 * GIB, 30)), lock_timeout=5)
    # Asked while the flag was down: releasing calls the driver, which waits once it is up.
    assert holder.flag_when_released is False
    assert suspended.metadata["suspended"]["released"] == {"torch": 2 * GIB, "pools": 512 << 20}
    assert suspended_notice("suspended after 20 min idle", suspended).startswith(
        "suspended after 20 min idle: released 2GiB cached by PyTorch and 512MiB kept by the driver's memory "
        "pools; 1GiB moved to host memory; resumes when a cell runs"
    )


def test_calls_made_while_the_slice_ran_do_not_ask_for_a_resume(tmp_path):
    holder = Holder()
    holder.requests = 3  # asked during an earlier suspension, resumed since
    with EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU]) as ledger:
        suspender = Suspender(ledger, holder, controller=Controller(lambda: None))
        suspended = suspender.suspend(ledger.admit("k", SliceLimits(2 * GIB, 30)), lock_timeout=5)
        assert not suspender.resume_requested(suspended)


class FailingRestore(Controller):
    """A driver whose restore fails (as a restore refused for memory that vanished after the
    check does), until ``works`` is set."""

    def __init__(self):
        super().__init__(lambda: None)
        self.works = False
        self.restores = 0

    def resume(self, suspension: Suspension) -> float:
        self.restores += 1
        if not self.works:
            raise CheckpointError("resume incomplete: process 4242 could not be restored: CUDA_ERROR_OUT_OF_MEMORY")
        return 0.2


def test_a_restore_that_fails_rolls_back_to_suspended_and_can_be_tried_again(tmp_path):
    holder, controller = Holder(), FailingRestore()
    with EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU]) as ledger:
        suspender = Suspender(ledger, holder, controller=controller)
        suspended = suspender.suspend(ledger.admit("k", SliceLimits(2 * GIB, 30)), lock_timeout=5)
        with pytest.raises(CheckpointError, match="was not resumed and stays suspended"):
            suspender.resume(suspended)
        # Nothing half-done: still suspended in the ledger (its room lent), its page still says so.
        again = ledger.get("k")
        assert again.suspended and again.host_memory == GIB and holder.suspended
        (usage,) = ledger.devices_usage()
        assert usage.memory_free == 16 * GIB
        controller.works = True
        resumed = suspender.resume(again)
        assert not resumed.suspended and not holder.suspended and controller.restores == 2
        (usage,) = ledger.devices_usage()
        assert usage.memory_free == 14 * GIB


class Restore(Controller):
    """Suspends and restores at once; `during_restore` runs while the memory moves back."""

    def __init__(self, during_restore):
        super().__init__(lambda: None)
        self.during_restore = during_restore

    def resume(self, suspension: Suspension) -> float:
        self.during_restore()
        return 0.1


class WatchedLedger:
    """The ledger, telling `asked` what the suspender says of the slice while a resume is decided."""

    def __init__(self, ledger: EmbeddedLedger, asked):
        self.ledger, self.asked = ledger, asked

    def resume(self, kernel_id: str):
        self.asked()
        return self.ledger.resume(kernel_id)

    def __getattr__(self, name: str):
        return getattr(self.ledger, name)


def test_a_resume_reads_resuming_only_while_its_memory_moves_not_while_it_waits_for_room(tmp_path):
    """Issue 34 items 3 and 4: a borrower taken back, whose resume is refused while the claimant
    holds the room, read `resuming` for the moment of each refused try; a listing says `resuming`
    only once the room is its own and the memory moves back."""
    seen: list[tuple[str, str | None]] = []
    holder = Holder()
    with EmbeddedLedger(tmp_path / "ledger.sqlite", [GPU]) as ledger:
        suspender: Suspender

        def deciding() -> None:
            seen.append(("deciding", suspender.moving("k")))

        def restoring() -> None:
            seen.append(("restoring", suspender.moving("k")))

        suspender = Suspender(WatchedLedger(ledger, deciding), holder, controller=Restore(restoring))
        suspended = suspender.suspend(ledger.admit("k", SliceLimits(2 * GIB, 30)), lock_timeout=5)
        ledger.admit("claimant", SliceLimits(16 * GIB, 30))  # holds the room
        with pytest.raises(CapacityError):
            suspender.resume(suspended)
        assert seen == [("deciding", None)]
        ledger.release("claimant")
        assert not suspender.resume(ledger.get("k")).suspended
        assert seen[1:] == [("deciding", None), ("restoring", "resuming")]
        assert suspender.moving("k") is None
