"""The server's process can exit after SIGTERM although jupyter_server left AnyIO worker threads
(jupyterlab/jupyterlab#10442); tests/browser stop real `jupyter lab` processes end to end."""

from __future__ import annotations

import threading

import anyio
import pytest

from jupyter_vgpu.server.app import _stop_anyio_worker_threads


def _anyio_workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "AnyIO worker thread"]


@pytest.mark.asyncio
async def test_stopping_the_extension_ends_the_anyio_worker_threads_a_handler_left():
    await anyio.to_thread.run_sync(lambda: None)  # as nbconvert's handler does on every lab page load
    workers = _anyio_workers()
    assert workers, "AnyIO kept no worker thread: nothing here to stop"

    _stop_anyio_worker_threads()

    for worker in workers:
        worker.join(30)
    assert not [worker for worker in workers if worker.is_alive()]
