"""One line across a node's users' servers (issue 25), the broker's: the requests users' servers
have waiting for room on the node's devices, in the order they first asked, by line.py's rule
(:func:`~jupyter_vgpu.line.may_go_before`), kept in a JSON file beside the ledger so that a
broker restart keeps the order. No HTTP here: ledger/service.py serves it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_vgpu.line import Request, may_go_before

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


__all__ = ["LINE_RESOURCE", "LINE_TTL_S", "BrokerLine"]
