"""Helpers shared by test modules (importable because tests/conftest.py puts tests/ on sys.path)."""

from __future__ import annotations

import socket
import time

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
