"""Fixtures of the ledger tests: test GPUs, a ledger file per test, a service loop that serves
ledgers over HTTP on 127.0.0.1, and ``open_ledger``, which opens a ledger of either
implementation so that one contract suite runs against both:

- ``embedded``: an EmbeddedLedger on the file;
- ``remote``: a RemoteLedger talking HTTP to ledger_handlers serving an EmbeddedLedger on the
  file, in a thread with its own event loop, as the broker serves it in a process of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from jupyter_vgpu.ledger import EmbeddedLedger, Ledger
from jupyter_vgpu.ledger.remote import RemoteLedger
from jupyter_vgpu.ledger.service import ledger_handlers
from jupyter_vgpu.model import Device

GIB = 1 << 30
PREFIX = "/services/vgpu.broker/ledger"  # a "." that the routes must not take as a wildcard
TOKEN = "ledger-test-token"
# A test that hangs on the service should fail, not wait for the suite's timeout.
CLIENT_TIMEOUT_S = 30.0


def make_gpu(index: int, memory_gib: float, sm_count: int = 100) -> Device:
    return Device(
        uuid=f"GPU-{index:08d}-0000-4000-8000-000000000000",
        index=index,
        name=f"test GPU {index}",
        memory_total=int(memory_gib * GIB),
        sm_count=sm_count,
    )


@pytest.fixture(scope="session")
def gpu() -> Callable[..., Device]:
    """gpu(index, memory_gib, sm_count=100) -> a test Device with a UUID made from its index."""
    return make_gpu


@pytest.fixture
def ledger_path(tmp_path) -> Path:
    return tmp_path / "ledger.sqlite"


# -- serving over HTTP -------------------------------------------------------------------------


@dataclass
class Served:
    """One HTTP server on the service loop; ``url`` is its root (``http://127.0.0.1:PORT``)."""

    url: str
    server: HTTPServer
    loop: ServiceLoop

    def stop(self) -> None:
        async def stop() -> None:
            self.server.stop()
            await self.server.close_all_connections()

        self.loop.run(stop())


class ServiceLoop:
    """An asyncio event loop running in a thread of its own, on which tests start tornado
    servers; the test's thread stays free to be the client."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ledger-service-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine, timeout: float = 30.0):
        """Run ``coroutine`` on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def serve(self, handlers: list[tuple]) -> Served:
        """A server of ``handlers`` on a port the system picks (no race for a free port)."""

        async def start() -> Served:
            # Created on the loop: a tornado server belongs to the loop that is current when it starts.
            sockets = bind_sockets(0, "127.0.0.1")
            server = HTTPServer(Application(handlers))
            server.add_sockets(sockets)
            return Served(f"http://127.0.0.1:{sockets[0].getsockname()[1]}", server, self)

        return self.run(start())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        # The ledger calls ran in the loop's default executor; its threads end here.
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()


@pytest.fixture(scope="session")
def service_loop():
    loop = ServiceLoop()
    yield loop
    loop.close()


@pytest.fixture
def serve(service_loop):
    """serve(ledger, prefix=PREFIX, token=TOKEN) -> the URL of a service of ``ledger`` (prefix
    included); stopped at the end of the test."""
    served: list[Served] = []

    def serve_(ledger: Ledger, prefix: str = PREFIX, token: str = TOKEN) -> str:
        served.append(service_loop.serve(ledger_handlers(prefix, ledger, token)))
        return served[-1].url + prefix

    yield serve_
    for server in served:
        server.stop()


# -- a ledger of either kind -------------------------------------------------------------------


class LedgerOpener:
    """``open_ledger(devices, path=None, **options)``: a ledger of this opener's kind on ``path``
    (the test's ledger file by default), with the EmbeddedLedger's ``options``. Everything it
    opens is closed by :meth:`close_all` (at the end of the test)."""

    def __init__(self, kind: str, default_path: Path, service_loop: ServiceLoop):
        self.kind = kind
        self.default_path = default_path
        self.service_loop = service_loop
        self._embedded: list[EmbeddedLedger] = []
        self._served: list[Served] = []
        self._clients: list[RemoteLedger] = []
        self._opened_with: dict[int, tuple[Path, list[Device], dict]] = {}

    def __call__(self, devices: list[Device], *, path: Path | None = None, **options) -> Ledger:
        embedded = EmbeddedLedger(path or self.default_path, devices, **options)
        self._embedded.append(embedded)
        if self.kind == "embedded":
            self._opened_with[id(embedded)] = (embedded.path, devices, options)
            return embedded
        served = self.service_loop.serve(ledger_handlers(PREFIX, embedded, TOKEN))
        self._served.append(served)
        return self._client(served.url + PREFIX)

    def another(self, ledger: Ledger) -> Ledger:
        """A second handle on the same ledger: another EmbeddedLedger on its file (as another
        process opens it), or another client of its service (as another user's server)."""
        if isinstance(ledger, RemoteLedger):
            return self._client(ledger.url)
        path, devices, options = self._opened_with[id(ledger)]
        return self(devices, path=path, **options)

    def _client(self, url: str) -> RemoteLedger:
        client = RemoteLedger(url, TOKEN, timeout=CLIENT_TIMEOUT_S)
        self._clients.append(client)
        return client

    def close_all(self) -> None:
        for client in self._clients:
            client.close()
        for served in self._served:
            served.stop()
        for embedded in self._embedded:
            embedded.close()
        self._clients, self._served, self._embedded = [], [], []
        self._opened_with.clear()


@pytest.fixture(params=["embedded", "remote"])
def open_ledger(request, ledger_path, service_loop):
    """A :class:`LedgerOpener` of each kind in turn: every test that takes it runs against both."""
    opener = LedgerOpener(request.param, ledger_path, service_loop)
    yield opener
    opener.close_all()
