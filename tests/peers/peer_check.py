"""A pytest plugin for a peer project's own test run (``-p peer_check``, loaded by
run_peer_suites.py): it records every kernel process the run starts, with the provisioner that
started it and the environment the process really has, so that the runner can prove the suite's
kernels ran in slices. A suite that passes with plain kernels proves nothing about slices: a
kernelspec installed where Jupyter does not look would pass silently without this record."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

RECORD_VARIABLE = "JUPYTER_VGPU_PEER_RECORD"
# How long a started kernel may take to have its environment and preloads in place (a loaded
# two-core machine takes milliseconds; a kernel that has neither after this is no sliced one).
WAIT_SECONDS = 10.0


def process_environment(pid: int) -> dict[str, str]:
    """The environment a process was started with (empty where it has gone, or has not yet got
    one: the kernel manager's Popen returns at the exec, a moment before the new program's
    environment is in place)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {name.decode(errors="replace"): value.decode(errors="replace") for name, _, value in pairs}


def maps_libvgpu(pid: int) -> bool:
    """Whether the process has libvgpu.so loaded."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return any(line.endswith("/libvgpu.so") for line in maps.splitlines())


async def launch_record(provisioner: Any) -> dict[str, Any]:
    """What one started kernel was: its kernelspec, provisioner and, read from /proc (what the
    process got, not what was meant for it), its preloads, its region and whether libvgpu.so is
    loaded. Waits for the process's environment (and, where it preloads libvgpu.so, for the
    library to be mapped) until a deadline or the process's end."""
    process = getattr(provisioner, "process", None)
    pid = getattr(process, "pid", None)
    environ: dict[str, str] = {}
    preloads: list[str] = []
    loaded = False
    deadline = time.monotonic() + WAIT_SECONDS
    while pid and time.monotonic() < deadline and process.poll() is None:
        environ = environ or process_environment(pid)
        preloads = environ.get("LD_PRELOAD", "").replace(":", " ").split()
        loaded = maps_libvgpu(pid)
        if environ and (loaded or not any(Path(each).name == "libvgpu.so" for each in preloads)):
            break
        await asyncio.sleep(0.01)
    region = environ.get("VGPU_REGION", "")
    return {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
        "kernel_name": getattr(provisioner.parent, "kernel_name", ""),
        "provisioner": type(provisioner).__name__,
        "pid": pid,
        "environ_read": bool(environ),
        "preloads_libvgpu": any(Path(each).name == "libvgpu.so" for each in preloads),
        "loaded_libvgpu": loaded,
        "region": bool(region) and Path(region).is_file(),
    }


def pytest_configure(config: pytest.Config) -> None:
    record = os.environ.get(RECORD_VARIABLE)
    if not record:
        raise pytest.UsageError(f"peer_check records kernel starts in the file ${RECORD_VARIABLE} names; it is unset")
    # Every local kernel (the plain one and VGPUProvisioner, which extends it) starts through
    # LocalProvisioner.launch_kernel; wrapping it is the one place that sees them all.
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    launch = LocalProvisioner.launch_kernel

    async def recorded_launch(self: LocalProvisioner, cmd: list[str], **kwargs: Any) -> Any:
        info = await launch(self, cmd, **kwargs)
        line = json.dumps(await launch_record(self)) + "\n"
        with open(record, "a") as file:  # noqa: ASYNC230 -- one short line, once per kernel start
            file.write(line)
        return info

    LocalProvisioner.launch_kernel = recorded_launch  # type: ignore[method-assign]
