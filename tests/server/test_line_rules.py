"""The line means the same everywhere (issue 34 item 3), the slice manager's side: a growth past
what is free waits in line for a suspended (or lent) slice as for a running one; a growth past the
whole GPU is refused in the start's one sentence; what a waiting request says it waits for is
never empty and its free figure is the GPU's; a waiting growth survives a server restart. A real
SliceManager and EmbeddedLedger on one 16 GiB GPU, with a holder that only records limits."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_vgpu.holders import SliceUsage
from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger
from jupyter_vgpu.line import NOT_TRIED, Line, Request
from jupyter_vgpu.manager import RESIZE_WAITING_KEY, SliceManager
from jupyter_vgpu.model import Device, SliceLimits
from jupyter_vgpu.server.suspend import SuspendedKernels

GIB = 1 << 30
GPU = Device(
    uuid="GPU-00000000-0000-4000-8000-000000000001", index=1, name="test GPU", memory_total=16 * GIB, sm_count=100
)


class Holder:
    """A local holder as far as resizing goes: the slice holds nothing; limits are applied."""

    kind = "local"

    def create(self, allocation) -> None: ...

    def check_limits(self, allocation, wanted) -> None: ...

    def apply_limits(self, allocation) -> None: ...

    def usage(self, allocation) -> SliceUsage:
        return SliceUsage("unused")

    def is_alive(self, allocation) -> bool:
        return True

    def stop(self, allocation) -> list[str]:
        return []

    def release(self, kernel_id: str) -> None: ...

    def sweep(self, kept: set[str]) -> list[str]:
        return []


@pytest.fixture
def ledger_path(tmp_path):
    return tmp_path / "ledger.sqlite"


def manager_of(ledger: EmbeddedLedger) -> SliceManager:
    return SliceManager(ledger, [Holder()], SliceLimits(GIB))


def full_but_two_gib(manager: SliceManager) -> None:
    """A kernel holds 12 of the GPU's 16 GiB; "grower" has 2 GiB: 2 GiB are free on the GPU."""
    manager.admit("big", SliceLimits(12 * GIB, 20))
    manager.admit("grower", SliceLimits(2 * GIB, 20))


async def resize_waits(manager: SliceManager, kernel_id: str, memory: str) -> Request:
    resized = await manager.resize_in_line(kernel_id, memory=memory)
    assert resized.memory_limit < 8 * GIB  # as it was
    request = manager.line.get(kernel_id)
    assert request is not None and request.kind == "resize"
    return request


def test_a_growth_past_what_is_free_waits_in_line_for_a_suspended_slice_as_for_a_running_one(ledger_path):
    """It was refused (409, "it can grow to at most 0B") for a suspended or lent slice."""
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        manager = manager_of(ledger)
        full_but_two_gib(manager)
        ledger.suspend("grower", host_memory=0, details={"lent": True})  # its 2 GiB lent: 4 GiB free
        ledger.admit("taker", SliceLimits(4 * GIB, 10))  # and taken

        request = asyncio.run(resize_waits(manager, "grower", "8GiB"))
        # A suspended slice holds no room: it waits for all of its new size.
        assert (request.memory, request.waiting_for) == (8 * GIB, "8GiB more GPU memory (0B free)")
        assert manager.line.place("grower").waiting_for == "8GiB more GPU memory (0B free)"


def test_a_waiting_growth_says_what_it_lacks_with_the_gpus_free_figure(ledger_path):
    """A running slice's refusal counts its own room as available: "4GiB free" was said while the
    GPU had 2."""
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        manager = manager_of(ledger)
        full_but_two_gib(manager)
        request = asyncio.run(resize_waits(manager, "grower", "8GiB"))
        assert (request.memory, request.waiting_for) == (6 * GIB, "4GiB more GPU memory (2GiB free)")


def test_a_growth_past_the_whole_gpu_is_refused_in_the_starts_one_sentence(ledger_path):
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        manager = manager_of(ledger)
        full_but_two_gib(manager)
        with pytest.raises(CapacityError) as refused:
            asyncio.run(manager.resize_in_line("grower", memory="20GiB"))
        sentence = "Its 20GiB GPU slice can never fit: GPU 1 has 16GiB in all. Ask for 16GiB or less."
        assert str(refused.value) == sentence
        assert "stop" not in str(refused.value)
        assert "grower" not in manager.line


def test_a_request_in_line_says_what_it_waits_for_before_its_first_try():
    async def never() -> bool:
        return False

    line = Line()
    line.join(Request("k", "resume", GIB, 10, GPU.uuid, never))
    assert line.place("k").waiting_for == NOT_TRIED != ""


def test_a_waiting_growth_survives_a_server_restart_with_its_place(ledger_path):
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        manager = manager_of(ledger)
        full_but_two_gib(manager)
        since = asyncio.run(resize_waits(manager, "grower", "8GiB")).since
        assert ledger.get("grower").metadata[RESIZE_WAITING_KEY] == {
            "memory": "8GiB",
            "cores": 20,
            "policy": "hard",
            "since": since,
        }

    with EmbeddedLedger(ledger_path, [GPU]) as ledger:  # the restarted server
        manager = manager_of(ledger)
        assert "grower" not in manager.line
        restarted = SuspendedKernels(manager, {"grower": object(), "big": object()}, hold=0.0)
        asyncio.run(restarted.check(ledger.allocations()))
        request = manager.line.get("grower")
        assert (request.kind, request.since, request.memory) == ("resize", since, 6 * GIB)

        async def room_comes() -> None:
            manager.release("big")
            await manager.line.serve()

        asyncio.run(room_comes())
        grown = ledger.get("grower")
        assert grown.memory_limit == 8 * GIB and grown.metadata.get(RESIZE_WAITING_KEY) is None
        assert "grower" not in manager.line


def test_kernels_suspended_for_a_resume_its_user_asked_for_are_told_it_was_opened(ledger_path):
    """Issue 34 item 3: the notice of a kernel suspended to make room for one its user opened (the
    lab's sign) said "for a kernel that ran again"."""
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        manager = manager_of(ledger)
        manager.admit("opened", SliceLimits(2 * GIB, 20))
        ledger.suspend("opened", host_memory=GIB, details={})
        manager.admit("ran", SliceLimits(2 * GIB, 20))
        ledger.suspend("ran", host_memory=GIB, details={})
        wanted = []

        async def room_maker(room) -> bool:
            wanted.append(room.for_whom)
            return False

        manager.room_maker = room_maker
        resumes = SuspendedKernels(manager, {"opened": object(), "ran": object()}, hold=0.0)
        resumes.wake("opened")
        resumes.join_line(ledger.get("ran"))
        for kernel_id in ("opened", "ran"):
            asyncio.run(manager.line.make_room(manager.line.get(kernel_id)))
        assert wanted == ["a kernel its user opened", "a kernel that ran again"]
