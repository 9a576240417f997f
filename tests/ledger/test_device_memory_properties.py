"""Property: the ledger never promises a byte NVML shows in use elsewhere.

Random sequences of admissions, resizes, allocations by processes of no slice, allocations past a
slice's cap (a kernel that raised its own cap) and process deaths, on one simulated 16 GiB GPU
with real processes holding real (simulated) device memory. The test keeps its own account of
what each process holds (what it asked for and the process confirmed) and checks every decision
of an EmbeddedLedger reading NVML against it: an admission or growth is granted exactly when the
slices' caps, what processes of no slice hold and what slices hold past their caps still fit."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import CUDA_PRELUDE

from jupyter_vgpu.holders.device_memory import DeviceMemoryReader
from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger
from jupyter_vgpu.model import SliceLimits, list_devices, use_simulator

GIB = 1 << 30
TOTAL = 16 * GIB
ACTORS = 3

# A process that allocates on the simulated GPU what it is told, and says whether it could.
ACTOR = (
    CUDA_PRELUDE
    + """
import sys
held = []
print("ready", flush=True)
for line in sys.stdin:
    pointer = ctypes.c_uint64()
    ok = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(line))) == 0
    if ok:
        held.append(pointer)
    print("ok" if ok else "fail", flush=True)
"""
)


@dataclass
class Actor:
    """A real process on the simulated GPU; ``held`` is what it confirmed it allocated."""

    process: subprocess.Popen
    held: int = 0
    kernel: str | None = None  # the slice it is a process of, or None

    @classmethod
    def start(cls, env: dict[str, str]) -> Actor:
        process = subprocess.Popen(
            [sys.executable, "-c", ACTOR], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        return cls(process)

    def allocate(self, size: int) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{size}\n")
        self.process.stdin.flush()
        if self.process.stdout.readline() == "ok\n":
            self.held += size

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()  # reaped: the simulated driver frees a dead process's memory


@dataclass
class World:
    actors: list[Actor]
    caps: dict[str, int] = field(default_factory=dict)  # the test's own account of the promises

    def unpromised(self) -> int:
        """What the processes hold that no promise covers, by the test's account."""
        total = 0
        for actor in self.actors:
            if actor.kernel is None:
                total += actor.held
        for kernel, cap in self.caps.items():
            held = sum(actor.held for actor in self.actors if actor.kernel == kernel)
            total += max(0, held - cap)
        return total

    def fits(self, extra: int) -> bool:
        return sum(self.caps.values()) + self.unpromised() + extra <= TOTAL


sizes = st.integers(min_value=1, max_value=8).map(lambda gib: gib * GIB // 2)  # 0.5 to 4 GiB
steps = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, ACTORS - 1), sizes),
        st.tuples(st.just("resize"), st.integers(0, ACTORS - 1), sizes),
        st.tuples(st.just("allocate"), st.integers(0, ACTORS - 1), sizes),
        st.tuples(st.just("die"), st.integers(0, ACTORS - 1), st.just(0)),
    ),
    min_size=1,
    max_size=10,
)


@pytest.fixture
def simulated_gpu(in_process_driver, sim_env, monkeypatch):
    """This process's NVML on the private simulated machine of sim_env (one 16 GiB GPU); the
    process's CUDA driver stays on the session's in-process machine (in_process_driver)."""
    for name in ("VGPU_SIM_STATE", "VGPU_SIM_DEVICES"):
        monkeypatch.setenv(name, sim_env[name])
    use_simulator()
    (device,) = list_devices()
    assert device.memory_total == TOTAL
    return device


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_the_ledger_never_promises_memory_nvml_shows_in_use_elsewhere(steps, simulated_gpu, sim_env, tmp_path):
    world = World([Actor.start(sim_env) for _ in range(ACTORS)])

    def kernels_of(allocation):
        """The slice's processes, as its holder knows them, with what they hold."""
        return {actor.process.pid: actor.held for actor in world.actors if actor.kernel == allocation.kernel_id}

    path = tmp_path / f"ledger-{os.urandom(4).hex()}.sqlite"
    ledger = EmbeddedLedger(path, [simulated_gpu], reader=DeviceMemoryReader(kernels_of))
    try:
        for number, (action, index, size) in enumerate(steps):
            actor = world.actors[index]
            if action == "admit" and actor.kernel is None:
                kernel, fits = f"k{number}", world.fits(size)
                try:
                    ledger.admit(kernel, SliceLimits(size, 10, "burst"))
                    granted = True
                except CapacityError:
                    granted = False
                assert granted == fits, (steps[: number + 1], world.unpromised())
                if granted:
                    world.caps[kernel], actor.kernel = size, kernel
            elif action == "resize" and actor.kernel is not None:
                kernel = actor.kernel
                grows = size - world.caps[kernel]
                # Growth is judged as if the slice had its new cap: what it holds up to it is its own.
                before = world.caps[kernel]
                world.caps[kernel] = size
                fits = grows <= 0 or world.fits(0)
                world.caps[kernel] = before
                try:
                    ledger.resize(kernel, memory_limit=size)
                    granted = True
                except CapacityError:
                    granted = False
                assert granted == fits, (steps[: number + 1], world.unpromised())
                if granted:
                    world.caps[kernel] = size
            elif action == "allocate":
                actor.allocate(size)  # in a slice past its cap, or outside any: never promised again
            elif action == "die":
                actor.stop()
                if actor.kernel is not None:
                    ledger.release(actor.kernel)
                    world.caps.pop(actor.kernel)
                world.actors[index] = Actor.start(sim_env)
            (usage,) = ledger.devices_usage()
            assert usage.memory_free == max(0, TOTAL - sum(world.caps.values()) - world.unpromised())
    finally:
        ledger.close()
        for actor in world.actors:
            actor.stop()
