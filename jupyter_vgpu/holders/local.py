"""A slice as a process sees it: a region file, and the environment that puts a process (and
every process it starts, since children inherit the environment) inside it."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jupyter_core.paths import jupyter_runtime_dir

from jupyter_vgpu.model.devices import Device, simulator_environment
from jupyter_vgpu.native import interposer_path
from jupyter_vgpu.holders.region import Region

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class SliceSpec:
    """What a slice may use: bytes of device memory (0 = no cap), SM share in percent, policy."""

    memory_limit: int = 0
    sm_share: int = 100
    policy: str = "hard"


def region_directory() -> Path:
    """Where region files live by default: a private folder in Jupyter's runtime directory."""
    directory = Path(jupyter_runtime_dir()) / "vgpu"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory


def create_region(spec: SliceSpec, device: Device, directory: Path | None = None, name: str | None = None) -> Region:
    path = (directory or region_directory()) / f"{name or uuidlib.uuid4().hex}.region"
    return Region.create(
        path,
        memory_limit=spec.memory_limit,
        sm_share=spec.sm_share,
        policy=spec.policy,
        device_uuid=device.uuid,
        device_index=device.index,
    )


def slice_environment(region: Region, *, simulate: bool, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process in the slice: the interposer preloaded, the region named,
    only the slice's device visible, and the simulated driver on the library path if asked."""
    env = dict(os.environ if base_env is None else base_env)
    if simulate:
        env.update(simulator_environment(env))
    env["LD_PRELOAD"] = " ".join(filter(None, [str(interposer_path()), env.get("LD_PRELOAD", "")]))
    env["VGPU_REGION"] = str(region.path)
    env["CUDA_VISIBLE_DEVICES"] = region.device_uuid
    return env


def run_in_slice(command: Sequence[str], spec: SliceSpec, device: Device, *, simulate: bool) -> int:
    """Run a command inside a fresh slice and return its exit status (128 + N if killed by signal N).

    Signals sent to this process are passed on to the command, so Ctrl-C reaches the program
    rather than leaving it running in a slice whose region is being removed.
    """
    region = create_region(spec, device)
    try:
        env = slice_environment(region, simulate=simulate)
        try:
            child = subprocess.Popen(list(command), env=env)
        except OSError as error:
            raise FileNotFoundError(f"cannot start {command[0]!r}: {error.strerror}") from None
        previous = {sig: signal.signal(sig, lambda number, _frame: child.send_signal(number)) for sig in FORWARDED_SIGNALS}
        try:
            status = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 128 - status if status < 0 else status
    finally:
        region.close()
        region.path.unlink(missing_ok=True)
