"""The ledger over HTTP: tornado request handlers that serve one
:class:`~jupyter_vgpu.ledger.base.Ledger` (an EmbeddedLedger in practice) to its clients,
:class:`~jupyter_vgpu.ledger.remote.RemoteLedger`.

The node's broker (a JupyterHub managed service) mounts :func:`ledger_handlers` in its tornado
application so that every user's server decides against one ledger; the tests mount the same
handlers on a bare application. Routes, under a prefix:

=======  ==================================  ==================================================
GET      ``devices``                         ``{"devices": [device, ...]}``
GET      ``usage``                           ``{"usage": [device usage, ...]}``
GET      ``allocations``                     ``{"allocations": [allocation, ...]}``, oldest first
POST     ``allocations``                     admit: 201, the allocation
GET      ``allocations/<kernel id>``         the allocation
PATCH    ``allocations/<kernel id>``         resize: the allocation
DELETE   ``allocations/<kernel id>``         release: the allocation it held
PATCH    ``allocations/<kernel id>/metadata`` merge the body's fields: the allocation
POST     ``allocations/<kernel id>/suspend`` lend a checkpointed slice's room
                                             ``{"host_memory", "details"}``: the allocation
POST     ``allocations/<kernel id>/resume``  admit a suspended slice again: the allocation
POST     ``reconcile``                       release ``{"dead": [{"kernel_id", "created_at"}]}``
                                             where still the same: ``{"released": [...]}``
GET      ``line``                            ``{"line": [waiting request, ...]}``, oldest first, each
                                             with ``owner`` and ``renewed`` (when its server last tried it)
PUT      ``line/<kernel id>``                register (or renew) a waiting request
                                             ``{"kind", "memory", "sm_share", "device", "since"}``
DELETE   ``line/<kernel id>``                take it out of the line: ``{"left": whether it was in}``
=======  ==================================  ==================================================

Records are the dataclasses of :mod:`jupyter_vgpu.ledger.base` as JSON objects, field for field.
Every request carries ``Authorization: token <token>`` (or ``Bearer <token>``), which a
:class:`Gate` turns into a :class:`Caller`: the service's one token (:class:`TokenGate`) is a
caller who may see and change every slice; the broker's gate asks the hub who a token belongs
to, and such a caller sees and changes only the slices it owns (403 for another's), admits
slices in its own name whatever the body says, and within the budget the gate gives it. Every refusal is
JSON, ``{"message": ..., "error": <kind>}``, with ``resource``, ``requested`` and ``available``
for a CapacityError: 400 a body or value not accepted, 401 no token, 403 a wrong token, 404 no
slice for that kernel (or no such route), 409 no room, a slice that exists, or a suspend whose
room is not lent (``NotLent``: its processes still hold device memory, or suspended slices hold
all the host memory they may), 503 the ledger itself failed (its file). Bodies are checked here, at the edge (types, sizes, unknown fields),
so nothing a client sends reaches the ledger in a shape it does not take or becomes a 500.

Making room across users (a :class:`Lending` with ``make_room``, the broker): servers report their
kernels' activity in their slices' metadata (``activity``); a start or a resume refused for lack
of room on a device records ``suspend_requested`` on the longest-idle kernels there that run no
cell, whoever owns them, and its refusal says so. Their servers suspend them at their next check
(through ``.../suspend``, checked like any other). Only the service sets or clears that field: a
metadata update naming ``suspended`` or ``suspend_requested`` is refused (400).

One fair line across users (a :class:`BrokerLine`, the broker): each user's server has a line of
its own (line.py) and registers every request it tries with the time it first asked (``PUT
line/<kernel id>``, renewed at each try); a start, a resume or a growth on a device is admitted
only where no older registered request there would be delayed by it (line.py's rule), else it is
refused with ``resource`` ``line`` (409), which its server takes as "wait in line", not as "no".
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tornado import httputil, web
from tornado.ioloop import IOLoop

from jupyter_vgpu.ledger.base import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    ROOM_FOR_KEY,
    SUSPEND_REQUEST_TIMEOUT_S,
    SUSPEND_REQUESTED_KEY,
    SUSPENDED_KEY,
    TAKE_BACK_KEY,
    Admission,
    Allocation,
    CapacityError,
    Ledger,
    LedgerError,
    OwnerBudget,
    SliceExists,
    UnknownSlice,
)
from jupyter_vgpu.line import KINDS, Request, may_go_before
from jupyter_vgpu.model import FULL_SHARE, SliceLimits, SliceValueError, format_size, select_device

# Far more than any decision needs (a reconcile of a few thousand dead kernels fits), small
# enough that a client cannot make the service parse megabytes.
MAX_BODY_BYTES = 256 * 1024
# Kernel ids are UUIDs; owners, holders and device selectors are short words.
MAX_TEXT = 256
# Metadata is a flat record in practice (pid, region path, pod name); deep nesting is refused
# before it can exhaust the recursion of the JSON encoder inside the ledger.
MAX_METADATA_DEPTH = 16
# SQLite's INTEGER: a number past it would fail inside the ledger, not be refused by it.
INT64 = (-(1 << 63), (1 << 63) - 1)
# update_metadata(kernel_id, **fields) cannot take fields of its own parameters' names.
RESERVED_METADATA = ("kernel_id", "self")

T = TypeVar("T")
# Field name -> (its check, its default or _REQUIRED); Mapping and object so that a spec of
# checks with narrower results (a set, an int) is one too.
FieldSpec = Mapping[str, tuple[Callable[[str, Any], object], object]]


class Refusal(web.HTTPError):
    """A request the ledger or this edge does not carry out, answered as a JSON body that the
    client turns back into the same exception."""

    def __init__(self, status_code: int, message: str, error: str, **fields: Any):
        # No log_message: a refusal is an answer, not a fault of the service, so tornado logs
        # it in the access log only.
        super().__init__(status_code)
        self.body = {"message": message, "error": error, **fields}


def _bad(message: str) -> Refusal:
    return Refusal(400, message, "BadRequest")


# -- checking bodies at the edge ---------------------------------------------------------------

_REQUIRED = object()


def _text(name: str, value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _bad(f"{name} must be a string, not {json.dumps(value)[:60]}")
    if not value and not empty:
        raise _bad(f"{name} must not be empty")
    if len(value) > MAX_TEXT:
        raise _bad(f"{name} must be at most {MAX_TEXT} characters, not {len(value)}")
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON) that no UTF-8 store takes
        raise _bad(f"{name} must be text that UTF-8 can hold") from None
    return value


def _kernel_id(name: str, value: Any) -> str:
    return _text(name, value, empty=False)


def _whole(name: str, value: Any) -> int:
    # Only the type and the storable range are checked here; whether the number is an accepted
    # size or share is the ledger's to say, in the same words as for its other callers.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be a whole number, not {json.dumps(value)[:60]}")
    if not INT64[0] <= value <= INT64[1]:
        raise _bad(f"{name} {value} is out of range")
    return value


def _device(name: str, value: Any) -> int | str:
    return _whole(name, value) if isinstance(value, int) and not isinstance(value, bool) else _text(name, value)


def _metadata(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{name} must be a JSON object, not {json.dumps(value)[:60]}")
    level: list[dict[str, Any] | list[Any]] = [value]
    depth = 1
    while level:
        if depth > MAX_METADATA_DEPTH:
            raise _bad(f"{name} is nested more than {MAX_METADATA_DEPTH} levels deep")
        children = [item for node in level for item in (node.values() if isinstance(node, dict) else node)]
        level, depth = [item for item in children if isinstance(item, (dict, list))], depth + 1
    return value


def _created_at(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"{name} must be a number, not {json.dumps(value)[:60]}")
    return float(value)


def _optional(check: Callable[[str, Any], T]) -> Callable[[str, Any], T | None]:
    return lambda name, value: None if value is None else check(name, value)


def _fields(body: Any, spec: FieldSpec, where: str = "the request body") -> dict[str, Any]:
    """The checked fields of ``body`` (a JSON object): every one known, every required one there."""
    if not isinstance(body, dict):
        raise _bad(f"{where} must be a JSON object")
    unknown = sorted(set(body) - set(spec))
    if unknown:
        names = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise _bad(f"{where} has unknown field {names}; it takes {', '.join(spec)}")
    checked: dict[str, Any] = {}
    for name, (check, default) in spec.items():
        if name in body:
            checked[name] = check(name, body[name])
        elif default is _REQUIRED:
            raise _bad(f"{where} lacks {name!r}")
        else:
            checked[name] = default
    return checked


def _dead(name: str, value: Any) -> set[tuple[str, float]]:
    if not isinstance(value, list):
        raise _bad(f"{name} must be a list of {{kernel_id, created_at}} objects")
    spec = {"kernel_id": (_kernel_id, _REQUIRED), "created_at": (_created_at, _REQUIRED)}
    items = [_fields(item, spec, where=f"{name}[{number}]") for number, item in enumerate(value)]
    return {(item["kernel_id"], item["created_at"]) for item in items}


ADMIT_FIELDS = {
    "kernel_id": (_kernel_id, _REQUIRED),
    "memory_limit": (_whole, _REQUIRED),
    "sm_share": (_whole, FULL_SHARE),
    "policy": (_text, "hard"),
    "owner": (_text, ""),
    "device": (_optional(_device), None),
    "metadata": (_optional(_metadata), None),
    "holder": (_text, "local"),
}
RESIZE_FIELDS = {
    "memory_limit": (_optional(_whole), None),
    "sm_share": (_optional(_whole), None),
    "policy": (_optional(_text), None),
}
RECONCILE_FIELDS = {"dead": (_dead, _REQUIRED)}
LINE_FIELDS: FieldSpec = {
    "kind": (_text, "start"),
    "memory": (_whole, _REQUIRED),
    "sm_share": (_whole, 0),
    "device": (_optional(_text), None),
    "since": (_created_at, _REQUIRED),
}
SUSPEND_FIELDS = {"host_memory": (_whole, _REQUIRED), "details": (_optional(_metadata), None)}


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _not_a_number(text: str) -> None:
    raise ValueError(f"{text} is not JSON")


# -- who is asking ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Whom a request acts for. ``name`` owns the slices the caller admits (empty: the owner the
    request names); ``admin`` may see and change every slice, others only their own."""

    name: str
    admin: bool = False


class Gate(Protocol):
    """Turns a request's credential into a :class:`Caller` and says what the caller may hold."""

    async def caller(self, request: httputil.HTTPServerRequest, credential: str) -> Caller:
        """The caller presenting ``credential``; raises a 403 :class:`Refusal` for one not accepted."""
        ...

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        """What all of ``caller``'s slices may hold together (None: no limit beyond the devices')."""
        ...


class TokenGate:
    """One shared token, whose holder may do everything: a ledger served to trusted servers."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("the ledger service needs a token: it never serves a ledger without one")
        self._token = token.encode("utf-8")

    async def caller(self, request: httputil.HTTPServerRequest, credential: str) -> Caller:
        if not hmac.compare_digest(credential.encode("utf-8", "replace"), self._token):
            raise Refusal(403, "the ledger service does not accept this token", "Forbidden")
        return Caller("", admin=True)

    async def budget(self, caller: Caller) -> OwnerBudget | None:
        return None


# -- lending a suspended slice's room -----------------------------------------------------------

# The pids of a slice's processes that a device still lists (any device), each with the bytes
# NVML says it holds there (None: NVML does not say). Read afresh at each call.
StillHeld = Callable[[Allocation], Mapping[int, int | None]]


class NotLent(Exception):
    """A suspend whose room is not lent; the slice stays as it was (running)."""


@dataclass(frozen=True)
class RoomBeingMade:
    """Idle kernels asked to suspend so that a slice that did not fit fits on a device."""

    device_index: int
    kernels: int

    def __str__(self) -> str:
        many = self.kernels > 1
        return (
            f"{self.kernels} idle kernel{'s' if many else ''} on GPU {self.device_index} "
            f"{'are' if many else 'is'} being suspended to make room (their owners' servers do it within seconds, "
            "and each resumes when a cell runs in it): try again in a few seconds"
        )


def _requested_at(allocation: Allocation) -> float | None:
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    at = request.get("at") if isinstance(request, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def _room_for(allocation: Allocation) -> str | None:
    """The suspended kernel whose resume the slice's suspend request makes room for (a swap), if any."""
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    kernel = request.get(ROOM_FOR_KEY) if isinstance(request, dict) else None
    return kernel if isinstance(kernel, str) else None


def _idle_since(allocation: Allocation) -> float | None:
    """When the slice's kernel was last active, as its server reported it, where it runs no cell."""
    activity = allocation.metadata.get(ACTIVITY_KEY)
    if not isinstance(activity, dict) or activity.get("busy") is not False:
        return None
    last = activity.get("last_activity")
    return float(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else None


def idle_candidates(allocations: list[Allocation], device_uuid: str, exclude: str, now: float) -> list[Allocation]:
    """The running local slices on a device whose kernels their servers report idle (not running
    a cell): those that hold nothing on the GPU first, then longest idle first; not one asked to
    suspend that did not within the timeout."""
    idle = []
    for allocation in allocations:
        if allocation.suspended or allocation.holder != "local" or allocation.kernel_id == exclude:
            continue
        since, asked = _idle_since(allocation), _requested_at(allocation)
        if allocation.device_uuid != device_uuid or since is None:
            continue
        if asked is not None and now - asked > SUSPEND_REQUEST_TIMEOUT_S:
            continue  # its server did not (cannot) suspend it: others are asked instead
        # Room nobody uses first: a kernel whose processes hold nothing on the GPU is only lent.
        idle.append(((_uses_gpu(allocation), since), allocation))
    return [allocation for _, allocation in sorted(idle, key=lambda pair: pair[0])]


def _uses_gpu(allocation: Allocation) -> bool:
    """Whether the slice's server reports its processes hold GPU memory (True where it does not say)."""
    activity = allocation.metadata.get(ACTIVITY_KEY)
    return not isinstance(activity, dict) or activity.get("uses_gpu") is not False


# -- guarantees and borrowing (a classroom's broker) --------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Room held for a kernel: taken back from borrowers for one within its owner's guarantee, or
    freed by the swap for a resume behind the line (what its paired suspends have freed so far)."""

    device_uuid: str
    memory: int
    sm_share: int
    at: float


@dataclass(frozen=True)
class RoomTakenBack:
    """Borrowing kernels asked to give their room back so that a kernel within its guarantee fits."""

    device_index: int
    kernels: int

    def __str__(self) -> str:
        many = self.kernels > 1
        return (
            f"room borrowed above a guarantee on GPU {self.device_index} is being taken back for it "
            f"({self.kernels} borrowing kernel{'s are' if many else ' is'} being paused; their owners' servers do it "
            "within seconds)"
        )


def guarantees(budget: OwnerBudget | None) -> bool:
    """Whether ``budget`` guarantees less than it allows (a classroom size that may borrow)."""
    return budget is not None and (budget.guaranteed_memory is not None or budget.guaranteed_sm_share is not None)


def is_borrowing(budget: OwnerBudget | None, allocations: list[Allocation], owner: str, limits: SliceLimits) -> bool:
    """Whether a slice of ``limits`` would take ``owner`` past their guarantee, counting what
    their running (not suspended) slices hold on the devices."""
    return past_guarantee(budget, allocations, owner, limits.memory_limit, limits.sm_share)


def past_guarantee(
    budget: OwnerBudget | None, allocations: list[Allocation], owner: str, memory: int, sm_share: int
) -> bool:
    """Whether ``memory`` and ``sm_share`` more (a start's, a resume's, a growth's) would take
    ``owner`` past their guarantee, counting what their running slices hold."""
    if budget is None or not guarantees(budget):
        return False
    running = [item for item in allocations if item.owner == owner and not item.suspended]
    memory += sum(item.memory_limit for item in running)
    share = sum(item.sm_share for item in running) + sm_share
    over_memory = budget.guaranteed_memory is not None and memory > budget.guaranteed_memory
    return over_memory or (budget.guaranteed_sm_share is not None and share > budget.guaranteed_sm_share)


def _taken_back(allocation: Allocation) -> bool:
    request = allocation.metadata.get(SUSPEND_REQUESTED_KEY)
    return isinstance(request, dict) and request.get(TAKE_BACK_KEY) is True


def _borrowed_at(allocation: Allocation) -> float | None:
    mark = allocation.metadata.get(BORROWING_KEY)
    at = mark.get("at") if isinstance(mark, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def take_back_reserve(allocations: list[Allocation], excluding: str = "") -> int:
    """The host memory kept for taking borrowed room back: each running borrowing slice's memory
    limit (the most its suspend can move there, whatever it holds now), but ``excluding``'s."""
    return sum(
        item.memory_limit
        for item in allocations
        if not item.suspended
        and item.holder == "local"
        and item.kernel_id != excluding
        and _borrowed_at(item) is not None
    )


@dataclass
class Lending:
    """What a served ledger checks before it lends a suspended slice's room (the broker's rules).

    ``still_held``: where given, a suspend is refused while NVML lists any process of the slice on
    a device (the user's server checkpoints its kernel's processes; the service does not lend on
    its word). ``host_memory_cap``: where given, the bytes all suspended slices of the ledger may
    hold in host memory together; a suspend past it is refused, but for one the broker asked for to
    make room for a suspended kernel's resume (a swap), which may go past it by that kernel's host
    memory (see :meth:`suspend`). Room is lent only where it can be taken back: under the cap, host
    memory is kept for every borrowing slice's take-back (:func:`take_back_reserve`), so a slice
    borrows only where that room is there, and other suspends leave it free. Without a Lending (the
    one-token service of trusted servers), a suspend is recorded as its client says."""

    still_held: StillHeld | None = None
    host_memory_cap: int | None = None
    # Told of each slice lent (True) and taken back (False), after the ledger's decision (the
    # broker raises its limits page's suspended flag).
    on_change: Callable[[Allocation, bool], None] | None = None
    # Where True (the broker), a start or resume that does not fit asks the servers of idle
    # kernels (any user's) to suspend them (request_room).
    make_room: bool = False
    clock: Callable[[], float] = time.time
    # Told when a borrowing kernel is asked to give its room back (True) and when that request
    # lapses unanswered (False): the broker raises its limits page's suspended flag at once, so
    # that the kernel's CUDA calls wait in libvgpu.so and its GPU work drains before the lock.
    on_take_back: Callable[[Allocation, bool], None] | None = None
    # One check-then-mark at a time, so two suspends cannot both fit under the cap.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Room that borrowed slices give back, held for the kernels within their guarantee it is
    # taken back for (by kernel id), so that no borrower takes it first.
    _claims: dict[str, Claim] = field(default_factory=dict, repr=False)
    # Room that idle kernels' suspends make by the swap alone (suspends the cap allows only as
    # room for a resume) for a resume that waits behind older requests of the node's line, held
    # for it (by kernel id) from everyone else: those requests could not have been given it.
    _swaps: dict[str, Claim] = field(default_factory=dict, repr=False)

    def suspend(self, ledger: Ledger, kernel_id: str, host_memory: int, details: dict[str, Any] | None) -> Allocation:
        """Check, then mark the slice suspended (blocks: NVML and the ledger file)."""
        with self._lock:
            current = ledger.get(kernel_id)
            if current is None:
                raise UnknownSlice(f"no slice is held for kernel {kernel_id!r}; it was released or never admitted")
            if current.suspended:
                return current
            if self.still_held is not None:
                held = self.still_held(current)
                if held:
                    shown = ", ".join(
                        f"pid {pid} ({'an amount NVML does not say' if used is None else format_size(used)})"
                        for pid, used in sorted(held.items())
                    )
                    raise NotLent(
                        f"kernel {kernel_id!r} is not suspended: NVML lists its processes on the GPU still ({shown}); "
                        "the broker lends a slice's memory only once its processes hold none (checkpointed to "
                        "host memory by the user's server), so the slice keeps running"
                    )
            if self.host_memory_cap is not None:
                allocations = ledger.allocations()
                in_host = sum(allocation.host_memory for allocation in allocations)
                swap = self._swap_allowance(ledger, current)
                # A take-back uses the room kept for it; any other suspend leaves that room free.
                reserve = 0 if _taken_back(current) else take_back_reserve(allocations, excluding=kernel_id)
                if in_host + reserve + host_memory > self.host_memory_cap + swap:
                    paired = f" (plus {format_size(swap)} that the resume it makes room for gives back)" if swap else ""
                    kept = (
                        f", {format_size(reserve)} of the rest is kept for taking borrowed room back" if reserve else ""
                    )
                    raise NotLent(
                        f"kernel {kernel_id!r} is not suspended: suspended kernels of this node hold "
                        f"{format_size(in_host)} of host memory and may hold {format_size(self.host_memory_cap)} "
                        f"together (idle.suspend_host_memory){paired}{kept}; its {format_size(host_memory)} would "
                        "not fit, so it keeps running and is stopped when idle longer instead"
                    )
            suspended = ledger.suspend(kernel_id, host_memory=host_memory, details=details)
            resumer = _room_for(current) or ""
            making = self._swaps.get(resumer)
            if making is not None and making.device_uuid == current.device_uuid:  # the room it frees is that resume's
                self._swaps[resumer] = replace(
                    making, memory=making.memory + current.memory_limit, sm_share=making.sm_share + current.sm_share
                )
            if suspended.metadata.get(SUSPEND_REQUESTED_KEY) is not None:
                suspended = ledger.update_metadata(kernel_id, **{SUSPEND_REQUESTED_KEY: None})  # carried out
            if self.on_change is not None:
                self.on_change(suspended, True)
            return suspended

    def _swap_allowance(self, ledger: Ledger, current: Allocation) -> int:
        """The host memory a suspend may take past the cap: where the broker asked for it to make
        room for a suspended kernel's resume (a swap, ROOM_FOR_KEY), that kernel's host memory, which
        its resume gives back, so that once both are done host memory is within the cap. Nothing
        where the request timed out or the resumer is no longer suspended (resumed, or stopped)."""
        resumer_id, asked = _room_for(current), _requested_at(current)
        if resumer_id is None or asked is None or self.clock() - asked > SUSPEND_REQUEST_TIMEOUT_S:
            return 0
        resumer = ledger.get(resumer_id)
        return resumer.host_memory if resumer is not None and resumer.suspended else 0

    def resume(self, ledger: Ledger, kernel_id: str) -> Allocation:
        """Admit a suspended slice again (see Ledger.resume), then tell ``on_change``. Its activity
        report is dropped: it was made before the suspend, and the kernel resumes because it is
        active again (a cell, a CUDA call, its user back), so the stale report would make it the
        longest-idle kernel that :meth:`request_room` asks first, whose server will not suspend it
        (the request lapses only at its server's next report). Its server reports again at its
        next tick."""
        with self._lock:
            was = ledger.get(kernel_id)
            resumed = ledger.resume(kernel_id)
            if was is not None and was.suspended:
                if resumed.metadata.get(ACTIVITY_KEY) is not None:
                    resumed = ledger.update_metadata(kernel_id, **{ACTIVITY_KEY: None})
                if self.on_change is not None:
                    self.on_change(resumed, False)
            return resumed

    def request_room(
        self, ledger: Ledger, limits: SliceLimits, device: int | str | None, exclude: str, *, swap_only: bool = False
    ) -> RoomBeingMade | None:
        """Where suspending idle kernels (any owner's, longest idle first, never one running a cell
        nor one whose server reports no activity) would make room for a slice of ``limits`` on a
        device (``device`` where one is named), ask their servers to: a suspend request on each
        slice, which their servers carry out at their next check. Within the host memory cap,
        counting each kernel at its memory limit (the most it can move there), or at nothing where
        its server reports it holds nothing on the GPU (it is only lent). Where ``exclude`` is a
        suspended slice (a resume), the cap counts with the host memory its resume gives back, and
        each request names it (ROOM_FOR_KEY): the swap :meth:`suspend` allows. ``swap_only``: for
        such a resume that waits behind older requests of the node's line, only kernels whose
        suspend the cap allows for the swap alone (room no request ahead could be given), and that
        room is held for the resume (see :meth:`may_pass_the_line`). What is being made, or None."""
        if not self.make_room:
            return None
        with self._lock:
            now = self.clock()
            named = None if device is None else select_device(ledger.devices, device).uuid
            allocations = ledger.allocations()
            in_host = sum(allocation.host_memory for allocation in allocations) + take_back_reserve(allocations)
            resumer = next((item for item in allocations if item.kernel_id == exclude and item.suspended), None)
            swap = 0 if resumer is None else resumer.host_memory
            if swap_only and (resumer is None or self.host_memory_cap is None):
                return None
            # What a suspend nobody paired may still move to host memory.
            unpaired = math.inf if self.host_memory_cap is None else self.host_memory_cap - in_host
            for usage in ledger.devices_usage():
                if named not in (None, usage.device.uuid):
                    continue
                memory = limits.memory_limit - usage.memory_free
                share = limits.sm_share - usage.share_free(limits.policy)
                chosen = []
                host = math.inf if self.host_memory_cap is None else self.host_memory_cap - in_host + swap
                for candidate in idle_candidates(allocations, usage.device.uuid, exclude, now):
                    if memory <= 0 and share <= 0:
                        break
                    # What its suspend moves to host memory, at most: nothing for one only lent,
                    # and nothing more than is kept for it where it borrows.
                    moved = candidate.memory_limit if _uses_gpu(candidate) else 0
                    if _borrowed_at(candidate) is not None and candidate.holder == "local":
                        moved = 0
                    if moved > host:
                        continue  # its suspend would be refused
                    if swap_only and (moved <= unpaired or _room_for(candidate) not in (None, exclude)):
                        continue  # room a request ahead could be given, or another resume's
                    host -= moved
                    chosen.append(candidate)
                    memory, share = memory - candidate.memory_limit, share - candidate.sm_share
                if not chosen or memory > 0 or share > 0:
                    continue
                for candidate in chosen:
                    asked = candidate.metadata.get(SUSPEND_REQUESTED_KEY)
                    request: dict[str, Any] = dict(asked) if isinstance(asked, dict) else {}
                    if _requested_at(candidate) is None:
                        request = {"at": now}
                    elif resumer is None or _room_for(candidate) is not None:
                        continue  # asked already, for this resume or another's
                    if resumer is not None:
                        request = {**request, ROOM_FOR_KEY: resumer.kernel_id}
                    ledger.update_metadata(candidate.kernel_id, **{SUSPEND_REQUESTED_KEY: request})
                if swap_only:  # nothing is held until its paired suspends free it (see suspend)
                    held = self._swaps.get(exclude)
                    memory, share = (held.memory, held.sm_share) if held is not None else (0, 0)
                    self._swaps[exclude] = Claim(usage.device.uuid, memory, share, now)
                return RoomBeingMade(usage.device.index, len(chosen))
            return None

    def may_pass_the_line(self, kernel_id: str) -> bool:
        """Whether room is held for the resume of ``kernel_id`` (suspends paired with it by
        ``swap_only`` freed some), so that it may be admitted before older requests of the node's
        line, which could not have been given that room."""
        with self._lock:
            self._drop_lapsed_claims(self.clock())
            held = self._swaps.get(kernel_id)
            return held is not None and (held.memory > 0 or held.sm_share > 0)

    def ran_again(self, ledger: Ledger, allocation: Allocation) -> Allocation:
        """Withdraw the suspend request of a slice whose kernel ran (or runs a cell) since it was
        asked, as its server's latest activity report says."""
        with self._lock:
            asked = _requested_at(allocation)
            activity = allocation.metadata.get(ACTIVITY_KEY)
            if asked is None or not isinstance(activity, dict) or _taken_back(allocation):
                return allocation  # borrowed room is taken back whether its kernel runs or not
            since = _idle_since(allocation)
            if since is not None and since <= asked:
                return allocation
            return ledger.update_metadata(allocation.kernel_id, **{SUSPEND_REQUESTED_KEY: None})

    # -- guarantees and borrowing -------------------------------------------------------------

    def admit(self, ledger: Ledger, admission: Admission) -> Allocation:
        """Admit a slice (Ledger.admit); where it takes its owner past their guarantee, only into
        room no kernel within its guarantee is owed (see :meth:`take_back`), marked as borrowing."""
        # Only the service marks a slice as borrowing, whatever a client's metadata says.
        if admission.metadata and BORROWING_KEY in admission.metadata:
            unmarked = {name: value for name, value in admission.metadata.items() if name != BORROWING_KEY}
            admission = replace(admission, metadata=unmarked)
        with self._lock:
            now = self.clock()
            self._drop_lapsed_claims(now)
            limits = admission.limits
            if not is_borrowing(admission.budget, ledger.allocations(), admission.owner, limits):
                device = self._unheld_device(ledger, limits, admission.device, admission.kernel_id, borrowing=False)
                allocation = ledger.decide_admission(replace(admission, device=device))
                self._claims.pop(admission.kernel_id, None)
                return allocation
            if admission.holder == "local":
                self._check_room_to_take_back(ledger, limits.memory_limit)
            device = self._unheld_device(ledger, limits, admission.device, admission.kernel_id, borrowing=True)
            metadata = {**(admission.metadata or {}), BORROWING_KEY: {"at": now}}
            return ledger.decide_admission(replace(admission, device=device, metadata=metadata))

    def resume_within(self, ledger: Ledger, kernel_id: str, budget: OwnerBudget | None) -> Allocation:
        """:meth:`resume`, where a resume past its owner's guarantee is admitted only into room no
        kernel within its guarantee is owed, and marked as borrowing (or no longer)."""
        with self._lock:
            now = self.clock()
            self._drop_lapsed_claims(now)
            current = ledger.get(kernel_id)
            borrowing = False
            if current is not None and current.suspended:
                borrowing = is_borrowing(budget, ledger.allocations(), current.owner, current.limits)
                if borrowing and current.holder == "local":
                    self._check_room_to_take_back(ledger, current.memory_limit, gives_back=current.host_memory)
                self._unheld_device(ledger, current.limits, current.device_uuid, kernel_id, borrowing=borrowing)
        resumed = self.resume(ledger, kernel_id)
        with self._lock:
            self._claims.pop(kernel_id, None)
            self._swaps.pop(kernel_id, None)
            if borrowing or resumed.metadata.get(BORROWING_KEY) is not None:
                resumed = ledger.update_metadata(kernel_id, **{BORROWING_KEY: {"at": now} if borrowing else None})
            return resumed

    def _check_room_to_take_back(self, ledger: Ledger, memory: int, gives_back: int = 0) -> None:
        """Raise CapacityError where the host memory cap has no room to take a borrowing slice of
        ``memory`` back (what suspended slices hold, less ``gives_back``, a resume's own, plus what
        is kept for the borrowing slices' take-backs): it waits, as for room on a GPU, until a
        suspended slice resumes or a borrower gives its room back."""
        if self.host_memory_cap is None:
            return
        allocations = ledger.allocations()
        in_host = sum(item.host_memory for item in allocations) - gives_back
        reserve = take_back_reserve(allocations)
        free = max(0, self.host_memory_cap - in_host - reserve)
        if memory > free:
            raise CapacityError(
                f"the {format_size(memory)} slice is above its owner's guarantee and borrows only room that can be "
                f"taken back without a kill: its suspend would move up to {format_size(memory)} to host memory, "
                f"where suspended kernels hold {format_size(in_host)} and {format_size(reserve)} is kept for the "
                f"borrowers' take-backs, of the {format_size(self.host_memory_cap)} they may hold "
                f"(idle.suspend_host_memory); {format_size(free)} is free",
                resource="memory",
                requested=memory,
                available=free,
            )

    def _unheld_device(
        self, ledger: Ledger, limits: SliceLimits, device: int | str | None, kernel_id: str, *, borrowing: bool
    ) -> Any:
        """The device a slice of ``limits`` may go to: ``device`` (None: where the ledger places
        it) where no room is held for another kernel, else one that has room beside what is held;
        raises CapacityError where none has. Room the swap makes for a resume is held from every
        other slice; room taken back for a kernel within its guarantee, from ``borrowing`` ones."""
        held = [claim for claimant, claim in self._swaps.items() if claimant != kernel_id]
        if borrowing:
            held += [claim for claimant, claim in self._claims.items() if claimant != kernel_id]
        if not held:
            return device
        if borrowing:
            why = (
                f"the {format_size(limits.memory_limit)} slice is above its owner's guarantee and borrows only room "
                "nobody within a guarantee needs"
            )
            whom = "a kernel within its owner's guarantee"
        else:
            why = f"the {format_size(limits.memory_limit)} slice does not fit beside room held for others"
            whom = "a suspended kernel's resume (the swap at the host memory cap)"
        named = None if device is None else select_device(ledger.devices, device).uuid
        fitting = []
        for usage in ledger.devices_usage():
            if named not in (None, usage.device.uuid):
                continue
            memory = sum(claim.memory for claim in held if claim.device_uuid == usage.device.uuid)
            share = sum(claim.sm_share for claim in held if claim.device_uuid == usage.device.uuid)
            if usage.memory_free - memory >= limits.memory_limit and usage.share_free(limits.policy) - share >= (
                limits.sm_share
            ):
                fitting.append(usage)
            elif named is not None or len(ledger.devices) == 1:
                free = max(0, usage.memory_free - memory)
                raise CapacityError(
                    f"{why}: {format_size(memory)} on GPU {usage.device.index} is held for {whom}, "
                    f"{format_size(free)} is free beside it",
                    resource="memory",
                    requested=limits.memory_limit,
                    available=free,
                )
        if not fitting:
            raise CapacityError(
                f"{why}: every GPU's free room is held for others",
                resource="memory",
                requested=limits.memory_limit,
                available=0,
            )
        # The fullest device it fits on, as binpack would; the ledger checks it again.
        return min(fitting, key=lambda usage: (usage.memory_free, usage.device.index)).device.index

    def _drop_lapsed_claims(self, now: float) -> None:
        for held in (self._claims, self._swaps):
            for claimant, claim in list(held.items()):
                if now - claim.at > SUSPEND_REQUEST_TIMEOUT_S:
                    del held[claimant]

    def take_back(
        self, ledger: Ledger, limits: SliceLimits, device: int | str | None, claimant: str
    ) -> RoomTakenBack | None:
        """Where the borrowed room on a device (``device`` where one is named) would make room for
        ``claimant``'s slice of ``limits`` (within its owner's guarantee), ask the servers of the
        borrowing kernels there, most recent borrowing first, to suspend them even while they run
        a cell, and hold the room they give back for ``claimant``; where ``claimant`` is suspended
        (a resume), each request names it (ROOM_FOR_KEY), so that the borrower's suspend may go past
        the host memory cap by what that resume gives back. Room already being made there
        (kernels asked to suspend and not yet suspended) counts. A borrower is asked even where the
        host memory cap would refuse its suspend now: its server tries again at each tick while the
        request lasts, and host memory frees as others resume. Where nothing can be taken back, the room that frees next on the device closest to fitting it is held
        for ``claimant`` all the same: it waits, and no borrower takes that room first. What is
        being taken back, or None."""
        if not self.make_room:
            return None
        with self._lock:
            now = self.clock()
            self._lapse_take_backs(ledger, now)
            named = None if device is None else select_device(ledger.devices, device).uuid
            allocations = ledger.allocations()
            usages = [usage for usage in ledger.devices_usage() if named in (None, usage.device.uuid)]
            for usage in usages:
                uuid = usage.device.uuid
                memory = limits.memory_limit - usage.memory_free
                share = limits.sm_share - usage.share_free(limits.policy)
                here = [item for item in allocations if item.device_uuid == uuid and not item.suspended]
                asked = [item for item in here if _requested_at(item) is not None]
                for item in asked:
                    memory, share = memory - item.memory_limit, share - item.sm_share
                borrowers = sorted(
                    (item for item in here if item.holder == "local" and _borrowed_at(item) is not None),
                    key=lambda item: (-(_borrowed_at(item) or 0.0), -item.created_at),
                )
                chosen = []
                for borrower in borrowers:
                    if memory <= 0 and share <= 0:
                        break
                    if borrower in asked or borrower.kernel_id == claimant:
                        continue
                    chosen.append(borrower)
                    memory, share = memory - borrower.memory_limit, share - borrower.sm_share
                if memory > 0 or share > 0 or not (chosen or any(_taken_back(item) for item in asked)):
                    continue
                resumer = next((item for item in allocations if item.kernel_id == claimant and item.suspended), None)
                for borrower in chosen:
                    request: dict[str, Any] = {"at": now, TAKE_BACK_KEY: True, "device_index": usage.device.index}
                    if resumer is not None:
                        request[ROOM_FOR_KEY] = claimant  # the swap: see suspend
                    asked_now = ledger.update_metadata(borrower.kernel_id, **{SUSPEND_REQUESTED_KEY: request})
                    if self.on_take_back is not None:
                        self.on_take_back(asked_now, True)
                self._claims[claimant] = Claim(uuid, limits.memory_limit, limits.sm_share, now)
                return RoomTakenBack(usage.device.index, len(chosen) or sum(_taken_back(item) for item in asked))
            if usages:
                closest = max(usages, key=lambda usage: (usage.memory_free, -usage.device.index))
                self._claims[claimant] = Claim(closest.device.uuid, limits.memory_limit, limits.sm_share, now)
            return None

    def lapse_take_backs(self, ledger: Ledger) -> list[Allocation]:
        """Withdraw the take-back requests that their servers did not carry out within
        SUSPEND_REQUEST_TIMEOUT_S (their kernels' calls go on); returns the withdrawn."""
        with self._lock:
            return self._lapse_take_backs(ledger, self.clock())

    def _lapse_take_backs(self, ledger: Ledger, now: float) -> list[Allocation]:
        lapsed = []
        for allocation in ledger.allocations():
            asked = _requested_at(allocation)
            if allocation.suspended or not _taken_back(allocation) or asked is None:
                continue
            if now - asked > SUSPEND_REQUEST_TIMEOUT_S:
                withdrawn = ledger.update_metadata(allocation.kernel_id, **{SUSPEND_REQUESTED_KEY: None})
                if self.on_take_back is not None:
                    self.on_take_back(withdrawn, False)
                lapsed.append(withdrawn)
        return lapsed


# -- one line across users' servers (issue 25) -------------------------------------------------

# Seconds a waiting request stays registered without its server renewing it (a server renews its
# requests at every try, a few times a second while they wait): one whose server died or gave up
# then stops holding the line up.
LINE_TTL_S = 30.0
# CapacityError.resource of a request refused because older ones wait ahead of it.
LINE_RESOURCE = "line"


async def _never() -> bool:
    return False


@dataclass
class _Waiting:
    owner: str
    request: Request
    renewed: float
    # Past its owner's guarantee when it registered: a request within its guarantee is not held
    # back by it (a borrower takes only room nobody within a guarantee is owed).
    borrowing: bool = False

    def record(self) -> dict[str, Any]:
        request = self.request
        return {
            "kernel_id": request.kernel_id,
            "owner": self.owner,
            "kind": request.kind,
            "memory": request.memory,
            "sm_share": request.sm_share,
            "device": request.device_uuid,
            "since": request.since,
            # When its server last renewed it (tried it): a registration not renewed for the
            # line's ttl expires.
            "renewed": self.renewed,
            "borrowing": self.borrowing,
        }


class BrokerLine:
    """The requests users' servers have waiting for room on the node's devices, in the order they
    first asked: the order line.py keeps in one server, kept across servers.

    A registration is a :class:`~jupyter_vgpu.line.Request` (its memory and SM share: what a
    resize grows by); :meth:`ahead` applies line.py's rule to it (:func:`may_go_before`). Kept in
    ``path`` (JSON, beside the ledger file), so a broker restart keeps the order; a registration
    its server does not renew for ``ttl`` seconds is dropped (a restarted broker gives each one
    ``ttl`` seconds from its start)."""

    def __init__(self, path: Path | None = None, *, ttl: float = LINE_TTL_S, clock: Callable[[], float] = time.time):
        self.path, self.ttl, self.clock = path, ttl, clock
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}
        if path is not None and path.is_file():
            now = clock()
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                for item in json.loads(path.read_text()):
                    request = Request(
                        item["kernel_id"],
                        item["kind"],
                        int(item["memory"]),
                        int(item["sm_share"]),
                        item["device"],
                        _never,
                        since=float(item["since"]),
                    )
                    borrowing = item.get("borrowing") is True
                    self._waiting[request.kernel_id] = _Waiting(str(item["owner"]), request, now, borrowing)

    def waiting(self) -> list[dict[str, Any]]:
        """Every registration, oldest first."""
        with self._lock:
            self._expire()
            return [entry.record() for entry in self._ordered()]

    def register(
        self,
        owner: str,
        kernel_id: str,
        kind: str,
        memory: int,
        sm_share: int,
        device: str | None,
        since: float,
        borrowing: bool = False,
    ) -> dict[str, Any]:
        """Register a waiting request, or renew it: its place is the earliest time it was said to
        have first asked (never later than now); ``borrowing`` where it would take its owner past
        their guarantee. Raises PermissionError for another owner's."""
        with self._lock:
            now = self.clock()
            entry = self._waiting.get(kernel_id)
            if entry is not None and entry.owner != owner:
                raise PermissionError(f"kernel {kernel_id!r} waits in line for another user")
            since = min(since, now if entry is None else entry.request.since)
            request = Request(kernel_id, kind, memory, sm_share, device, _never, since=since)
            waiting = _Waiting(owner, request, now, borrowing)
            changed = entry is None or entry.record() | {"renewed": now} != waiting.record()
            self._waiting[kernel_id] = waiting
            if changed:
                self._save()
            return self._waiting[kernel_id].record()

    def leave(self, kernel_id: str, owner: str | None = None) -> bool:
        """Take a request out of the line (``owner``'s only, where given); whether it was there."""
        with self._lock:
            entry = self._waiting.get(kernel_id)
            if entry is None or (owner is not None and entry.owner != owner):
                return False
            del self._waiting[kernel_id]
            self._save()
            return True

    def ahead(
        self, kernel_id: str, memory: int, sm_share: int, device: str | None, borrowing: bool = False
    ) -> list[Request]:
        """The older requests that a request of this size on ``device`` (None: any) would delay
        (empty where it may go: none is there, or it is smaller than each, line.py's backfill).
        Its own registration, if any, gives its place; else it is a newcomer, behind everyone. A
        request within its owner's guarantee (not ``borrowing``) waits behind none that borrows."""
        with self._lock:
            self._expire()
            own = self._waiting.get(kernel_id)
            since = own.request.since if own is not None else math.inf
            request = Request(kernel_id, "start", memory, sm_share, device, _never, since=since)
            ahead = [
                entry.request
                for entry in self._ordered()
                if entry.request.kernel_id != kernel_id
                and entry.request.since < since
                and (borrowing or not entry.borrowing)
                and entry.request.covers(request)
            ]
            return [] if may_go_before(request, ahead) else ahead

    def _ordered(self) -> list[_Waiting]:
        return sorted(self._waiting.values(), key=lambda entry: entry.request.since)

    def _expire(self) -> None:
        now = self.clock()
        stale = [kernel_id for kernel_id, entry in self._waiting.items() if now - entry.renewed > self.ttl]
        for kernel_id in stale:
            del self._waiting[kernel_id]
        if stale:
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(json.dumps([entry.record() for entry in self._ordered()]))
        os.replace(temporary, self.path)


# -- handlers ----------------------------------------------------------------------------------


class LedgerHandler(web.RequestHandler):
    """What every route shares: token authentication, JSON bodies and replies, refusals as JSON,
    and ledger calls off the event loop."""

    def initialize(
        self, ledger: Ledger, gate: Gate, lending: Lending | None = None, *, line: BrokerLine | None = None
    ) -> None:
        self.ledger = ledger
        self.gate = gate
        self.lending = lending or Lending()
        self.line = line

    def set_default_headers(self) -> None:
        # Decisions and usage change from one moment to the next; nothing on the way may keep them.
        self.set_header("Cache-Control", "no-store")

    def check_xsrf_cookie(self) -> None:
        # The credential is a header a browser never adds by itself, not a cookie, so a
        # cross-site form cannot make a request in a user's name; an application that mounts
        # these handlers with xsrf_cookies on must not refuse their clients for lack of one.
        return None

    async def prepare(self) -> None:
        """Refuse a request without a token (401) or with one the gate does not accept (403)."""
        scheme, _, credential = self.request.headers.get("Authorization", "").strip().partition(" ")
        credential = credential.strip()
        if scheme.lower() not in ("token", "bearer") or not credential:
            raise Refusal(401, "the ledger service needs a token: send 'Authorization: token <token>'", "Unauthorized")
        self.caller = await self.gate.caller(self.request, credential)

    def sees(self, allocation: Allocation) -> bool:
        return self.caller.admin or allocation.owner == self.caller.name

    async def owned(self, kernel_id: str) -> Allocation:
        """The caller's allocation for ``kernel_id``: 404 where there is none, 403 where it is another's."""
        allocation = await self.decide(self.ledger.get, kernel_id)
        if allocation is None:
            raise Refusal(404, f"no slice is held for kernel {kernel_id!r}", "UnknownSlice")
        if not self.sees(allocation):
            raise Refusal(
                403,
                f"the slice of kernel {kernel_id!r} is not yours ({self.caller.name!r}); only its owner or a "
                "vGPU admin may see or change it",
                # Not "Forbidden" (a token refused): the request's fault, which a user's server
                # passes on as 403 rather than as the broker failing (RemoteLedger: SliceForbidden).
                "NotYourSlice",
            )
        return allocation

    async def own_budget(self, allocation: Allocation | None = None) -> OwnerBudget | None:
        """The budget a decision is checked against: the caller's, for its own slices (an admin
        changing another's slice is held to the devices' capacity only)."""
        if allocation is not None and allocation.owner != self.caller.name:
            return None
        return await self.gate.budget(self.caller)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(error, Refusal):
            body = error.body
        elif isinstance(error, web.HTTPError):
            # Raised by tornado itself: a method this route does not have, a path that is not UTF-8.
            detail = error.log_message % error.args if error.log_message and error.args else error.log_message
            body = {"message": f"{self._reason}: {detail}" if detail else self._reason, "error": "HTTPError"}
        else:
            body = {"message": "the ledger service failed on this request; its log says why", "error": "InternalError"}
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="jupyter-vgpu ledger"')
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.finish(json.dumps(body))

    def reply(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.finish(json.dumps(value))

    def body(self, spec: FieldSpec | None) -> dict[str, Any]:
        """The request's JSON object, checked against ``spec`` (None: any object of fields)."""
        if len(self.request.body) > MAX_BODY_BYTES:
            raise _bad(f"the request body must be at most {MAX_BODY_BYTES} bytes, not {len(self.request.body)}")
        try:
            value = json.loads(self.request.body, parse_float=_finite, parse_constant=_not_a_number)
        except (ValueError, RecursionError) as error:  # RecursionError: [[[[...]]]] past the parser's depth
            raise _bad(f"the request body is not JSON ({str(error)[:80]})") from None
        if spec is None:
            return _metadata("the request body", value)
        return _fields(value, spec)

    async def decide(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one ledger call in a worker thread and turn its refusals into answers.

        Off the event loop because a decision may wait for the ledger file's lock (another
        process holds it); meanwhile every other request of the service is still served.
        """
        try:
            return await IOLoop.current().run_in_executor(None, functools.partial(call, *args, **kwargs))
        except CapacityError as error:
            raise Refusal(
                409,
                str(error),
                "CapacityError",
                resource=error.resource,
                requested=error.requested,
                available=error.available,
            ) from None
        except SliceExists as error:
            raise Refusal(409, str(error), "SliceExists") from None
        except NotLent as error:
            raise Refusal(409, str(error), "NotLent") from None
        except UnknownSlice as error:
            raise Refusal(404, str(error), "UnknownSlice") from None
        except SliceValueError as error:
            raise Refusal(400, str(error), "SliceValueError") from None
        except LedgerError as error:
            raise Refusal(503, str(error), "LedgerError") from None

    async def making_room(
        self,
        refusal: Refusal,
        limits: SliceLimits,
        device: int | str | None,
        exclude: str = "",
        *,
        claimant: str = "",
        owner: str = "",
        budget: OwnerBudget | None = None,
        swap_only: bool = False,
    ) -> Refusal:
        """A refusal for lack of room on a device, telling where idle kernels are being asked to
        suspend to make it (see Lending.request_room), or, for ``claimant`` (a slice of ``owner``
        within their guarantee, ``budget``), where borrowed room is being taken back (see
        Lending.take_back); others as they are. A slice past its owner's guarantee makes no room:
        it borrows only what nobody needs. ``swap_only``: a resume behind older requests of the
        line (refused for its turn), whose room only the swap may make."""
        resources = (LINE_RESOURCE,) if swap_only else ("memory", "sm_share")
        if refusal.body.get("error") != "CapacityError" or refusal.body.get("resource") not in resources:
            return refusal
        if guarantees(budget):
            allocations = await self.decide(self.ledger.allocations)
            if is_borrowing(budget, [item for item in allocations if item.kernel_id != exclude], owner, limits):
                return refusal
        room: RoomBeingMade | RoomTakenBack | None
        room = await self.decide(self.lending.request_room, self.ledger, limits, device, exclude, swap_only=swap_only)
        if room is None and guarantees(budget) and not swap_only:
            room = await self.decide(self.lending.take_back, self.ledger, limits, device, claimant or exclude)
        if room is not None:
            refusal.body = {**refusal.body, "message": f"{refusal.body['message']}; {room}", "making_room": str(room)}
        return refusal

    def kernel_id(self, segment: str) -> str:
        # tornado has already decoded the path segment (and refused one that is not UTF-8).
        return _kernel_id("the kernel id", segment)

    async def in_turn(
        self, kernel_id: str, memory: int, sm_share: int, device: int | str | None, budget: OwnerBudget | None
    ) -> int | str | None:
        """Refuse (409, resource ``line``) a start, resume or growth that older requests of the
        node's line wait ahead of (none that borrows, for one within its owner's ``budget``'s
        guarantee); returns the device it may take (``device``, or for a start on any GPU that
        older requests wait ahead of only on some GPUs, one of the others)."""
        if self.line is None:
            return device
        borrowing = await self.borrowing(memory, sm_share, budget)
        chosen = None
        if device is not None:
            with contextlib.suppress(ValueError):  # a device that is not there: the ledger says so
                chosen = select_device(await self.decide(lambda: self.ledger.devices), device)
        uuid = None if chosen is None else chosen.uuid
        ahead = await self.decide(self.line.ahead, kernel_id, memory, sm_share, uuid, borrowing)
        if not ahead:
            return device
        if chosen is None:
            # Requests tied to one GPU (a resume, a growth) hold up a start on any GPU only there.
            usages = await self.decide(self.ledger.devices_usage)
            open_devices = [
                usage
                for usage in usages
                if not await self.decide(self.line.ahead, kernel_id, memory, sm_share, usage.device.uuid, borrowing)
            ]
            if open_devices:
                # The fullest it fits on (binpack); else the one closest to fitting, to make room on.
                fitting = [usage for usage in open_devices if usage.memory_free >= memory]
                best = (
                    min(fitting, key=lambda usage: (usage.memory_free, usage.device.index))
                    if fitting
                    else max(open_devices, key=lambda usage: (usage.memory_free, -usage.device.index))
                )
                return best.device.index
        where = "any GPU" if chosen is None else f"GPU {chosen.index}"
        many = len(ahead) > 1
        raise Refusal(
            409,
            f"its turn: {len(ahead)} request{'s' if many else ''} of the node's users asked earlier for room on "
            f"{where} and {'wait' if many else 'waits'} ahead of it",
            "CapacityError",
            resource=LINE_RESOURCE,
            requested=memory,
            available=0,
        )

    async def borrowing(self, memory: int, sm_share: int, budget: OwnerBudget | None) -> bool:
        """Whether ``memory`` and ``sm_share`` more would take the caller past ``budget``'s guarantee."""
        if not guarantees(budget):
            return False
        allocations = await self.decide(self.ledger.allocations)
        return past_guarantee(budget, allocations, self.caller.name, memory, sm_share)

    def served(self, kernel_id: str) -> None:
        """The kernel's request was granted: it no longer waits."""
        if self.line is not None:
            self.line.leave(kernel_id)


class DevicesHandler(LedgerHandler):
    async def get(self) -> None:
        devices = await self.decide(lambda: self.ledger.devices)
        self.reply({"devices": [asdict(device) for device in devices]})


class UsageHandler(LedgerHandler):
    async def get(self) -> None:
        usage = await self.decide(self.ledger.devices_usage)
        self.reply({"usage": [asdict(device_usage) for device_usage in usage]})


class AllocationsHandler(LedgerHandler):
    async def get(self) -> None:
        allocations = await self.decide(self.ledger.allocations)
        self.reply({"allocations": [asdict(allocation) for allocation in allocations if self.sees(allocation)]})

    async def post(self) -> None:
        body = self.body(ADMIT_FIELDS)
        try:
            limits = SliceLimits(body["memory_limit"], body["sm_share"], body["policy"])
        except SliceValueError as error:
            raise Refusal(400, str(error), "SliceValueError") from None
        owner = self.caller.name or body["owner"]
        budget = await self.own_budget()
        device = await self.in_turn(body["kernel_id"], limits.memory_limit, limits.sm_share, body["device"], budget)
        admission = Admission(body["kernel_id"], limits, owner, device, body["metadata"], body["holder"], budget)
        try:
            allocation = await self.decide(self.lending.admit, self.ledger, admission)
        except Refusal as refusal:
            raise await self.making_room(
                refusal, limits, body["device"], claimant=body["kernel_id"], owner=owner, budget=budget
            ) from None
        self.served(allocation.kernel_id)
        self.reply(asdict(allocation), status=201)


class SliceHandler(LedgerHandler):
    async def get(self, kernel_id: str) -> None:
        self.reply(asdict(await self.owned(self.kernel_id(kernel_id))))

    async def patch(self, kernel_id: str) -> None:
        kernel_id = self.kernel_id(kernel_id)
        body = self.body(RESIZE_FIELDS)
        current = await self.owned(kernel_id)
        grows = (
            max(0, (body["memory_limit"] or current.memory_limit) - current.memory_limit),
            max(0, (body["sm_share"] or current.sm_share) - current.sm_share),
        )
        budget = await self.own_budget(current)
        if any(grows) and not current.suspended:
            await self.in_turn(kernel_id, *grows, current.device_uuid, budget)
        resized = await self.decide(self.ledger.resize, kernel_id, **body, budget=budget)
        self.served(kernel_id)
        self.reply(asdict(resized))

    async def delete(self, kernel_id: str) -> None:
        kernel_id = self.kernel_id(kernel_id)
        await self.owned(kernel_id)
        allocation = await self.decide(self.ledger.release, kernel_id)
        if allocation is None:
            raise Refusal(404, f"no slice is held for kernel {kernel_id!r}", "UnknownSlice")
        self.reply(asdict(allocation))


class MetadataHandler(LedgerHandler):
    async def patch(self, kernel_id: str) -> None:
        kernel_id = self.kernel_id(kernel_id)
        fields = self.body(None)
        reserved = [name for name in RESERVED_METADATA if name in fields]
        if reserved:
            raise _bad(f"metadata fields may not be named {' or '.join(map(repr, reserved))}")
        if SUSPENDED_KEY in fields:
            # Lending a slice's room is a decision, checked against the device: never a claim.
            raise _bad(
                f"the metadata field {SUSPENDED_KEY!r} is set by POST .../suspend (after the service checks that "
                "the slice's processes hold no device memory) and cleared by POST .../resume, not by a metadata update"
            )
        if BORROWING_KEY in fields:
            # Whose room is taken back first is the service's decision, not its owner's word.
            raise _bad(
                f"the metadata field {BORROWING_KEY!r} is set by the service when a start or resume takes its owner "
                "past their guarantee, not by a metadata update"
            )
        if SUSPEND_REQUESTED_KEY in fields:
            # Whose kernel makes room is the service's decision: nobody asks another's, nor declines.
            raise _bad(
                f"the metadata field {SUSPEND_REQUESTED_KEY!r} is set by the service when a start or resume does not "
                f"fit (on idle kernels, from their {ACTIVITY_KEY!r} reports) and cleared when the kernel is suspended "
                "or runs again, not by a metadata update"
            )
        await self.owned(kernel_id)
        updated = await self.decide(self.ledger.update_metadata, kernel_id, **fields)
        if ACTIVITY_KEY in fields:
            updated = await self.decide(self.lending.ran_again, self.ledger, updated)
        self.reply(asdict(updated))


class SuspendHandler(LedgerHandler):
    async def post(self, kernel_id: str) -> None:
        kernel_id = self.kernel_id(kernel_id)
        body = self.body(SUSPEND_FIELDS)
        if body["host_memory"] < 0:
            raise _bad(f"host_memory must be zero or more bytes, not {body['host_memory']}")
        await self.owned(kernel_id)
        suspended = await self.decide(
            self.lending.suspend, self.ledger, kernel_id, body["host_memory"], body["details"]
        )
        self.reply(asdict(suspended))


class ResumeHandler(LedgerHandler):
    async def post(self, kernel_id: str) -> None:
        kernel_id = self.kernel_id(kernel_id)
        allocation = await self.owned(kernel_id)
        budget = await self.own_budget(allocation)
        limits = SliceLimits(allocation.memory_limit, allocation.sm_share, allocation.policy)
        behind: Refusal | None = None
        if allocation.suspended:
            try:
                await self.in_turn(kernel_id, limits.memory_limit, limits.sm_share, allocation.device_uuid, budget)
            except Refusal as refusal:
                # Behind older requests, it may still have the room the swap makes, which none of
                # them could be given (the host memory cap stops their room-making).
                if not await self.decide(self.lending.may_pass_the_line, kernel_id):
                    raise await self.making_room(
                        refusal,
                        limits,
                        allocation.device_uuid,
                        kernel_id,
                        owner=allocation.owner,
                        budget=budget,
                        swap_only=True,
                    ) from None
                behind = refusal
        try:
            resumed = await self.decide(self.lending.resume_within, self.ledger, kernel_id, budget)
        except Refusal as refusal:
            raise await self.making_room(
                behind or refusal,
                limits,
                allocation.device_uuid,
                kernel_id,
                owner=allocation.owner,
                budget=budget,
                swap_only=behind is not None,
            ) from None
        self.served(kernel_id)
        self.reply(asdict(resumed))


class ReconcileHandler(LedgerHandler):
    async def post(self) -> None:
        dead = self.body(RECONCILE_FIELDS)["dead"]
        # The ledger releases what it is told is not alive only while it is still the allocation
        # the client judged (same kernel id, same creation time), and only where it is the caller's.
        released = await self.decide(
            self.ledger.reconcile,
            lambda allocation: not self.sees(allocation) or (allocation.kernel_id, allocation.created_at) not in dead,
        )
        self.reply({"released": [asdict(allocation) for allocation in released]})


class LineHandler(LedgerHandler):
    """The node's line (a :class:`BrokerLine`): a caller sees, registers and takes out its own
    requests only (an admin, every one)."""

    def prepare_line(self) -> BrokerLine:
        if self.line is None:
            raise Refusal(404, "this ledger service keeps no line: nothing waits here", "NotFound")
        return self.line

    async def get(self) -> None:
        waiting = self.prepare_line().waiting()
        self.reply({"line": [item for item in waiting if self.caller.admin or item["owner"] == self.caller.name]})


class LineEntryHandler(LineHandler):
    async def put(self, kernel_id: str) -> None:
        line = self.prepare_line()
        kernel_id = self.kernel_id(kernel_id)
        body = self.body(LINE_FIELDS)
        if body["kind"] not in KINDS:
            raise _bad(f"kind must be one of {', '.join(KINDS)}, not {body['kind'][:40]!r}")
        for name in ("memory", "sm_share"):
            if body[name] < 0:
                raise _bad(f"{name} must be zero or more, not {body[name]}")
        borrowing = await self.borrowing(body["memory"], body["sm_share"], await self.own_budget())
        try:
            record = line.register(
                self.caller.name,
                kernel_id,
                body["kind"],
                body["memory"],
                body["sm_share"],
                body["device"],
                body["since"],
                borrowing,
            )
        except PermissionError as error:
            raise Refusal(403, str(error), "NotYourSlice") from None
        self.reply(record)

    async def delete(self, kernel_id: str) -> None:
        line = self.prepare_line()
        kernel_id = self.kernel_id(kernel_id)
        self.reply({"left": line.leave(kernel_id, None if self.caller.admin else self.caller.name)})


class NotFoundHandler(LedgerHandler):
    """Any other path under the prefix: a JSON 404 (after authentication, so that it tells a
    stranger nothing), which a client can tell apart from a wrong address."""

    def _not_found(self, *args: Any) -> None:
        raise Refusal(404, f"the ledger service has no route {self.request.path[:200]!r}", "NotFound")

    get = post = put = patch = delete = head = options = _not_found


def ledger_handlers(
    prefix: str, ledger: Ledger, access: str | Gate, *, lending: Lending | None = None, line: BrokerLine | None = None
) -> list[tuple[str, type[web.RequestHandler], dict[str, Any]]]:
    """The routes that serve ``ledger`` under ``prefix`` (``/services/vgpu/ledger``), for a tornado
    ``Application`` (or ``add_handlers``), to clients that present ``access`` (one token whose
    holder may do everything) or that ``access`` (a :class:`Gate`) accepts; a suspend is checked
    as ``lending`` says (none: recorded as asked); with a ``line``, starts, resumes and growths
    go in the order of the node's line."""
    gate = TokenGate(access) if isinstance(access, str) else access
    if prefix and not prefix.startswith("/"):
        raise ValueError(f"the ledger service's prefix must start with '/', not {prefix!r}")
    base = re.escape(prefix.rstrip("/"))
    options = {"ledger": ledger, "gate": gate, "lending": lending or Lending(), "line": line}
    segment = "([^/]+)"
    return [
        (rf"{base}/devices", DevicesHandler, options),
        (rf"{base}/usage", UsageHandler, options),
        (rf"{base}/allocations", AllocationsHandler, options),
        (rf"{base}/allocations/{segment}", SliceHandler, options),
        (rf"{base}/allocations/{segment}/metadata", MetadataHandler, options),
        (rf"{base}/allocations/{segment}/suspend", SuspendHandler, options),
        (rf"{base}/allocations/{segment}/resume", ResumeHandler, options),
        (rf"{base}/reconcile", ReconcileHandler, options),
        (rf"{base}/line", LineHandler, options),
        (rf"{base}/line/{segment}", LineEntryHandler, options),
        (rf"{base}/.*", NotFoundHandler, options),
    ]
