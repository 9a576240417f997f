"""The line: requests for room on a GPU that do not fit yet wait here instead of being refused.

One line per server, ordered by arrival; a request names a device or takes any. Each pass
(:meth:`Line.serve`: on every watcher tick, and whenever a request joins or room is freed) goes
through the line in order:

- The first request on a device is tried; where it does not fit, room is made for it (the
  ``make_room`` callback: lend what nobody uses, suspend idle kernels) and it is tried again.
- A request behind one that still waits on the same device (or on any) is tried only where it
  asks for less memory and no more SM share than every request ahead of it there (backfill):
  it takes room those ahead could not use now, and since a kernel is suspended losslessly when it
  idles, the room it took comes back to them at the next pass that makes room. It is never given
  room-making of its own, so nobody is overtaken for ever.

The same rule orders a node's broker's line across users' servers (ledger/broker_line.py's
``BrokerLine`` calls :func:`may_go_before`), so that the order holds across servers too.

A request the cluster's scheduler places (a kernel pod: ``placed_by_cluster``) has its place in
the same line, so that it shows and leaves as any other, but the cluster, not this server, decides
when it goes: it is tried at every pass, neither waits behind others nor holds them up, and no
room is made for it; it competes only with other such requests.

The line knows nothing of kernels, ledgers or holders: each request brings its own ``attempt``
(True once it is done), and the slice manager builds requests from starts, resumes and resizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

# What a request may be: a kernel start, a suspended (or lent) kernel taking its room back, or a
# running kernel's slice growing (its ``memory`` and ``sm_share`` are then what it grows by).
KINDS = ("start", "resume", "resize")
# What a request waits for before its first try has said what it lacks (never empty).
NOT_TRIED = "its first try, at the line's next pass"


class LeftLine(Exception):
    """A request that left the line before it was served: ``why`` says how (shut down, interrupted)."""


@dataclass(eq=False)
class Request:
    """One request for room. ``since`` orders the line (epoch seconds; a resume keeps the time it
    first asked, across server restarts); ``device_uuid`` None takes any device."""

    kernel_id: str
    kind: str
    memory: int
    sm_share: int
    device_uuid: str | None
    attempt: Callable[[], Awaitable[bool]]
    since: float = field(default_factory=time.time)
    policy: str = "burst"
    # The last attempt's refusal (what is short where), for the room maker.
    short: Any = None
    # What the last attempt said is missing (a CapacityError or SliceRefused's text), for views.
    waiting_for: str = NOT_TRIED
    # What views show of a start that has no slice yet: kernelspec, owner.
    labels: dict[str, Any] = field(default_factory=dict)
    # Set for a start, whose provisioner awaits it; resumes are served by the watcher.
    done: asyncio.Future[None] | None = None
    # The cluster's scheduler places it (a kernel pod); ``attempt`` says whether it has.
    placed_by_cluster: bool = False

    def covers(self, other: Request) -> bool:
        """Whether this request and ``other`` compete for the same device (or, both placed by the
        cluster, for the cluster's room)."""
        if self.placed_by_cluster != other.placed_by_cluster:
            return False
        return self.device_uuid is None or other.device_uuid is None or self.device_uuid == other.device_uuid

    def smaller_than(self, other: Request) -> bool:
        return self.memory < other.memory and self.sm_share <= other.sm_share


def may_go_before(request: Request, ahead: list[Request]) -> bool:
    """Whether ``request`` may be tried while the requests ``ahead`` of it (earlier, still
    waiting) wait: where none competes for its device, or it is smaller than every one that does
    (backfill), so that it delays nobody ahead for longer than its running cells."""
    return all(request.smaller_than(other) for other in ahead if other.covers(request))


@dataclass(frozen=True)
class Place:
    """Where a request stands: ``position`` 1 is next; ``eta_seconds`` None where the server
    cannot tell (it, or one ahead of it, waits for kernels running cells, whose end nobody knows)."""

    position: int
    eta_seconds: float | None
    waiting_for: str


class Line:
    """The requests waiting for room on this server's devices, served first come, first served."""

    def __init__(
        self,
        *,
        make_room: Callable[[Request], Awaitable[bool]] | None = None,
        published: Callable[[Request, Place], None] | None = None,
        entered: Callable[[Request], None] | None = None,
        left: Callable[[Request], None] | None = None,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        retry_interval: float = 0.5,
    ):
        """``make_room(request)`` makes room for the first request on its device (whether it
        fits now); ``published(request, place)`` is told each request's place after every pass
        in which it changed (a suspended kernel's processes show it in the cell's output);
        ``entered(request)`` is called before each attempt and ``left(request)`` once a request
        leaves unserved (a node's broker keeps its place among other servers' requests)."""
        self.make_room = make_room
        self.published = published
        self.entered = entered
        self.left = left
        self.log = log or logging.getLogger(__name__)
        self.retry_interval = retry_interval
        # Seconds until room comes for a request were it first on its device, None where nobody
        # can tell (the server's timers and measured suspends: server/suspend.py); unset, no estimates.
        self.estimate: Callable[[Request], float | None] | None = None
        self._requests: dict[str, Request] = {}
        self._places: dict[str, Place] = {}
        self._watchers: dict[str, list[asyncio.Future[None]]] = {}
        self._passes: set[asyncio.Task[None]] = set()
        self._serving = False
        self._again = False

    def __contains__(self, kernel_id: str) -> bool:
        return kernel_id in self._requests

    def __len__(self) -> int:
        return len(self._requests)

    def requests(self) -> list[Request]:
        """Every request, first in line first."""
        return sorted(self._requests.values(), key=lambda request: request.since)

    def get(self, kernel_id: str) -> Request | None:
        return self._requests.get(kernel_id)

    def place(self, kernel_id: str) -> Place | None:
        """Where the kernel's request stands, or None where it is not in line."""
        request = self._requests.get(kernel_id)
        return None if request is None else self._place_of(request)

    def waiting_for(self, request: Request) -> list[Request]:
        """The requests in line that compete with ``request`` for a device (any, where it names none)."""
        return [other for other in self.requests() if other is not request and other.covers(request)]

    def joined(self, kernel_id: str) -> asyncio.Future[None]:
        """A future done once the kernel's request is in line (at once where it is already)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if kernel_id in self._requests:
            future.set_result(None)
        else:
            self._watchers.setdefault(kernel_id, []).append(future)
        return future

    def join(self, request: Request) -> Request:
        """Put a request in line (a kernel has one place: joining again keeps the first)."""
        existing = self._requests.get(request.kernel_id)
        if existing is not None:
            return existing
        self._requests[request.kernel_id] = request
        for future in self._watchers.pop(request.kernel_id, []):
            if not future.done():
                future.set_result(None)
        self.log.info(
            "jupyter_vgpu: kernel %s waits in line for GPU room (%s): %s",
            request.kernel_id,
            request.kind,
            request.waiting_for or "no room yet",
        )
        self.kick()
        return request

    async def wait(self, request: Request) -> None:
        """Join the line and wait until the request is served; raises LeftLine where it left
        first. Cancelling the wait (the start was given up) leaves the line."""
        request.done = asyncio.get_running_loop().create_future()
        joined = self.join(request)
        if joined is not request:
            raise RuntimeError(f"kernel {request.kernel_id} is already in line")
        try:
            while not request.done.done():
                # Served by passes the watcher or freed room kicks off; a waiter also kicks one
                # itself every retry_interval, so the line moves where nothing else drives it.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(request.done), self.retry_interval)
                if not request.done.done():
                    await self.serve()
            request.done.result()
        finally:
            self._forget(request)

    def leave(self, kernel_id: str, why: str) -> bool:
        """Take a kernel's request out of the line; whether it was there. A start waiting on it
        fails with LeftLine(why)."""
        request = self._requests.get(kernel_id)
        if request is None:
            return False
        self._forget(request)
        self._tell_left(request)
        if request.done is not None and not request.done.done():
            request.done.set_exception(LeftLine(why))
        self.log.info("jupyter_vgpu: kernel %s left the line: %s", kernel_id, why)
        self.kick()  # those behind it may go now
        return True

    def kick(self) -> None:
        """Serve the line soon (from any thread); coalesced with a pass already under way."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop in this thread: the watcher's next tick serves it
        task = loop.create_task(self.serve())
        # The loop keeps only a weak reference to a task: keep it until it is done.
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def serve(self) -> None:
        """One pass through the line (another right after, where something changed during it)."""
        if self._serving:
            self._again = True
            return
        self._serving = True
        try:
            self._again = True
            while self._again:
                self._again = False
                await self._pass()
        finally:
            self._serving = False

    async def _pass(self) -> None:
        blocked: list[Request] = []
        for request in self.requests():
            if request.kernel_id not in self._requests:
                continue  # left during this pass
            if request.placed_by_cluster:
                if await self._try(request, make_room=False):
                    self._served(request)
                continue
            ahead = [other for other in blocked if other.covers(request)]
            if not may_go_before(request, ahead):
                blocked.append(request)
                continue
            if await self._try(request, make_room=not ahead):
                self._served(request)
            else:
                blocked.append(request)
        self._publish()

    async def _try(self, request: Request, *, make_room: bool) -> bool:
        if self.entered is not None:
            try:
                self.entered(request)
            except Exception as error:  # noqa: BLE001 - the attempt itself says whether it may go
                self.log.warning("jupyter_vgpu: kernel %s's place in line not kept: %s", request.kernel_id, error)
        try:
            if await request.attempt():
                return True
            if make_room and self.make_room is not None and await self.make_room(request):
                return await request.attempt()
        except Exception as error:  # noqa: BLE001 - a request that can no longer be had leaves with why
            self._forget(request)
            self._tell_left(request)
            if request.done is not None and not request.done.done():
                request.done.set_exception(error)
            else:
                self.log.warning("jupyter_vgpu: kernel %s left the line: %s", request.kernel_id, error)
        return False

    def _served(self, request: Request) -> None:
        self._forget(request)
        if request.done is not None and not request.done.done():
            request.done.set_result(None)
        waited = time.time() - request.since
        self.log.info("jupyter_vgpu: kernel %s got its GPU room after %.1f s in line", request.kernel_id, waited)

    def _tell_left(self, request: Request) -> None:
        if self.left is not None:
            try:
                self.left(request)
            except Exception as error:  # noqa: BLE001 - its place elsewhere expires by itself
                self.log.warning("jupyter_vgpu: kernel %s's place in line not given up: %s", request.kernel_id, error)

    def _forget(self, request: Request) -> None:
        if self._requests.get(request.kernel_id) is request:
            del self._requests[request.kernel_id]
            self._places.pop(request.kernel_id, None)

    def _place_of(self, request: Request) -> Place:
        ahead = [other for other in self.requests() if other.since < request.since and other.covers(request)]
        return Place(len(ahead) + 1, self._eta(ahead + [request]), request.waiting_for or NOT_TRIED)

    def _eta(self, requests: list[Request]) -> float | None:
        """The seconds until the last of ``requests`` (those ahead, then the one asking) is served:
        each waits for its own room after those ahead got theirs, so their estimates add up; one
        that nobody can estimate leaves the whole wait unknown."""
        if self.estimate is None:
            return None
        total = 0.0
        for request in requests:
            try:
                seconds = self.estimate(request)
            except Exception as error:  # noqa: BLE001 - a place without an estimate is still true
                self.log.debug("jupyter_vgpu: no estimate for kernel %s: %s", request.kernel_id, error)
                return None
            if seconds is None:
                return None
            total += seconds
        # Whole seconds: views say "about 40 s", and a place republished at every pass only where it moved.
        return float(round(total))

    def _publish(self) -> None:
        for request in self.requests():
            place = self._place_of(request)
            if self._places.get(request.kernel_id) == place:
                continue
            self._places[request.kernel_id] = place
            if self.published is not None:
                with contextlib.suppress(Exception):
                    self.published(request, place)


__all__ = ["KINDS", "NOT_TRIED", "LeftLine", "Line", "Place", "Request", "may_go_before"]
