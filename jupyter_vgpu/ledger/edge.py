"""The ledger service's edge: what every request is checked against before a decision (bodies:
types, sizes, unknown fields; so nothing a client sends reaches the ledger in a shape it does not
take or becomes a 500), refusals as JSON, and who is asking (a :class:`Gate` turns a credential
into a :class:`Caller`). ledger/service.py's handlers use it.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tornado import httputil, web

from jupyter_vgpu.ledger.base import OwnerBudget
from jupyter_vgpu.model import FULL_SHARE

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


def bad_request(message: str) -> Refusal:
    return Refusal(400, message, "BadRequest")


# -- checking bodies at the edge ---------------------------------------------------------------

_REQUIRED = object()


def _text(name: str, value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string, not {json.dumps(value)[:60]}")
    if not value and not empty:
        raise bad_request(f"{name} must not be empty")
    if len(value) > MAX_TEXT:
        raise bad_request(f"{name} must be at most {MAX_TEXT} characters, not {len(value)}")
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON) that no UTF-8 store takes
        raise bad_request(f"{name} must be text that UTF-8 can hold") from None
    return value


def check_kernel_id(name: str, value: Any) -> str:
    return _text(name, value, empty=False)


def _whole(name: str, value: Any) -> int:
    # Only the type and the storable range are checked here; whether the number is an accepted
    # size or share is the ledger's to say, in the same words as for its other callers.
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be a whole number, not {json.dumps(value)[:60]}")
    if not INT64[0] <= value <= INT64[1]:
        raise bad_request(f"{name} {value} is out of range")
    return value


def _device(name: str, value: Any) -> int | str:
    return _whole(name, value) if isinstance(value, int) and not isinstance(value, bool) else _text(name, value)


def check_metadata(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{name} must be a JSON object, not {json.dumps(value)[:60]}")
    level: list[dict[str, Any] | list[Any]] = [value]
    depth = 1
    while level:
        if depth > MAX_METADATA_DEPTH:
            raise bad_request(f"{name} is nested more than {MAX_METADATA_DEPTH} levels deep")
        children = [item for node in level for item in (node.values() if isinstance(node, dict) else node)]
        level, depth = [item for item in children if isinstance(item, (dict, list))], depth + 1
    return value


def _created_at(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{name} must be a number, not {json.dumps(value)[:60]}")
    return float(value)


def _optional(check: Callable[[str, Any], T]) -> Callable[[str, Any], T | None]:
    return lambda name, value: None if value is None else check(name, value)


def _fields(body: Any, spec: FieldSpec, where: str = "the request body") -> dict[str, Any]:
    """The checked fields of ``body`` (a JSON object): every one known, every required one there."""
    if not isinstance(body, dict):
        raise bad_request(f"{where} must be a JSON object")
    unknown = sorted(set(body) - set(spec))
    if unknown:
        names = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise bad_request(f"{where} has unknown field {names}; it takes {', '.join(spec)}")
    checked: dict[str, Any] = {}
    for name, (check, default) in spec.items():
        if name in body:
            checked[name] = check(name, body[name])
        elif default is _REQUIRED:
            raise bad_request(f"{where} lacks {name!r}")
        else:
            checked[name] = default
    return checked


def _dead(name: str, value: Any) -> set[tuple[str, float]]:
    if not isinstance(value, list):
        raise bad_request(f"{name} must be a list of {{kernel_id, created_at}} objects")
    spec = {"kernel_id": (check_kernel_id, _REQUIRED), "created_at": (_created_at, _REQUIRED)}
    items = [_fields(item, spec, where=f"{name}[{number}]") for number, item in enumerate(value)]
    return {(item["kernel_id"], item["created_at"]) for item in items}


ADMIT_FIELDS = {
    "kernel_id": (check_kernel_id, _REQUIRED),
    "memory_limit": (_whole, _REQUIRED),
    "sm_share": (_whole, FULL_SHARE),
    "policy": (_text, "hard"),
    "owner": (_text, ""),
    "device": (_optional(_device), None),
    "metadata": (_optional(check_metadata), None),
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
SUSPEND_FIELDS = {"host_memory": (_whole, _REQUIRED), "details": (_optional(check_metadata), None)}


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _not_a_number(text: str) -> None:
    raise ValueError(f"{text} is not JSON")


def parse_body(raw: bytes, spec: FieldSpec | None) -> dict[str, Any]:
    """A request's JSON object, checked against ``spec`` (None: any object of fields)."""
    if len(raw) > MAX_BODY_BYTES:
        raise bad_request(f"the request body must be at most {MAX_BODY_BYTES} bytes, not {len(raw)}")
    try:
        value = json.loads(raw, parse_float=_finite, parse_constant=_not_a_number)
    except (ValueError, RecursionError) as error:  # RecursionError: [[[[...]]]] past the parser's depth
        raise bad_request(f"the request body is not JSON ({str(error)[:80]})") from None
    if spec is None:
        return check_metadata("the request body", value)
    return _fields(value, spec)


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
