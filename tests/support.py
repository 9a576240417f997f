"""Helpers shared by test modules (importable because tests/conftest.py puts tests/ on sys.path)."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, message: str = "condition", interval: float = 0.02):
    """Polls `condition` until it returns a truthy value or `timeout` seconds pass; returns the
    value, or fails the test with the last value seen."""
    deadline = time.monotonic() + timeout
    value = condition()
    while not value:
        if time.monotonic() > deadline:
            pytest.fail(f"{message} not met within {timeout} s (last: {value!r})")
        time.sleep(interval)
        value = condition()
    return value


@contextmanager
def json_stand_in(respond):
    """A JSON HTTP server on 127.0.0.1 for the length of the block, answering GET and PATCH with
    ``respond(method, path, body, headers) -> (status, reply)``; yields ``http://127.0.0.1:PORT/``.
    A stand-in for a Jupyter server where a test needs exact replies (refusals, odd answers)."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, reply = respond(self.command, self.path, body, self.headers)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = _serve

        def log_message(self, *args):
            pass  # keep pytest's captured output to the test's own

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}/"
    finally:
        http.shutdown()
        thread.join()
