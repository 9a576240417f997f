"""A client of a ledger served over HTTP (:mod:`jupyter_vgpu.ledger.service`): the same protocol
as :class:`~jupyter_vgpu.ledger.embedded.EmbeddedLedger`, so the slice manager does not know
which of the two it holds.

Standard library only (``http.client`` and ``json``): a single-user server that talks to its
node's broker needs no HTTP stack of its own, and the ledger package stays free of tornado
outside the service.

Refusals come back as the exceptions the embedded ledger raises, with the same messages
(:class:`CapacityError` with its ``resource``, ``requested`` and ``available``,
:class:`UnknownSlice`, :class:`SliceExists`, :class:`SliceValueError`). Everything else (a
service that cannot be reached, refuses the token, times out or answers something that is not
the ledger API) is a :class:`LedgerError` that names the service's address and what went wrong.
"""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlsplit

from jupyter_vgpu._version import __version__
from jupyter_vgpu.ledger.base import (
    Admission,
    Allocation,
    CapacityError,
    DeviceUsage,
    Ledger,
    LedgerError,
    NotSupported,
    OwnerBudget,
    Resizing,
    SliceExists,
    UnknownSlice,
)
from jupyter_vgpu.model import Device, SliceValueError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from typing_extensions import Self

# Longer than the embedded ledger waits for a busy file (30 s), so that a decision the service is
# still waiting to make is answered rather than abandoned half-way by the client.
DEFAULT_TIMEOUT_S = 60.0

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")


class SliceForbidden(PermissionError):
    """Another user's slice, which the broker refused to show or change (403): the request's
    fault, not the broker failing (a token it does not accept is a LedgerError)."""


class _Unreadable(ValueError):
    """A reply that is not what the ledger API answers; turned into a LedgerError with context."""


def _checked(value: Any, expected: type | tuple[type, ...], what: str) -> Any:
    # bool is an int to Python but never a count of bytes or an index in a reply.
    if isinstance(value, bool) or not isinstance(value, expected):
        raise _Unreadable(f"{what} is {type(value).__name__} {str(value)[:60]!r}")
    return value


def _record(cls: type[D], value: Any, types: Mapping[str, type | tuple[type, ...]]) -> D:
    """A dataclass from a JSON object, every field checked; fields a newer service adds are
    ignored, so an older client keeps working against it, and fields with defaults that an older
    service lacks take their defaults."""
    name = cls.__name__
    _checked(value, dict, name)
    required = [field.name for field in fields(cls) if field.default is MISSING and field.default_factory is MISSING]
    missing = [key for key in required if key not in value]
    if missing:
        raise _Unreadable(f"{name} lacks {', '.join(missing)}")
    return cls(**{key: _checked(value[key], kind, f"{name}.{key}") for key, kind in types.items() if key in value})


def _device(value: Any) -> Device:
    return _record(
        Device,
        value,
        {"uuid": str, "index": int, "name": str, "memory_total": int, "sm_count": int, "memory_used": int},
    )


_USAGE_NUMBERS = (
    "memory_capacity",
    "memory_allocated",
    "memory_free",
    "hard_share",
    "total_share",
    "share_capacity",
    "slices",
    "memory_outside",
    "memory_over_cap",
)


def _usage(value: Any) -> DeviceUsage:
    _checked(value, dict, "DeviceUsage")
    types = {"device": Device, **dict.fromkeys(_USAGE_NUMBERS, int)}
    return _record(DeviceUsage, {**value, "device": _device(value.get("device"))}, types)


def _allocation(value: Any) -> Allocation:
    allocation = _record(
        Allocation,
        value,
        {
            "kernel_id": str,
            "device_uuid": str,
            "device_index": int,
            "memory_limit": int,
            "sm_share": int,
            "policy": str,
            "owner": str,
            "created_at": (float, int),
            "metadata": dict,
            "holder": str,
            "node": str,
        },
    )
    # A float, as the service holds it: reconcile sends it back to name this very allocation.
    return replace(allocation, created_at=float(allocation.created_at))


def _listed(reply: Any, key: str, read: Callable[[Any], T]) -> list[T]:
    _checked(reply, dict, "the reply")
    return [read(item) for item in _checked(reply.get(key), list, f"the reply's {key!r}")]


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether the service closed a kept-alive connection while it sat idle.

    An idle connection has nothing to read; if its socket is readable, the peer closed it (or
    sent something unasked). Checking before reuse, rather than retrying after a failure, means
    a request is never sent twice, so a decision is never made twice.
    """
    if connection.sock is None:
        return True
    # poll, not select: a server with many kernels may well have file descriptors past 1024.
    poller = select.poll()
    try:
        poller.register(connection.sock, select.POLLIN)
    except (OSError, ValueError):  # a socket closed under us has no file descriptor
        return True
    return bool(poller.poll(0))


class RemoteLedger(Ledger):
    """The :class:`~jupyter_vgpu.ledger.base.Ledger` protocol over HTTP.

    ``url`` is where the service mounts the ledger (``http://127.0.0.1:8081/services/vgpu/ledger``),
    ``token`` the credential it accepts (sent as ``Authorization: token ...``). Methods may be
    called from any thread: each request takes a kept-alive connection of its own from a pool.
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "the ledger service",
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the ledger service URL must be http:// or https:// with a host, not {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"the ledger service URL {url!r} must not have a query or fragment")
        if not token:
            raise ValueError("the ledger service needs a token; the service refuses requests without one")
        if timeout <= 0:
            raise ValueError(f"timeout must be more than zero seconds, not {timeout!r}")
        self.url = url.rstrip("/")
        self.name = name  # how messages call the service ("the node's GPU broker")
        self.timeout = timeout
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._base_path = parts.path.rstrip("/")
        self._ssl_context = ssl_context
        self._headers = {
            "Authorization": f"token {token}",
            "Accept": "application/json",
            "User-Agent": f"jupyter-vgpu/{__version__}",
        }
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False

    def close(self) -> None:
        """Close the pooled connections; a connection in use is closed when its request ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteLedger({self.url!r})"

    # -- reading ---------------------------------------------------------------------------

    @property
    def devices(self) -> list[Device]:
        return self._call("GET", "/devices", read=lambda reply: _listed(reply, "devices", _device))

    def devices_usage(self) -> list[DeviceUsage]:
        return self._call("GET", "/usage", read=lambda reply: _listed(reply, "usage", _usage))

    def get(self, kernel_id: str) -> Allocation | None:
        try:
            return self._call("GET", _slice_path(kernel_id), read=_allocation)
        except UnknownSlice:
            return None

    def allocations(self) -> list[Allocation]:
        """Every allocation, oldest first."""
        return self._call("GET", "/allocations", read=lambda reply: _listed(reply, "allocations", _allocation))

    # -- decisions -------------------------------------------------------------------------

    def decide_admission(self, admission: Admission) -> Allocation:
        """Place a slice on ``device`` or where the service's placement policy puts it. The
        service sets the owner's budget (the broker reads it from the hub), never its client."""
        kernel_id, limits, owner, device = admission.kernel_id, admission.limits, admission.owner, admission.device
        metadata, holder, budget = admission.metadata, admission.holder, admission.budget
        _no_budget(budget)
        _slice_path(kernel_id)  # the same refusal of an unusable id as every other call
        body = {
            "kernel_id": kernel_id,
            "memory_limit": limits.memory_limit,
            "sm_share": limits.sm_share,
            "policy": limits.policy,
            "owner": owner,
            "device": device,
            "metadata": metadata or {},
            "holder": holder,
        }
        return self._call("POST", "/allocations", body, read=_allocation)

    def decide_resize(self, resizing: Resizing) -> Allocation:
        """Change a slice in place; only what grows is checked against capacity and the budget
        the service holds for its owner."""
        kernel_id, memory_limit, sm_share = resizing.kernel_id, resizing.memory_limit, resizing.sm_share
        policy, budget = resizing.policy, resizing.budget
        _no_budget(budget)
        body = {"memory_limit": memory_limit, "sm_share": sm_share, "policy": policy}
        return self._call("PATCH", _slice_path(kernel_id), body, read=_allocation)

    def release(self, kernel_id: str) -> Allocation | None:
        """Free a kernel's slice; returns what it held, or None if it held nothing."""
        try:
            return self._call("DELETE", _slice_path(kernel_id), read=_allocation)
        except UnknownSlice:
            return None

    def update_metadata(self, kernel_id: str, **fields) -> Allocation:
        """Merge ``fields`` into a slice's metadata."""
        return self._call("PATCH", f"{_slice_path(kernel_id)}/metadata", fields, read=_allocation)

    def suspend(self, kernel_id: str, *, host_memory: int, details: dict[str, Any] | None = None) -> Allocation:
        """Ask the service to lend a slice's room once its processes are checkpointed. Raises
        NotSupported where it does not (the broker: NVML still lists a process of the slice, or
        suspended slices hold all the host memory they may), UnknownSlice."""
        body = {"host_memory": host_memory, "details": details or {}}
        return self._call("POST", f"{_slice_path(kernel_id)}/suspend", body, read=_allocation)

    def resume(self, kernel_id: str) -> Allocation:
        """Admit a suspended slice on its device again, before its processes are restored; raises
        CapacityError where it no longer fits (it stays suspended), UnknownSlice."""
        return self._call("POST", f"{_slice_path(kernel_id)}/resume", {}, read=_allocation)

    def reconcile(self, is_alive: Callable[[Allocation], bool]) -> list[Allocation]:
        """Release every allocation whose kernel is gone; returns the released.

        ``is_alive`` runs here, where the kernels are known; the service then releases each dead
        allocation only if it is still the one judged (same kernel id and creation time), not a
        kernel that took the same id meanwhile.
        """
        dead = [allocation for allocation in self.allocations() if not is_alive(allocation)]
        if not dead:
            return []
        body = {"dead": [{"kernel_id": a.kernel_id, "created_at": a.created_at} for a in dead]}
        return self._call("POST", "/reconcile", body, read=lambda reply: _listed(reply, "released", _allocation))

    # -- the node's line (a broker's; not part of the Ledger protocol) -------------------------

    def wait_in_line(
        self, kernel_id: str, *, kind: str, memory: int, sm_share: int, device_uuid: str | None, since: float
    ) -> None:
        """Register (or renew) a request of this server's line in the service's line, with the
        time it first asked: the service then lets no later request overtake it (see
        ledger/service.py's BrokerLine). A registration not renewed for a while expires."""
        body = {"kind": kind, "memory": memory, "sm_share": sm_share, "device": device_uuid, "since": since}
        self._call("PUT", _line_path(kernel_id), body, read=lambda reply: reply)

    def leave_line(self, kernel_id: str) -> None:
        """Take a request of this server's line out of the service's line."""
        self._call("DELETE", _line_path(kernel_id), read=lambda reply: reply)

    # -- HTTP ------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, read: Callable[[Any], T]) -> T:
        """One request; its reply read by ``read``, or its refusal raised as the ledger's exception."""
        status, reason, data = self._exchange(method, path, body)
        try:
            reply = json.loads(data) if data else None
        except ValueError:  # also UnicodeDecodeError
            reply = None
        request = f"{method} {self._base_path}{path}"
        if 200 <= status < 300 and reply is not None:
            try:
                return read(reply)
            except _Unreadable as error:
                raise LedgerError(
                    f"{self.name} at {self.url} answered {request} with a reply this client cannot read "
                    f"({error}); is it a jupyter-vgpu of another version?"
                ) from None
        raise self._refusal(request, status, reason, reply, data)

    def _refusal(self, request: str, status: int, reason: str, reply: Any, data: bytes) -> Exception:
        message = reply.get("message") if isinstance(reply, dict) else None
        if not isinstance(message, str):
            snippet = data[:80].decode("utf-8", "replace")
            return LedgerError(
                f"{self.name} at {self.url} answered {request} with {status} {reason} and no ledger reply "
                f"({snippet!r}); check that the URL is the ledger's address"
            )
        error = reply.get("error")
        if status == 409 and error == "CapacityError":
            numbers = [reply.get(name) for name in ("requested", "available")]
            resource = reply.get("resource")
            if isinstance(resource, str) and all(type(number) is int for number in numbers):
                making_room = reply.get("making_room")
                return CapacityError(
                    message,
                    resource=resource,
                    requested=numbers[0],
                    available=numbers[1],
                    making_room=making_room if isinstance(making_room, str) else "",
                )
        elif status == 409 and error == "SliceExists":
            return SliceExists(message)
        elif status == 409 and error == "NotLent":
            return NotSupported(message)
        elif status == 404 and error == "UnknownSlice":
            return UnknownSlice(message)
        elif status == 403 and error == "NotYourSlice":
            return SliceForbidden(message)
        elif status == 400:
            # This client sends only well-formed bodies, so a 400 is a value the ledger refused.
            return SliceValueError(message)
        elif status in (401, 403):
            return LedgerError(f"{self.name} at {self.url} refused ({status}): {message}")
        return LedgerError(f"{self.name} at {self.url} answered {request} with {status} {reason}: {message}")

    def _exchange(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str, bytes]:
        headers = dict(self._headers)
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection = self._connection()
        if connection.sock is None:
            # Connecting on its own, so that a service that cannot be reached is told apart from
            # one that failed after a decision was asked of it.
            try:
                connection.connect()
            except OSError as error:
                connection.close()
                raise LedgerError(f"cannot reach {self.name} at {self.url}: {_why(error)}") from error
        # Once the request is sent, the service may have decided even if no answer comes back.
        outcome = "" if method == "GET" else "; the decision may or may not have been made"
        try:
            connection.request(method, f"{self._base_path}{path}", body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except TimeoutError:
            connection.close()
            raise LedgerError(
                f"{self.name} at {self.url} did not answer {method} {path} within {self.timeout:g} s{outcome}"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise LedgerError(
                f"the connection to {self.name} at {self.url} failed during {method} {path}: {_why(error)}{outcome}"
            ) from error
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection)
        return response.status, response.reason, data

    def _connection(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._closed:
                raise LedgerError(f"this client of {self.name} at {self.url} is closed")
            while self._idle:
                connection = self._idle.pop()
                if not _dropped(connection):
                    return connection
                connection.close()
        if self._scheme == "https":
            context = self._ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()


def _no_budget(budget: OwnerBudget | None) -> None:
    if budget is not None:
        raise ValueError(
            "a remote ledger's budgets are the service's to set (the broker reads them from the hub); "
            "its clients cannot send one"
        )


def _why(error: Exception) -> str:
    """``Connection refused`` rather than ``[Errno 111] Connection refused``."""
    return error.strerror if isinstance(error, OSError) and error.strerror else f"{type(error).__name__}: {error}"


def _line_path(kernel_id: object) -> str:
    return "/line/" + _slice_path(kernel_id).rpartition("/")[2]


def _slice_path(kernel_id: object) -> str:
    # object, not str: it refuses what a caller without type checks passes (None, a number).
    if not isinstance(kernel_id, str) or not kernel_id:
        raise SliceValueError(f"a kernel id must be a non-empty string, not {kernel_id!r}")
    # Every character escaped, "/" too: the id is one path segment, whatever it holds.
    return f"/allocations/{quote(kernel_id, safe='')}"
