"""The GPUs of this machine as NVML and the CUDA driver report them, real or simulated.

The simulated GPU is selected by loading its ``libnvidia-ml.so.1`` and ``libcuda.so.1`` by path
before anything else asks for those sonames: the dynamic loader then hands the already loaded
simulated libraries to pynvml and to ctypes. A process that must see the simulated GPU from its
first instruction (a kernel, a `run` command) gets it through ``LD_LIBRARY_PATH`` instead; see
:mod:`jupyter_vgpu.holders.local`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pynvml

from jupyter_vgpu.model.sizes import SliceValueError
from jupyter_vgpu.native import simulator_dir

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
DEFAULT_SIMULATED_DEVICES = "name=jupyter-vgpu simulated GPU,memory=16GiB,sms=100"


class DeviceError(RuntimeError):
    """No usable GPU, or a device selector that matches none. ``reason`` is what is wrong
    without the advice of the message (which names the CLI's and the server's options)."""

    def __init__(self, message: str, *, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class Device:
    """A GPU as the ledger and the holders know it (``memory_used`` is a reading at listing
    time, for people; nothing decides on it)."""

    uuid: str
    index: int
    name: str
    memory_total: int
    sm_count: int
    memory_used: int = 0


def select_device(devices: Sequence[Device], selector: str | int) -> Device:
    """The device named by an index (``0``) or a UUID (``GPU-...``; a unique prefix is enough)."""
    text = str(selector).strip()
    if isinstance(selector, int) or (text.isascii() and text.isdigit()):
        matches = [device for device in devices if device.index == int(text)]
    else:
        matches = [device for device in devices if text and device.uuid.lower().startswith(text.lower())]
    if len(matches) == 1:
        return matches[0]
    choices = ", ".join(f"{device.index} ({device.uuid})" for device in devices) or "none"
    raise SliceValueError(f"device {str(selector)[:60]!r} matches no single GPU; use an index or UUID of: {choices}")


def simulated_state_path() -> Path:
    """The default state file of the simulated machine shared by a user's processes."""
    # A tmpfs keeps the shared pages of the simulated device off the disk.
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    return Path(runtime) / f"jupyter-vgpu-sim-{os.getuid()}.state"


def simulator_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that put a process on the simulated GPU (kept where the caller set them)."""
    environ = os.environ if environ is None else environ
    library_path = os.pathsep.join(filter(None, [str(simulator_dir()), environ.get("LD_LIBRARY_PATH", "")]))
    return {
        "LD_LIBRARY_PATH": library_path,
        "VGPU_SIM_STATE": environ.get("VGPU_SIM_STATE") or str(simulated_state_path()),
        "VGPU_SIM_DEVICES": environ.get("VGPU_SIM_DEVICES") or DEFAULT_SIMULATED_DEVICES,
    }


def use_simulator() -> None:
    """Make this process's NVML and CUDA driver the simulated ones (call before any GPU use)."""
    for name, value in simulator_environment().items():
        if name != "LD_LIBRARY_PATH":
            os.environ[name] = value
    directory = simulator_dir()
    ctypes.CDLL(str(directory / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(directory / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)


def _sm_counts_by_uuid() -> dict[str, int]:
    """SM counts from the CUDA driver (NVML has no such query), keyed by NVML-style UUID."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return {}
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return {}
    counts = {}
    for ordinal in range(count.value):
        device, sms, raw = ctypes.c_int(), ctypes.c_int(), (ctypes.c_char * 16)()
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        cuda.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
        if cuda.cuDeviceGetUuid_v2(raw, device) == 0:
            hex_ = bytes(raw).hex()
            uuid = f"GPU-{hex_[:8]}-{hex_[8:12]}-{hex_[12:16]}-{hex_[16:20]}-{hex_[20:]}"
            counts[uuid] = sms.value
    return counts


def list_devices() -> list[Device]:
    """Every GPU NVML reports, with its SM count from the driver (0 where the driver hides it)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        reason = f"NVML is not available ({error}): no NVIDIA driver is loaded on this machine."
        raise DeviceError(
            f"{reason} Use --simulate (or VGPUApp.simulate=True) to try jupyter-vgpu on the simulated GPU.",
            reason=reason,
        ) from None
    try:
        sm_counts = _sm_counts_by_uuid()
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                Device(
                    index=index,
                    uuid=uuid,
                    name=pynvml.nvmlDeviceGetName(handle),
                    memory_total=memory.total,
                    memory_used=memory.used,
                    sm_count=sm_counts.get(uuid, 0),
                )
            )
        return devices
    finally:
        pynvml.nvmlShutdown()
