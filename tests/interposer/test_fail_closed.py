"""A process whose slice region is unusable fails closed: every allocation is refused with
CUDA_ERROR_OUT_OF_MEMORY and the reason is printed once on stderr; processes that never
allocate stay silent."""

from __future__ import annotations

import os
import subprocess

import pytest
from slice_helpers import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GIB, MIB, live_slots, process_start_time

from jupyter_vgpu.holders.region import LimitsPage, constants, limits_check
from jupyter_vgpu.model import SliceLimits

COMMANDS = ("init", "alloc:1M", "vmm:2M", "managed:1M", "info", "total")


def assert_failed_closed(run, reason: str):
    assert run.returncode == 0, run.stderr
    assert [run.rc(index) for index in (1, 2, 3)] == [CUDA_ERROR_OUT_OF_MEMORY] * 3
    assert run.values(4)[:2] == [CUDA_SUCCESS, 0]  # no free memory shown
    assert run.values(5)[1] > 0  # the total is the device's, never 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr  # once, not once per refusal
    assert reason in lines[0]
    assert "allocations are refused" in lines[0]


def test_unset_region_fails_closed(probe, sim_env, native_libs):
    env = dict(sim_env, LD_PRELOAD=str(native_libs.vgpu))
    assert_failed_closed(probe(env, *COMMANDS), "VGPU_REGION is not set")


def test_missing_region_fails_closed(probe, sim_env, native_libs, tmp_path):
    env = dict(sim_env, LD_PRELOAD=str(native_libs.vgpu), VGPU_REGION=str(tmp_path / "gone.region"))
    assert_failed_closed(probe(env, *COMMANDS), f"slice region {tmp_path / 'gone.region'} cannot be opened")


def test_region_of_another_version_fails_closed(probe, sim_env, make_slice):
    env, region = make_slice(sim_env, memory_limit=GIB)
    region.raw.version = 7
    version = constants()["VGPU_REGION_VERSION"]
    run = probe(env, *COMMANDS)
    assert_failed_closed(
        run, f"slice region {env['VGPU_REGION']} is version 7, this libvgpu.so reads version {version}"
    )
    assert "restart the kernel from a matching jupyter-vgpu" in run.stderr


def test_file_that_is_not_a_region_fails_closed(probe, sim_env, native_libs, tmp_path):
    bogus = tmp_path / "bogus.region"
    bogus.write_bytes(b"not a region at all" * 1000)
    env = dict(sim_env, LD_PRELOAD=str(native_libs.vgpu), VGPU_REGION=str(bogus))
    assert_failed_closed(probe(env, *COMMANDS), "is not a jupyter-vgpu slice region")


@pytest.mark.parametrize(
    "scribble",
    [
        pytest.param(lambda r: setattr(r.page.raw.limits[r.page.raw.active_limits], "check", 12345), id="check"),
        pytest.param(
            lambda r: setattr(r.page.raw.limits[r.page.raw.active_limits], "memory_limit", 7), id="limit-without-check"
        ),
        pytest.param(lambda r: setattr(r.page.raw, "active_limits", 5), id="active-index"),
        pytest.param(lambda r: setattr(r.raw, "region_size", 64), id="region-size"),
    ],
)
def test_corrupt_region_fails_closed(probe, sim_env, make_slice, scribble):
    env, region = make_slice(sim_env, memory_limit=GIB)
    scribble(region)
    assert_failed_closed(probe(env, *COMMANDS), "is corrupt")


@pytest.mark.parametrize(
    ("scribble", "says"),
    [
        pytest.param(lambda raw: setattr(raw, "magic", 1), "is not a jupyter-vgpu limits page", id="magic"),
        pytest.param(lambda raw: setattr(raw, "page_size", 64), "is not a jupyter-vgpu limits page", id="page-size"),
        pytest.param(lambda raw: setattr(raw, "version", 7), "is version 7", id="version"),
    ],
)
def test_foreign_limits_page_fails_closed(probe, sim_env, make_slice, scribble, says):
    env, region = make_slice(sim_env, memory_limit=GIB)
    scribble(region.page.raw)
    run = probe(env, *COMMANDS)
    assert_failed_closed(run, f"{region.page.path} ")
    assert says in run.stderr


def test_missing_limits_page_fails_closed(probe, sim_env, make_slice):
    env, region = make_slice(sim_env, memory_limit=GIB)
    region.page.path.unlink()
    assert_failed_closed(probe(env, *COMMANDS), f"the slice's limits page {region.page.path} cannot be opened")


def test_the_limits_page_named_by_vgpu_limits_is_the_one_obeyed(probe, sim_env, make_slice, tmp_path):
    """$VGPU_LIMITS names a page elsewhere (the broker's): its cap holds, not the one beside the
    region."""
    env, region = make_slice(sim_env, memory_limit=GIB)
    elsewhere = LimitsPage.create(
        tmp_path / "elsewhere.limits",
        SliceLimits(64 * MIB, 100, "hard"),
        device_uuid=region.device_uuid,
        device_index=region.device_index,
    )
    run = probe(dict(env, VGPU_LIMITS=str(elsewhere.path)), "init", "alloc:48M", "alloc:48M")
    assert [run.rc(1), run.rc(2)] == [0, CUDA_ERROR_OUT_OF_MEMORY], run.stderr
    elsewhere.close()


def test_out_of_range_limits_with_a_valid_check_fail_closed(probe, sim_env, make_slice):
    env, region = make_slice(sim_env, memory_limit=GIB)
    copy = region.page.raw.limits[region.page.raw.active_limits]
    copy.sm_share = 0
    copy.check = limits_check(copy.memory_limit, 0, copy.policy)
    assert_failed_closed(probe(env, *COMMANDS), "is corrupt")


def test_repaired_region_is_honoured_on_the_next_call(probe, sim_env, make_slice, interactive):
    env, region = make_slice(sim_env, memory_limit=GIB)
    copy = region.page.raw.limits[region.page.raw.active_limits]
    good_check = copy.check
    copy.check = 1
    program = interactive([probe.executable, "init", "alloc:1M", "wait", "alloc:1M"], env)
    lines = program.read_until("wait")
    assert lines[1][:2] == ["alloc", str(CUDA_ERROR_OUT_OF_MEMORY)]
    copy.check = good_check
    program.send()
    lines = program.read_until("alloc")
    assert lines[0][:2] == ["alloc", "0"]
    assert program.finish() == 0


def test_process_that_never_allocates_prints_nothing(sim_env, native_libs, tmp_path):
    env = dict(sim_env, LD_PRELOAD=str(native_libs.vgpu), VGPU_REGION=str(tmp_path / "gone.region"))
    result = subprocess.run(["sh", "-c", "echo hello"], check=False, env=env, capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")


def test_region_with_every_slot_held_by_a_live_process_refuses_and_says_why(probe, sim_env, make_slice):
    env, region = make_slice(sim_env, memory_limit=GIB)
    raw = region.raw
    for index in range(raw.max_procs):  # all held by this (live) test process
        raw.procs[index].pid = os.getpid()
        raw.procs[index].start_time = process_start_time(os.getpid())
    raw.procs_high_water = raw.max_procs
    run = probe(env, "init", "alloc:1M", "alloc:1M")
    assert run.returncode == 0, run.stderr
    assert [run.rc(1), run.rc(2)] == [CUDA_ERROR_OUT_OF_MEMORY] * 2
    assert run.stderr.count("\n") == 1
    assert f"slice region {env['VGPU_REGION']} has no free process slot (all 128 are held" in run.stderr
    raw.procs[5].pid = 0  # one frees up: the next process gets it
    run = probe(env, "init", "alloc:1M")
    assert run.rc(1) == 0, run.stderr


def test_limits_unreadable_when_a_pitch_grows_its_charge_refuse_the_allocation(
    probe, build_shared, sim_env, make_slice, interactive, tmp_path
):
    """The driver chose a wider pitch than the interposer charged for, and the limits turned
    unreadable meanwhile: the extra bytes cannot be checked against any cap, so the allocation
    is refused (and given back to the driver), never charged as if the slice had no cap."""
    fake = build_shared("driver_scribbling_limits", "libcuda.so.1")  # scribbles, pitch aligned to 4 KiB
    env, region = make_slice(sim_env, memory_limit=GIB)
    env["LD_LIBRARY_PATH"] = f"{fake.parent}:{env['LD_LIBRARY_PATH']}"
    program = interactive([probe.executable, "pitch:1000:400", "wait"], env, stderr_path=tmp_path / "stderr")
    lines = program.read_until("wait")
    assert lines[0][:2] == ["pitch", str(CUDA_ERROR_OUT_OF_MEMORY)]
    (slot,) = live_slots(region)
    assert slot.allocated == 0
    program.send()
    assert program.finish() == 0
    stderr = [line for line in (tmp_path / "stderr").read_text().splitlines() if line.strip()]
    assert len(stderr) == 1 and "is corrupt" in stderr[0] and "allocations are refused" in stderr[0]
