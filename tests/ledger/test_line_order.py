"""The line's order, on its own: first come, first served per device, backfill only by requests
smaller than every one waiting ahead, leaving, and places. Requests here are plain counters of
room (no server), so each rule can be shown exactly."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_vgpu.line import LeftLine, Line, Request


class Device:
    """Room on one device, taken by requests that fit, in the order they are tried."""

    def __init__(self, memory: int, share: int = 100):
        self.memory, self.share = memory, share
        self.served: list[str] = []

    def request(self, name: str, memory: int, share: int = 1, device: str | None = "gpu0", since: float = 0.0):
        async def attempt() -> bool:
            if memory > self.memory or share > self.share:
                return False
            self.memory -= memory
            self.share -= share
            self.served.append(name)
            return True

        return Request(name, "start", memory, share, device, attempt, since=since)


async def test_first_come_first_served_and_a_smaller_request_backfills_behind_a_waiting_one():
    gpu = Device(memory=4)
    line = Line()
    for request in (
        gpu.request("big", 6, since=1),  # waits for room that is not there
        gpu.request("medium", 5, since=2),  # not smaller than everyone ahead in both: waits behind
        gpu.request("small", 3, since=3),  # smaller than both ahead: goes first, into room they cannot use
        gpu.request("tiny", 2, since=4),  # would fit in what is left? 1 GiB left: no, it waits
    ):
        line.join(request)
    await line.serve()
    assert gpu.served == ["small"]
    assert [(r.kernel_id, line.place(r.kernel_id).position) for r in line.requests()] == [
        ("big", 1),
        ("medium", 2),
        ("tiny", 3),
    ]

    gpu.memory += 9  # room comes back: served strictly in order of arrival
    await line.serve()
    assert gpu.served == ["small", "big", "tiny"]  # medium (5) does not fit in the 4 left after big
    assert [request.kernel_id for request in line.requests()] == ["medium"]


async def test_a_larger_request_never_overtakes_one_waiting_ahead_even_when_it_fits():
    gpu = Device(memory=4, share=100)
    line = Line()
    line.join(gpu.request("first", 6, share=10, since=1))
    line.join(gpu.request("more_share", 2, share=50, since=2))  # less memory but more SM share: waits
    await line.serve()
    assert gpu.served == [] and line.place("more_share").position == 2


async def test_requests_for_other_devices_do_not_wait_behind_each_other():
    gpu0, gpu1 = Device(memory=1), Device(memory=8)
    line = Line()
    line.join(gpu0.request("on0", 4, device="gpu0", since=1))
    line.join(gpu1.request("on1", 6, device="gpu1", since=2))
    await line.serve()
    assert gpu1.served == ["on1"] and line.place("on0").position == 1


async def test_a_request_for_any_device_waits_behind_every_request_ahead_of_it():
    gpu = Device(memory=1)
    line = Line()
    line.join(gpu.request("named", 4, device="gpu0", since=1))
    line.join(gpu.request("any", 4, device=None, since=2))
    await line.serve()
    assert line.place("any").position == 2


async def test_a_start_waits_until_served_and_leaving_fails_it_with_why():
    gpu = Device(memory=0)
    line = Line(retry_interval=0.01)
    served = asyncio.ensure_future(line.wait(gpu.request("a", 1)))
    left = asyncio.ensure_future(line.wait(gpu.request("b", 1, since=1)))
    await line.joined("a")
    await line.joined("b")
    assert line.leave("b", "its kernel was shut down")
    with pytest.raises(LeftLine, match="shut down"):
        await left
    gpu.memory = 1  # the waiter's own retries serve it: nothing else drives this line
    await asyncio.wait_for(served, 5)
    assert gpu.served == ["a"] and len(line) == 0


async def test_cancelling_a_wait_leaves_the_line():
    line = Line(retry_interval=0.01)
    waiting = asyncio.ensure_future(line.wait(Device(memory=0).request("a", 1)))
    await line.joined("a")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert "a" not in line


async def test_a_request_whose_attempt_fails_leaves_the_line_with_its_error():
    async def refused() -> bool:
        raise ValueError("the owner's budget is spent")

    line = Line()
    waiting = asyncio.ensure_future(line.wait(Request("a", "start", 1, 1, None, refused)))
    with pytest.raises(ValueError, match="budget"):
        await asyncio.wait_for(waiting, 5)
    assert "a" not in line


async def test_room_is_made_only_for_the_first_request_on_a_device():
    asked: list[str] = []
    gpu = Device(memory=0)

    async def make_room(request: Request) -> bool:
        asked.append(request.kernel_id)
        return False

    line = Line(make_room=make_room)
    line.join(gpu.request("first", 4, since=1))
    line.join(gpu.request("second", 2, since=2))
    await line.serve()
    assert asked == ["first"]


async def test_places_are_published_when_they_change():
    published: list[tuple[str, int]] = []
    gpu = Device(memory=0)
    line = Line(published=lambda request, place: published.append((request.kernel_id, place.position)))
    line.join(gpu.request("a", 1, since=1))
    line.join(gpu.request("b", 1, since=2))
    await line.serve()
    await line.serve()  # nothing changed: nothing published again
    assert published == [("a", 1), ("b", 2)]
    line.leave("a", "interrupted")
    await line.serve()
    assert published[-1] == ("b", 1)


async def test_a_broker_is_told_of_each_attempt_and_of_each_request_that_leaves_unserved():
    told: list[tuple[str, str]] = []
    gpu = Device(memory=3)
    line = Line(
        entered=lambda request: told.append(("entered", request.kernel_id)),
        left=lambda request: told.append(("left", request.kernel_id)),
    )
    line.join(gpu.request("big", 4, since=1))  # tried, waits
    line.join(gpu.request("blocked", 5, since=2))  # behind it and not smaller: never tried
    line.join(gpu.request("small", 2, since=3))  # backfills: tried and served
    await line.serve()
    assert told == [("entered", "big"), ("entered", "small")]  # served: nothing more to tell
    line.leave("blocked", "shut down")
    assert told[-1] == ("left", "blocked")
