"""Starts waiting in the line outlive their server (issue 34).

A kernel start that does not fit waits in the line as a pending kernel: the notebook is open,
its session names the kernel, and the kernel starts by itself when room comes. A server killed
meanwhile (SIGKILL, a crash, the OOM killer) would lose that start and its place: the restarted
server drops the session row of a kernel it does not know, JupyterLab starts a new kernel, and
that one joins the back of the line.

So each start that waits is written down here, beside the server's ledger, with what starting it
again needs (its kernel id and kernelspec, the folder it starts in, the size asked for) and the
time it first asked, and crossed out once it leaves the line (it started, was shut down or
interrupted, or the server stopped and shut it down). A restarted server starts each one that
its predecessor left again, before it answers its first request, with the same kernel id and
its first time: the notebook's session keeps its kernel, and the start keeps its place in line
(server/app.py, with the kernels its predecessor left running).

Where the server uses a node's broker, kernels end with their server (``kernel_survival`` is 0
there), and so do waiting starts: nothing is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jupyter_vgpu.holders.device_memory import process_running
from jupyter_vgpu.manager import this_process

# The kernel manager's start_kernel argument with which a restarted server starts a waiting start
# again: the time it first asked (epoch seconds), its place in the line.
SINCE_ARGUMENT = "vgpu_waiting_since"
# Where the server keeps the store (web_app.settings), for its provisioners.
WAITING_STARTS_SETTING = "vgpu_waiting_starts"
log = logging.getLogger(__name__)


class WaitingStarts:
    """The starts waiting in this server's line, in a JSON file (0600) that every server sharing
    the runtime folder updates under an exclusive lock: ``{kernel_id: entry}``, each entry
    ``{"kernel_name", "path", "size", "since", "server": {"pid", "pid_start_time"}}``."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def add(self, kernel_id: str, *, kernel_name: str, path: str, size: dict[str, Any], since: float) -> None:
        """Write down a start that waits in this server's line from ``since``."""
        entry = {"kernel_name": kernel_name, "path": path, "size": dict(size), "since": since, "server": this_process()}
        with self._changing() as starts:
            starts[kernel_id] = entry

    def remove(self, kernel_id: str) -> None:
        """Cross out a start that left the line."""
        with self._changing() as starts:
            starts.pop(kernel_id, None)

    def left_by_a_gone_server(self) -> dict[str, dict[str, Any]]:
        """The starts of servers that no longer run (to start again), oldest first; each is
        crossed out (a start that fails now is not tried again by the next server)."""
        with self._changing() as starts:
            gone = [kernel_id for kernel_id, entry in starts.items() if not _server_runs(entry)]
            left = {kernel_id: starts.pop(kernel_id) for kernel_id in gone}
        return dict(sorted(((k, e) for k, e in left.items() if _well_formed(e)), key=lambda item: item[1]["since"]))

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            starts = self._read()
            yield starts
            temporary = self.path.with_name(self.path.name + ".new")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(descriptor, "w") as file:
                json.dump(starts, file)
            os.replace(temporary, self.path)
        finally:
            os.close(lock)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            starts = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            # A file nobody can read back names no start: said, and started afresh.
            log.warning("jupyter_vgpu: waiting starts in %s not read (%s); none is started again", self.path, error)
            return {}
        return starts if isinstance(starts, dict) else {}


def _server_runs(entry: Any) -> bool:
    """Whether the server that wrote ``entry`` down still runs (this one included)."""
    server = entry.get("server") if isinstance(entry, dict) else None
    if not isinstance(server, dict):
        return False
    pid, start_time = server.get("pid"), server.get("pid_start_time")
    if not isinstance(pid, int) or not isinstance(start_time, int):
        return False
    return pid == os.getpid() or process_running(pid, start_time)


def _well_formed(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("kernel_name"), str)
        and isinstance(entry.get("path"), str)
        and isinstance(entry.get("size"), dict)
        and isinstance(entry.get("since"), (int, float))
    )


__all__ = ["SINCE_ARGUMENT", "WAITING_STARTS_SETTING", "WaitingStarts"]
