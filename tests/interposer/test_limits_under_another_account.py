"""A kernel under a Unix account of its own, its limits page published by the broker under
another: the kernel reads its cap and obeys it, and nothing it runs can write the page.

This is the guarantee of a classroom whose users run under their own accounts
(docs/classroom.md). It needs two accounts, so the test runs as root (as CI does) and starts
the kernel's process as `nobody`; the files that process needs are copied to a folder every
account can read, since the checkout may sit under one only root can enter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, MIB, ProbeRun

from jupyter_vgpu.holders.pages import PagePublisher, page_path
from jupyter_vgpu.holders.region import LimitsPage, Region
from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.model import Device, SliceLimits

NOBODY = 65534
KERNEL = "5d0f2b7e-8c1a-4f8e-9a51-3e2d7c6b4a10"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting a process under another account needs root")


@pytest.fixture
def shared_folder():
    folder = Path(tempfile.mkdtemp(prefix="vgpu-accounts-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_kernel_under_another_account_obeys_the_brokers_page_and_cannot_write_it(
    probe, native_libs, sim_env, make_slice, shared_folder
):
    # What the kernel's process runs, where `nobody` can read it.
    lib = shared_folder / "lib"
    shutil.copytree(native_libs.sim_dir, lib / "sim")
    shutil.copy(native_libs.vgpu, lib / "libvgpu.so")
    shutil.copy(probe.executable, lib / "slice_probe")
    for path in [lib, *lib.rglob("*")]:
        path.chmod(0o755)

    # The broker (this root process): the ledger decides, the publisher writes the page.
    broker = shared_folder / "broker"
    broker.mkdir(mode=0o711)
    uuid = make_slice(sim_env)[1].device_uuid  # the simulated GPU's, as NVML names it
    ledger = EmbeddedLedger(
        broker / "ledger.sqlite",
        [Device(uuid, 0, "simulated", 16 << 30, 100)],
        observers=[PagePublisher(broker / "limits")],
    )
    allocation = ledger.admit(KERNEL, SliceLimits(64 * MIB, 100, "hard"), owner="student")
    page = page_path(broker / "limits", KERNEL)
    assert page.stat().st_uid == 0

    # The user's server (as the user): the kernel's region, over the broker's page.
    user = shared_folder / "user"
    user.mkdir(mode=0o700)
    os.chown(user, NOBODY, NOBODY)
    with LimitsPage.open(page, writable=False) as published:
        region = Region.create(user / f"{KERNEL}.region", page=published)
        region.close()
    os.chown(user / f"{KERNEL}.region", NOBODY, NOBODY)

    env = dict(
        sim_env,
        LD_PRELOAD=str(lib / "libvgpu.so"),
        LD_LIBRARY_PATH=str(lib / "sim"),
        VGPU_REGION=str(user / f"{KERNEL}.region"),
        VGPU_LIMITS=str(page),
        VGPU_SIM_STATE=str(user / "sim-state"),
        CUDA_VISIBLE_DEVICES=uuid,
    )

    def as_the_student(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=env, user=NOBODY, group=NOBODY, capture_output=True, text=True, check=False, timeout=60
        )

    run = as_the_student(str(lib / "slice_probe"), "--path=direct", "init", "alloc:48M", "alloc:48M")
    result = ProbeRun(run.returncode, [line.split() for line in run.stdout.splitlines()], run.stdout, run.stderr)
    assert run.returncode == 0, run.stderr
    assert [result.rc(1), result.rc(2)] == [0, CUDA_ERROR_OUT_OF_MEMORY], run.stdout + run.stderr

    # Whatever the kernel runs, as its account: the page cannot be opened for writing, nor replaced.
    write = as_the_student("/bin/sh", "-c", ': >> "$1"', "sh", str(page))
    assert write.returncode != 0 and "Permission denied" in write.stderr
    replace = as_the_student("/bin/mv", "-f", str(user / f"{KERNEL}.region"), str(page))
    assert replace.returncode != 0
    with LimitsPage.open(page, writable=False) as after:
        assert after.limits == allocation.limits

    # The broker resizes: the kernel's next process sees the new cap.
    ledger.resize(KERNEL, memory_limit=128 * MIB)
    run = as_the_student(str(lib / "slice_probe"), "--path=direct", "init", "alloc:48M", "alloc:48M")
    result = ProbeRun(run.returncode, [line.split() for line in run.stdout.splitlines()], run.stdout, run.stderr)
    assert [result.rc(1), result.rc(2)] == [0, 0], run.stdout + run.stderr
    ledger.close()
