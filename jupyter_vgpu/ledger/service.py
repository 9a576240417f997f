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
all the host memory they may), 503 the ledger itself failed (its file). Bodies are checked at the
edge (ledger/edge.py: types, sizes, unknown fields), so nothing a client sends reaches the ledger
in a shape it does not take or becomes a 500.

The rooms: this module (HTTP: routes, authentication, refusals), ledger/edge.py (body checks,
callers and gates), ledger/lending.py (the broker's decisions beyond the ledger's own: lending,
making room, taking borrowed room back), ledger/broker_line.py (the node's line), and
ledger/policy.py (the pool's rules, which a server's own room-making follows too).

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
import json
import re
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from tornado import web
from tornado.ioloop import IOLoop

from jupyter_vgpu.ledger.base import (
    ACTIVITY_KEY,
    BORROWING_KEY,
    SUSPEND_REQUESTED_KEY,
    SUSPENDED_KEY,
    Admission,
    Allocation,
    CapacityError,
    Ledger,
    LedgerError,
    OwnerBudget,
    SliceExists,
    UnknownSlice,
)
from jupyter_vgpu.ledger.broker_line import LINE_RESOURCE, BrokerLine
from jupyter_vgpu.ledger.edge import (
    ADMIT_FIELDS,
    LINE_FIELDS,
    RECONCILE_FIELDS,
    RESERVED_METADATA,
    RESIZE_FIELDS,
    SUSPEND_FIELDS,
    FieldSpec,
    Gate,
    Refusal,
    TokenGate,
    bad_request,
    check_kernel_id,
    parse_body,
)
from jupyter_vgpu.ledger.lending import Lending, NotLent
from jupyter_vgpu.ledger.policy import RoomBeingMade, guarantees, is_borrowing, past_guarantee
from jupyter_vgpu.line import KINDS
from jupyter_vgpu.model import SliceLimits, SliceValueError, select_device

T = TypeVar("T")


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
        return parse_body(self.request.body, spec)

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
        room: RoomBeingMade | None
        room = await self.decide(self.lending.request_room, self.ledger, limits, device, exclude, swap_only=swap_only)
        if room is None and guarantees(budget) and not swap_only:
            room = await self.decide(self.lending.take_back, self.ledger, limits, device, claimant or exclude)
        if room is not None:
            refusal.body = {**refusal.body, "message": f"{refusal.body['message']}; {room}", "making_room": str(room)}
        return refusal

    def kernel_id(self, segment: str) -> str:
        # tornado has already decoded the path segment (and refused one that is not UTF-8).
        return check_kernel_id("the kernel id", segment)

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
        # A growth takes no room held for others (the swap's, a claimant's): the pool's rule, as for a start.
        resized = await self.decide(self.lending.resize_within, self.ledger, kernel_id, budget, **body)
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
            raise bad_request(f"metadata fields may not be named {' or '.join(map(repr, reserved))}")
        if SUSPENDED_KEY in fields:
            # Lending a slice's room is a decision, checked against the device: never a claim.
            raise bad_request(
                f"the metadata field {SUSPENDED_KEY!r} is set by POST .../suspend (after the service checks that "
                "the slice's processes hold no device memory) and cleared by POST .../resume, not by a metadata update"
            )
        if BORROWING_KEY in fields:
            # Whose room is taken back first is the service's decision, not its owner's word.
            raise bad_request(
                f"the metadata field {BORROWING_KEY!r} is set by the service when a start or resume takes its owner "
                "past their guarantee, not by a metadata update"
            )
        if SUSPEND_REQUESTED_KEY in fields:
            # Whose kernel makes room is the service's decision: nobody asks another's, nor declines.
            raise bad_request(
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
            raise bad_request(f"host_memory must be zero or more bytes, not {body['host_memory']}")
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
            raise bad_request(f"kind must be one of {', '.join(KINDS)}, not {body['kind'][:40]!r}")
        for name in ("memory", "sm_share"):
            if body[name] < 0:
                raise bad_request(f"{name} must be zero or more, not {body[name]}")
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
