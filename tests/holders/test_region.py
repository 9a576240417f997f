"""The region file from Python's side: creation, validation, publishing limits."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_vgpu.holders.region import LimitsPage, Region, RegionError, constants, default_limits_path
from jupyter_vgpu.model import SliceLimits


@pytest.fixture
def region(native_libs, tmp_path):
    created = Region.create(
        tmp_path / "r.region", memory_limit=4 << 30, sm_share=30, policy="burst", device_uuid="GPU-test", device_index=2
    )
    yield created
    created.close()


def test_created_region_carries_header_and_limits(region):
    reopened = Region.open(region.path)
    assert reopened.raw.magic == constants()["VGPU_REGION_MAGIC"]
    assert reopened.limits == SliceLimits(4 << 30, 30, "burst")
    assert reopened.device_uuid == "GPU-test"
    assert reopened.device_index == 2
    reopened.close()


def test_set_limits_changes_only_what_is_given(region):
    region.set_limits(sm_share=50)
    assert Region.open(region.path).limits == SliceLimits(4 << 30, 50, "burst")
    region.set_limits(memory_limit=1 << 30, policy="hard")
    assert Region.open(region.path).limits == SliceLimits(1 << 30, 50, "hard")


def test_limits_alternate_between_the_two_copies(region):
    first = region.page.raw.active_limits
    region.set_limits(sm_share=10)
    assert region.page.raw.active_limits == first ^ 1
    region.set_limits(sm_share=20)
    assert region.page.raw.active_limits == first


def test_missing_region_is_reported(tmp_path, native_libs):
    with pytest.raises(RegionError, match="does not exist"):
        Region.open(tmp_path / "absent.region")


def test_region_of_another_version_is_refused(region):
    region.raw.version = 99
    with pytest.raises(RegionError, match="version 99"):
        Region.open(region.path)


def test_scribbled_limits_are_detected(region):
    region.page.raw.limits[region.page.raw.active_limits].memory_limit = 123
    with pytest.raises(RegionError, match="corrupt"):
        Region.open(region.path)


def test_limits_page_of_another_version_is_refused(region):
    region.page.raw.version = 99
    with pytest.raises(RegionError, match="version 99"):
        Region.open(region.path)


def test_limits_and_device_live_in_a_page_of_their_own_beside_the_region(region):
    page = default_limits_path(region.path)
    assert region.page.path == page and page.name == "r.region.limits"
    with LimitsPage.open(page) as reopened:
        assert reopened.raw.magic == constants()["VGPU_LIMITS_MAGIC"]
        assert (reopened.limits, reopened.device_uuid, reopened.device_index) == (
            SliceLimits(4 << 30, 30, "burst"),
            "GPU-test",
            2,
        )


def test_a_region_can_use_a_page_published_elsewhere(native_libs, tmp_path):
    (tmp_path / "broker").mkdir()
    published = LimitsPage.create(
        tmp_path / "broker" / "k.limits", SliceLimits(1 << 30, 20, "hard"), device_uuid="GPU-b", device_index=1
    )
    with Region.create(tmp_path / "k.region", page=published) as region:
        assert not default_limits_path(region.path).exists()
        with Region.open(region.path, limits_path=published.path) as reopened:
            assert (reopened.limits, reopened.device_uuid) == (SliceLimits(1 << 30, 20, "hard"), "GPU-b")


def test_a_page_that_is_not_ours_to_write_opens_read_only_and_refuses_to_publish(region):
    with Region.open(region.path, publisher=False) as reader:
        assert not reader.page.writable
        with pytest.raises(RegionError, match="not this process's to write"):
            reader.set_limits(sm_share=90)
    assert region.limits.sm_share == 30


def test_foreign_file_is_not_a_region(region):
    region.path.write_bytes(os.urandom(1 << 16))  # larger than a region: only its content is foreign
    with pytest.raises(RegionError, match="not a jupyter-vgpu slice region"):
        Region.open(region.path)


def test_foreign_file_is_not_a_limits_page(region):
    region.page.path.write_bytes(os.urandom(1 << 12))
    with pytest.raises(RegionError, match="not a jupyter-vgpu limits page"):
        Region.open(region.path)


def test_processes_lists_only_live_owners(region):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start_time = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        slot = region.raw.procs[0]
        slot.pid, slot.start_time, slot.allocated = child.pid, start_time, 1000
        region.raw.procs_high_water = 1
        assert [p.pid for p in region.processes()] == [child.pid]
        assert region.used_bytes() == 1000
    finally:
        child.kill()
        child.wait()
    assert region.processes() == []
    assert region.used_bytes() == 0


def test_a_region_of_the_right_version_but_another_size_is_called_corrupt(region):
    region.raw.region_size = 64
    with pytest.raises(RegionError, match=r"is corrupt \(its header says 64 bytes"):
        Region.open(region.path)


def test_the_place_in_line_is_published_for_the_slices_processes(region):
    assert region.queue == (0, None)  # not in line, as a page made before it was published reads
    with LimitsPage.open(region.page.path, writable=False) as reader:
        sequence = region.page.raw.queue_sequence
        region.set_queue(2, 40.4)
        assert reader.queue == (2, 40)
        assert reader.raw.queue_sequence == sequence + 2  # odd only while the pair was written
        region.set_queue(1, None)
        assert reader.queue == (1, None)
        assert reader.raw.queue_eta_s == constants()["VGPU_QUEUE_NO_ESTIMATE"]
        region.set_queue(0, 30)
        assert reader.queue == (0, None)  # no place: no estimate either
        with pytest.raises(RegionError, match="not this process's to write"):
            reader.set_queue(3, 10)
    for position, eta in ((-1, 10), (1, -5)):
        with pytest.raises(ValueError):
            region.set_queue(position, eta)


def test_leaving_the_line_is_a_counter_every_process_of_the_slice_sees_change(region):
    with LimitsPage.open(region.page.path, writable=False) as reader:
        assert reader.leave_line_count == 0
        region.leave_line()
        region.leave_line()
        assert reader.leave_line_count == 2
        with pytest.raises(RegionError, match="not this process's to write"):
            reader.leave_line()
    assert region.suspended is False  # leaving the line does not touch the flag
