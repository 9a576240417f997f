"""Limits pages the node's broker publishes: the ledger's decisions, one page per slice, kept in
step by an observer of the ledger; and the user's server making its kernels' regions over them."""

from __future__ import annotations

import stat
import threading

import pytest

from jupyter_vgpu.holders.local import LocalHolder
from jupyter_vgpu.holders.pages import PagePublisher, page_path
from jupyter_vgpu.holders.region import LimitsPage, Region
from jupyter_vgpu.ledger import EmbeddedLedger
from jupyter_vgpu.model import Device, SliceLimits

GIB = 1 << 30
GPUS = [
    Device("GPU-11111111-0000-4000-8000-000000000000", 0, "test GPU 0", 16 * GIB, 100),
    Device("GPU-22222222-0000-4000-8000-000000000000", 1, "test GPU 1", 16 * GIB, 100),
]
KERNEL = "0b8e8f7c-2d0a-4c39-9d4c-6b1f0e2a9c11"


@pytest.fixture
def broker(tmp_path, native_libs):
    """A broker's ledger with its pages, as jupyter_vgpu.hub.broker wires them."""
    publisher = PagePublisher(tmp_path / "state" / "limits")
    ledger = EmbeddedLedger(tmp_path / "state" / "ledger.sqlite", GPUS, observers=[publisher])
    yield ledger, publisher
    ledger.close()


def read(path) -> tuple[SliceLimits, str, int]:
    with LimitsPage.open(path, writable=False) as page:
        return page.limits, page.device_uuid, page.device_index


def test_an_admission_publishes_a_page_others_may_read_and_not_list(broker):
    ledger, publisher = broker
    allocation = ledger.admit(KERNEL, SliceLimits(2 * GIB, 30, "hard"), owner="alice", device=1)
    path = page_path(publisher.folder, KERNEL)
    assert read(path) == (SliceLimits(2 * GIB, 30, "hard"), allocation.device_uuid, 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(publisher.folder.stat().st_mode) == 0o711


def test_a_resize_is_published_in_place_where_the_kernel_maps_it(broker):
    ledger, publisher = broker
    ledger.admit(KERNEL, SliceLimits(2 * GIB, 30, "hard"))
    path = page_path(publisher.folder, KERNEL)
    inode = path.stat().st_ino
    with LimitsPage.open(path, writable=False) as mapped_by_the_kernel:
        ledger.resize(KERNEL, memory_limit=GIB, sm_share=60, policy="burst")
        assert mapped_by_the_kernel.limits == SliceLimits(GIB, 60, "burst")
    assert path.stat().st_ino == inode


def test_a_refused_resize_publishes_nothing(broker):
    ledger, publisher = broker
    ledger.admit(KERNEL, SliceLimits(2 * GIB, 30, "hard"))
    with pytest.raises(Exception, match="memory"):
        ledger.resize(KERNEL, memory_limit=64 * GIB)
    assert read(page_path(publisher.folder, KERNEL))[0] == SliceLimits(2 * GIB, 30, "hard")


def test_a_release_and_a_reconcile_remove_the_pages(broker):
    ledger, publisher = broker
    ledger.admit(KERNEL, SliceLimits(GIB, 10, "hard"))
    ledger.admit("second", SliceLimits(GIB, 10, "hard"))
    ledger.release(KERNEL)
    assert not page_path(publisher.folder, KERNEL).exists()
    ledger.reconcile(lambda allocation: False)
    assert list(publisher.folder.iterdir()) == []


def test_after_a_crash_the_pages_are_made_the_ledgers_again(broker, tmp_path):
    """The broker was SIGKILLed between its decisions and their pages (or something scribbled
    over a page): at start, every page says what the ledger says, and released ones are gone."""
    ledger, publisher = broker
    kept = ledger.admit(KERNEL, SliceLimits(2 * GIB, 30, "hard"))
    ledger.admit("missing", SliceLimits(GIB, 10, "burst"))
    path = page_path(publisher.folder, KERNEL)
    with LimitsPage.open(path) as page:
        page.restore(SliceLimits(8 * GIB, 100, "burst"))
    page_path(publisher.folder, "missing").unlink()
    page_path(publisher.folder, "released-before-the-crash").write_bytes(b"stale")
    PagePublisher(publisher.folder).sync(ledger.allocations())
    assert read(path) == (SliceLimits(2 * GIB, 30, "hard"), kept.device_uuid, kept.device_index)
    assert read(page_path(publisher.folder, "missing"))[0] == SliceLimits(GIB, 10, "burst")
    assert sorted(p.name for p in publisher.folder.iterdir()) == sorted([path.name, "missing.limits"])


def test_concurrent_resizes_leave_the_page_with_the_last_decision(broker):
    ledger, publisher = broker
    ledger.admit(KERNEL, SliceLimits(GIB, 10, "hard"))

    def resize(shares):
        for share in shares:
            ledger.resize(KERNEL, sm_share=share)

    threads = [threading.Thread(target=resize, args=(range(start, 100, 4),)) for start in (11, 12, 13, 14)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert read(page_path(publisher.folder, KERNEL))[0] == ledger.get(KERNEL).limits


def test_a_kernel_id_that_is_no_plain_file_name_names_no_page(tmp_path):
    with pytest.raises(ValueError, match="letters, digits"):
        page_path(tmp_path, "../../etc/passwd")


def test_a_server_under_a_broker_makes_regions_over_the_brokers_pages_and_writes_none(broker, tmp_path):
    ledger, publisher = broker
    allocation = ledger.admit(KERNEL, SliceLimits(2 * GIB, 30, "hard"))
    holder = LocalHolder(tmp_path / "regions", limits_dir=publisher.folder)
    holder.create(allocation)
    environment = holder.environment(allocation, base_env={})
    assert environment["VGPU_LIMITS"] == str(page_path(publisher.folder, KERNEL))
    assert not (tmp_path / "regions" / f"{KERNEL}.region.limits").exists()
    region = holder.region(KERNEL)
    assert not region.page.writable and region.limits == SliceLimits(2 * GIB, 30, "hard")
    # A resize is the broker's to publish; the server's part is a no-op that touches nothing.
    resized = ledger.resize(KERNEL, sm_share=50)
    holder.apply_limits(resized)
    assert holder.usage(resized).warnings == [] and region.limits.sm_share == 50
    # A server restarted later attaches to the same pair.
    with Region.open(holder.path(KERNEL), limits_path=page_path(publisher.folder, KERNEL), publisher=False) as reopened:
        assert reopened.limits == SliceLimits(2 * GIB, 50, "hard")
    holder.release(KERNEL)
    assert page_path(publisher.folder, KERNEL).exists()  # the broker removes it, at its release
    ledger.release(KERNEL)
    assert not page_path(publisher.folder, KERNEL).exists()


def test_a_kernel_whose_page_the_broker_did_not_publish_is_refused_as_the_brokers_failure(broker, tmp_path):
    from jupyter_vgpu.ledger import LedgerError

    ledger, publisher = broker
    allocation = ledger.admit(KERNEL, SliceLimits(GIB, 10, "hard"))
    page_path(publisher.folder, KERNEL).unlink()  # e.g. the broker's disk was full
    with pytest.raises(LedgerError, match="the node's GPU broker published no usable limits for this kernel"):
        LocalHolder(tmp_path / "regions", limits_dir=publisher.folder).create(allocation)
