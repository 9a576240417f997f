"""The kernel's side of the release before a suspend (jupyter_vgpu/notebook/release.py) on its
own, with STAND-IN framework modules (PyTorch and CuPy are not installable with CUDA here): what it
calls, what it counts, and that it never imports a framework. The whole path, with a real server,
a real kernel and the simulated driver, is tests/server/test_suspend.py's; the real frameworks are
benchmarks/framework_checks.py's GPU run."""

from __future__ import annotations

import subprocess
import sys
import types

from jupyter_vgpu.notebook.release import release_framework_caches

GIB = 1 << 30


class StandInCache:
    """A framework's cache of device memory: ``held`` bytes until emptied; each call that empties
    it is recorded in ``calls`` as ``name``."""

    def __init__(self, held: int, calls: list[str], name: str):
        self.held, self.calls, self.name = held, calls, name

    def empty(self) -> None:
        self.calls.append(self.name)
        self.held = 0


def stand_in_torch(initialized: bool, reserved: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    calls: list[str] = []
    cache = StandInCache(reserved, calls, "empty_cache")
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: initialized,
        memory_reserved=lambda: cache.held,
        empty_cache=cache.empty,
        calls=calls,
    )
    return torch


def stand_in_cupy(total: int) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    calls: list[str] = []
    cache = StandInCache(total, calls, "device")
    device = types.SimpleNamespace(total_bytes=lambda: cache.held, free_all_blocks=cache.empty)
    pinned = types.SimpleNamespace(free_all_blocks=lambda: calls.append("pinned"))
    cupy.get_default_memory_pool = lambda: device
    cupy.get_default_pinned_memory_pool = lambda: pinned
    cupy.calls = calls
    return cupy


def test_a_stand_in_torch_and_cupy_have_their_caches_emptied_and_counted():
    torch, cupy = stand_in_torch(True, 2 * GIB), stand_in_cupy(GIB)
    assert release_framework_caches({"torch": torch, "cupy": cupy}) == {"torch": 2 * GIB, "cupy": GIB}
    assert torch.cuda.calls == ["empty_cache"]
    assert cupy.calls == ["device", "pinned"]


def test_a_stand_in_torch_that_never_initialised_cuda_is_not_asked():
    torch = stand_in_torch(False, 0)
    assert release_framework_caches({"torch": torch}) == {"torch": 0, "cupy": 0}
    assert torch.cuda.calls == []  # asking would create a CUDA context


def test_a_failing_stand_in_framework_does_not_stop_the_release():
    cupy = types.ModuleType("cupy")
    cupy.get_default_memory_pool = lambda: (_ for _ in ()).throw(RuntimeError("broken"))
    torch = stand_in_torch(True, GIB)
    assert release_framework_caches({"cupy": cupy, "torch": torch}) == {"torch": GIB, "cupy": 0}


def test_no_framework_is_ever_imported_for_the_release():
    code = (
        "import sys\nfrom jupyter_vgpu.notebook.release import release_framework_caches\n"
        "print(release_framework_caches(), 'torch' in sys.modules, 'cupy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "{'torch': 0, 'cupy': 0} False False"
