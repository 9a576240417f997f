"""The ledger contract: admission, placement, share accounting, resize, server limits, refusals
people can act on, release, reconcile, and that they hold under concurrency. Every test that
takes ``open_ledger`` runs against both implementations (``[embedded]``: the SQLite file in the
server; ``[remote]``: a RemoteLedger over HTTP to a service of that file), so the slice manager
may hold either and see the same decisions, the same refusals and the same messages."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import ledger_slices

from jupyter_vgpu.ledger import CapacityError, Ledger, SliceExists, UnknownSlice
from jupyter_vgpu.ledger.embedded import PLACEMENTS
from jupyter_vgpu.model import Device, SliceLimits, SliceValueError

GIB = 1 << 30
MIB = 1 << 20


def admit_refused(ledger, kernel_id: str, limits: SliceLimits, **placement) -> CapacityError:
    """The CapacityError that admitting ``limits`` for ``kernel_id`` raises (the test fails where
    the slice is admitted)."""
    with pytest.raises(CapacityError) as raised:
        ledger.admit(kernel_id, limits, **placement)
    return raised.value


def test_both_kinds_speak_the_ledger_protocol(open_ledger, gpu):
    assert isinstance(open_ledger([gpu(0, 16)]), Ledger)


# -- admission and placement -------------------------------------------------------------------


def test_admit_records_the_slice_with_owner_and_metadata(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    allocation = ledger.admit(
        "k1", SliceLimits(4 * GIB, 50, "burst"), owner="ada", metadata={"kernelspec": "python3-vgpu"}
    )
    assert (allocation.device_uuid, allocation.device_index) == (gpu(0, 16).uuid, 0)
    assert (allocation.memory_limit, allocation.sm_share, allocation.policy) == (4 * GIB, 50, "burst")
    assert allocation.owner == "ada"
    assert allocation.metadata == {"kernelspec": "python3-vgpu"}
    assert ledger.get("k1") == allocation
    assert ledger.allocations() == [allocation]
    assert ledger.get("k2") is None


def test_admit_records_where_the_slice_is_held(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    assert (ledger.admit("k1", SliceLimits(GIB, 10)).holder, ledger.get("k1").node) == ("local", "")
    in_a_pod = ledger.admit("k2", SliceLimits(GIB, 10), holder="pod")
    assert in_a_pod.holder == ledger.get("k2").holder == "pod"


def test_a_slice_held_in_a_pod_takes_no_device_room_but_counts_for_the_server(open_ledger, gpu):
    """The cluster's scheduler places a pod's slice: it is on none of this machine's devices (a
    server for pod kernels may have none), resizes are not held to a device, and this server's
    own limits (largest slice, slices and memory in all) still apply."""
    ledger = open_ledger([], max_slice=SliceLimits(8 * GIB, 100), server_slice_limit=2, server_memory_limit=10 * GIB)
    pod = ledger.admit("k1", SliceLimits(6 * GIB, 30), holder="pod")
    assert (pod.device_uuid, pod.device_index) == ("", -1)
    assert ledger.devices_usage() == []
    assert ledger.resize("k1", memory_limit=8 * GIB).memory_limit == 8 * GIB
    with pytest.raises(SliceValueError, match="at most 8GiB"):
        ledger.admit("k2", SliceLimits(9 * GIB), holder="pod")
    with pytest.raises(CapacityError, match="may hold 10GiB of GPU memory in all"):
        ledger.admit("k2", SliceLimits(4 * GIB), holder="pod")
    ledger.admit("k2", SliceLimits(2 * GIB), holder="pod")
    with pytest.raises(CapacityError, match="at most 2 GPU slices"):
        ledger.admit("k3", SliceLimits(GIB), holder="pod")


def test_any_kernel_id_names_one_slice(open_ledger, gpu):
    # Ids reach the remote ledger in a URL path: a "/", "%", "?" or non-ASCII must not change them.
    ledger = open_ledger([gpu(0, 80)])
    awkward = ["a/b", "../k", "50%?x=1#y", "ядро 1", "k1"]
    for number, kernel_id in enumerate(awkward, start=1):
        ledger.admit(kernel_id, SliceLimits(number * GIB, 10))
    assert {kernel_id: ledger.get(kernel_id).memory_limit for kernel_id in awkward} == {
        kernel_id: number * GIB for number, kernel_id in enumerate(awkward, start=1)
    }
    assert ledger.resize("a/b", memory_limit=3 * GIB).kernel_id == "a/b"
    assert ledger.update_metadata("50%?x=1#y", pid=1).metadata == {"pid": 1}
    assert ledger.release("../k").kernel_id == "../k"
    assert sorted(allocation.kernel_id for allocation in ledger.allocations()) == sorted(set(awkward) - {"../k"})


def test_devices_are_listed_with_their_usage_in_index_order(open_ledger, gpu):
    ledger = open_ledger([gpu(1, 8, sm_count=66), gpu(0, 16)], reserve=GIB)
    assert ledger.devices == [gpu(0, 16), gpu(1, 8, sm_count=66)]
    ledger.admit("k1", SliceLimits(2 * GIB, 30, "burst"), device=1)
    usage = ledger.devices_usage()
    assert [entry.device for entry in usage] == ledger.devices
    assert (usage[1].memory_capacity, usage[1].memory_allocated, usage[1].memory_free) == (7 * GIB, 2 * GIB, 5 * GIB)
    assert (usage[1].hard_share, usage[1].total_share, usage[1].share_capacity, usage[1].slices) == (0, 30, 100, 1)
    assert (usage[0].memory_free, usage[0].slices) == (15 * GIB, 0)


def test_binpack_fills_the_fullest_device_and_spread_the_emptiest(open_ledger, gpu, tmp_path):
    devices = [gpu(0, 16), gpu(1, 8)]
    chosen = {}
    for placement in PLACEMENTS:
        ledger = open_ledger(devices, path=tmp_path / f"{placement}.sqlite", placement=placement)
        chosen[placement] = ledger.admit("k1", SliceLimits(2 * GIB)).device_index
    assert chosen == {"binpack": 1, "spread": 0}


def test_binpack_skips_a_fuller_device_the_slice_does_not_fit(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 8)], placement="binpack")
    assert ledger.admit("k1", SliceLimits(12 * GIB)).device_index == 0
    # GPU 0 now has 4GiB free, GPU 1 8GiB: a 6GiB slice only fits on GPU 1.
    assert ledger.admit("k2", SliceLimits(6 * GIB)).device_index == 1


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_placement_ties_go_to_the_lowest_index(open_ledger, gpu, placement):
    ledger = open_ledger([gpu(1, 8), gpu(0, 8)], placement=placement)
    assert ledger.admit("k1", SliceLimits(GIB, 10)).device_index == 0


@pytest.mark.parametrize("selector", [1, "1", "GPU-00000001", "gpu-00000001-0000-4000-8000-000000000000"])
def test_admit_on_a_named_device_by_index_or_uuid(open_ledger, gpu, selector):
    ledger = open_ledger([gpu(0, 8), gpu(1, 8)], placement="binpack")
    assert ledger.admit("k1", SliceLimits(GIB), device=selector).device_index == 1


@pytest.mark.parametrize("selector", [7, "GPU-ffff", "GPU-0000000", ""])
def test_a_device_that_matches_no_single_gpu_is_refused_with_the_choices(open_ledger, gpu, selector):
    ledger = open_ledger([gpu(0, 8), gpu(1, 8)])
    with pytest.raises(SliceValueError, match=r"matches no single GPU; use an index or UUID of: 0 \(GPU-0+-"):
        ledger.admit("k1", SliceLimits(GIB), device=selector)
    assert ledger.allocations() == []


def test_a_kernel_id_holds_one_slice_only(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    ledger.admit("k1", SliceLimits(GIB))
    with pytest.raises(SliceExists, match="a slice for kernel 'k1' already exists .*resize or release it") as raised:
        ledger.admit("k1", SliceLimits(GIB))
    assert isinstance(raised.value, KeyError)
    assert len(ledger.allocations()) == 1


def test_reserve_is_held_back_on_every_device(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 8), gpu(1, 8)], reserve=GIB)
    assert [usage.memory_capacity for usage in ledger.devices_usage()] == [7 * GIB, 7 * GIB]
    refused = admit_refused(ledger, "k1", SliceLimits(7 * GIB + MIB))
    assert refused.available == 7 * GIB
    ledger.admit("k1", SliceLimits(7 * GIB))
    assert ledger.devices_usage()[0].memory_free == 0


# -- SM shares ---------------------------------------------------------------------------------


def test_hard_shares_add_up_to_100_percent_at_most(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 80)], burst_oversubscription=2.0)
    ledger.admit("k1", SliceLimits(GIB, 60, "hard"))
    ledger.admit("k2", SliceLimits(GIB, 40, "hard"))
    refused = admit_refused(ledger, "k3", SliceLimits(GIB, 1, "hard"))
    assert (refused.resource, refused.available) == ("sm_share", 0)


def test_burst_shares_may_oversubscribe_up_to_the_factor(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 80)], burst_oversubscription=1.5)
    ledger.admit("k1", SliceLimits(GIB, 100, "hard"))
    ledger.admit("k2", SliceLimits(GIB, 30, "burst"))
    ledger.admit("k3", SliceLimits(GIB, 20, "burst"))
    refused = admit_refused(ledger, "k4", SliceLimits(GIB, 1, "burst"))
    assert (refused.resource, refused.available) == ("sm_share", 0)
    [usage] = ledger.devices_usage()
    assert (usage.hard_share, usage.total_share, usage.share_capacity, usage.slices) == (100, 150, 150, 3)


def test_without_oversubscription_burst_and_hard_shares_share_100_percent(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 80)])
    ledger.admit("k1", SliceLimits(GIB, 70, "burst"))
    refused = admit_refused(ledger, "k2", SliceLimits(GIB, 40, "hard"))
    assert refused.available == 30
    ledger.admit("k2", SliceLimits(GIB, 30, "hard"))


def test_a_hard_slice_counts_against_the_oversubscribed_total_too(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 80)], burst_oversubscription=1.5)
    ledger.admit("k1", SliceLimits(GIB, 100, "burst"))
    ledger.admit("k2", SliceLimits(GIB, 40, "hard"))
    refused = admit_refused(ledger, "k3", SliceLimits(GIB, 20, "hard"))
    assert refused.available == 10


# -- refusals people can act on ----------------------------------------------------------------


def test_memory_refusal_names_the_free_memory_of_each_device_and_what_to_ask(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 8)])
    ledger.admit("k1", SliceLimits(10 * GIB, 10), device=0)
    ledger.admit("k2", SliceLimits(5 * GIB, 10), device=1)
    refused = admit_refused(ledger, "k3", SliceLimits(12 * GIB, 10))
    error = refused
    assert (error.resource, error.requested, error.available) == ("memory", 12 * GIB, 6 * GIB)
    assert str(error) == (
        "no device has 12GiB of GPU memory free: GPU 0 has 6GiB, GPU 1 has 3GiB free; "
        "ask for at most 6GiB, or stop a kernel"
    )


def test_memory_refusal_suggests_a_device_where_the_share_fits_too(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 8)])
    ledger.admit("k1", SliceLimits(4 * GIB, 100), device=0)
    ledger.admit("k2", SliceLimits(5 * GIB, 50), device=1)
    refused = admit_refused(ledger, "k3", SliceLimits(14 * GIB, 50))
    assert refused.available == 3 * GIB
    assert "GPU 0 has 12GiB (but only 0% of its SMs free for a hard slice)" in str(refused)
    assert str(refused).endswith("ask for at most 3GiB, or stop a kernel")


def test_share_refusal_says_the_free_share_per_device_and_offers_a_burst_slice(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 16)], burst_oversubscription=2.0)
    ledger.admit("k1", SliceLimits(GIB, 80, "hard"), device=0)
    ledger.admit("k2", SliceLimits(GIB, 90, "hard"), device=1)
    refused = admit_refused(ledger, "k3", SliceLimits(GIB, 50, "hard"))
    error = refused
    assert (error.resource, error.requested, error.available) == ("sm_share", 50, 20)
    assert str(error) == (
        "no device with 1GiB of GPU memory free has 50% of its SMs free for a hard slice: "
        "GPU 0 has 20%, GPU 1 has 10%; ask for at most 20%, ask for a burst slice, or stop a kernel"
    )


def test_refusal_on_a_named_device_speaks_of_that_device(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 8)])
    refused = admit_refused(ledger, "k1", SliceLimits(10 * GIB), device=1)
    assert str(refused) == (
        "GPU 1 does not have 10GiB of GPU memory free: it has 8GiB free; ask for at most 8GiB, or stop a kernel"
    )


def test_a_full_machine_says_to_stop_a_kernel(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 4)])
    ledger.admit("k1", SliceLimits(4 * GIB, 10))
    with pytest.raises(CapacityError, match="GPU 0 has 0B free; stop a kernel to free some$"):
        ledger.admit("k2", SliceLimits(GIB, 10))


def test_a_ledger_without_devices_refuses_every_slice(open_ledger):
    ledger = open_ledger([])
    with pytest.raises(CapacityError, match="no GPU") as raised:
        ledger.admit("k1", SliceLimits(GIB))
    assert raised.value.resource == "devices"


# -- resize ------------------------------------------------------------------------------------


def test_resize_grows_and_shrinks_in_place(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 16)], burst_oversubscription=1.5)
    admitted = ledger.admit("k1", SliceLimits(4 * GIB, 50, "hard"), device=1, metadata={"pid": 7})
    grown = ledger.resize("k1", memory_limit=16 * GIB, sm_share=100)
    assert (grown.device_index, grown.memory_limit, grown.sm_share, grown.policy) == (1, 16 * GIB, 100, "hard")
    assert (grown.created_at, grown.metadata) == (admitted.created_at, {"pid": 7})
    shrunk = ledger.resize("k1", memory_limit=GIB, sm_share=20, policy="burst")
    assert (shrunk.memory_limit, shrunk.sm_share, shrunk.policy) == (GIB, 20, "burst")
    assert ledger.get("k1") == shrunk
    usage = ledger.devices_usage()[1]
    assert (usage.memory_allocated, usage.hard_share, usage.total_share) == (GIB, 0, 20)


def test_resize_refusal_says_the_most_the_slice_can_grow_to(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    ledger.admit("k1", SliceLimits(4 * GIB, 30))
    ledger.admit("k2", SliceLimits(10 * GIB, 60))
    with pytest.raises(CapacityError) as raised:
        ledger.resize("k1", memory_limit=8 * GIB)
    assert (raised.value.resource, raised.value.available) == ("memory", 6 * GIB)
    assert str(raised.value) == (
        "kernel 'k1' cannot grow to 8GiB of GPU memory: GPU 0 has 2GiB free beyond the slice's 4GiB; "
        "it can grow to at most 6GiB, or stop another kernel on that GPU"
    )
    with pytest.raises(CapacityError, match="the other slices leave 40%; ask for at most 40%") as raised:
        ledger.resize("k1", sm_share=50)
    assert (raised.value.resource, raised.value.available) == ("sm_share", 40)
    assert ledger.get("k1").limits == SliceLimits(4 * GIB, 30)


def test_turning_a_burst_slice_hard_needs_free_hard_share(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)], burst_oversubscription=2.0)
    ledger.admit("k1", SliceLimits(GIB, 80, "hard"))
    ledger.admit("k2", SliceLimits(GIB, 50, "burst"))
    with pytest.raises(CapacityError, match="cannot have 50% of the SMs of GPU 0 as a hard slice"):
        ledger.resize("k2", policy="hard")
    assert ledger.resize("k2", sm_share=20, policy="hard").policy == "hard"


def test_resize_of_an_unknown_kernel_raises_unknown_slice(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    with pytest.raises(UnknownSlice, match="no slice is held for kernel 'ghost'") as raised:
        ledger.resize("ghost", memory_limit=GIB)
    assert isinstance(raised.value, KeyError)
    with pytest.raises(UnknownSlice):
        ledger.update_metadata("ghost", pid=1)


def test_a_slice_can_shrink_on_a_device_that_came_back_smaller(open_ledger, gpu):
    open_ledger([gpu(0, 16)]).admit("k1", SliceLimits(12 * GIB))
    restarted = open_ledger([gpu(0, 8)])
    assert restarted.resize("k1", memory_limit=10 * GIB).memory_limit == 10 * GIB
    with pytest.raises(CapacityError, match="it can grow to at most 8GiB"):
        restarted.resize("k1", memory_limit=11 * GIB)


def test_a_stranded_slice_can_shrink_but_not_grow(open_ledger, gpu):
    open_ledger([gpu(0, 16), gpu(1, 16)]).admit("k1", SliceLimits(2 * GIB), device=1)
    restarted = open_ledger([gpu(0, 16)])
    assert restarted.resize("k1", memory_limit=GIB).memory_limit == GIB
    with pytest.raises(CapacityError, match="no longer on this machine; its slice can shrink but not grow"):
        restarted.resize("k1", memory_limit=4 * GIB)


def test_resize_values_are_validated_like_requests(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    ledger.admit("k1", SliceLimits(GIB))
    with pytest.raises(SliceValueError, match="whole percentage from 1 to 100"):
        ledger.resize("k1", sm_share=0)
    with pytest.raises(SliceValueError, match="'hard' .* or 'burst'"):
        ledger.resize("k1", policy="soft")


def test_update_metadata_merges_fields_into_the_slice(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    ledger.admit("k1", SliceLimits(GIB), metadata={"kernelspec": "python3-vgpu", "pid": 1})
    updated = ledger.update_metadata("k1", pid=4242, region="/run/k1.region")
    assert updated.metadata == {"kernelspec": "python3-vgpu", "pid": 4242, "region": "/run/k1.region"}
    assert ledger.get("k1") == updated


# -- limits ------------------------------------------------------------------------------------


def test_a_slice_over_the_largest_allowed_is_refused_with_the_maximum(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 80)], max_slice=SliceLimits(8 * GIB, 50))
    with pytest.raises(SliceValueError, match="at most 8GiB of GPU memory on this server, not 9GiB; ask for 8GiB or"):
        ledger.admit("k1", SliceLimits(9 * GIB))
    with pytest.raises(SliceValueError, match="at most 50% of a GPU's SMs on this server, not 60%; ask for 50% or"):
        ledger.admit("k1", SliceLimits(GIB, 60))
    ledger.admit("k1", SliceLimits(8 * GIB, 50))
    with pytest.raises(SliceValueError, match="ask for 8GiB or less"):
        ledger.resize("k1", memory_limit=9 * GIB)


def test_the_server_slice_limit_counts_slices_on_every_device(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 16)], server_slice_limit=2, placement="spread")
    ledger.admit("k1", SliceLimits(GIB, 10))
    ledger.admit("k2", SliceLimits(GIB, 10))
    with pytest.raises(CapacityError, match="at most 2 GPU slices and all 2 are in use") as raised:
        ledger.admit("k3", SliceLimits(GIB, 10))
    assert (raised.value.resource, raised.value.available) == ("slices", 0)
    ledger.release("k1")
    ledger.admit("k3", SliceLimits(GIB, 10))


def test_the_server_memory_limit_holds_for_admissions_and_resizes(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16), gpu(1, 16)], server_memory_limit=10 * GIB)
    ledger.admit("k1", SliceLimits(6 * GIB, 10))
    refused = admit_refused(ledger, "k2", SliceLimits(5 * GIB, 10))
    assert (refused.resource, refused.available) == ("server_memory", 4 * GIB)
    assert str(refused) == (
        "cannot admit a slice of 5GiB: this server's slices may hold 10GiB of GPU memory in all and 6GiB is held; "
        "ask for at most 4GiB, or stop a kernel"
    )
    ledger.admit("k2", SliceLimits(4 * GIB, 10))
    with pytest.raises(CapacityError, match="it can grow to at most 6GiB") as raised:
        ledger.resize("k1", memory_limit=7 * GIB)
    assert raised.value.resource == "server_memory"


def test_a_slice_without_a_memory_cap_is_refused(open_ledger, gpu):
    # SliceLimits takes 0 ("no cap", as a region says it); a ledger never admits a slice without one.
    ledger = open_ledger([gpu(0, 16)])
    with pytest.raises(SliceValueError, match="more than zero bytes"):
        ledger.admit("k1", SliceLimits(0))
    assert ledger.allocations() == []


@pytest.mark.parametrize(
    "request_args, message",
    [
        (("0",), "must be more than zero"),
        (("lots",), "512MiB, 4GiB, 4G or a bare number of MiB"),
        (("1GiB", 101), "whole percentage from 1 to 100"),
        (("1GiB", 50, "soft"), "'hard' .* or 'burst'"),
    ],
)
def test_slice_requests_are_validated_with_the_size_vocabulary(request_args, message):
    with pytest.raises(SliceValueError, match=message):
        SliceLimits.parse(*request_args)


def test_slice_requests_accept_size_strings():
    assert SliceLimits.parse("4GiB", "50%", "BURST") == SliceLimits(4 * GIB, 50, "burst")


# -- release and reconcile ---------------------------------------------------------------------


def test_release_returns_what_was_held_once(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 8)])
    admitted = ledger.admit("k1", SliceLimits(GIB))
    assert ledger.release("k1") == admitted
    assert ledger.release("k1") is None
    assert ledger.devices_usage()[0].memory_free == 8 * GIB


def test_reconcile_releases_the_slices_of_kernels_that_are_gone(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    for kernel_id in ("alive", "dead-1", "dead-2"):
        ledger.admit(kernel_id, SliceLimits(GIB, 10))
    released = ledger.reconcile(lambda allocation: allocation.kernel_id == "alive")
    assert sorted(allocation.kernel_id for allocation in released) == ["dead-1", "dead-2"]
    assert [allocation.kernel_id for allocation in ledger.allocations()] == ["alive"]
    assert ledger.devices_usage()[0].memory_allocated == GIB


def test_reconcile_spares_a_kernel_that_took_the_same_id_meanwhile(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    ledger.admit("k1", SliceLimits(GIB))

    def gone_but_restarted(allocation):
        # While the liveness check runs, the kernel is restarted under the same id.
        ledger.release("k1")
        ledger.admit("k1", SliceLimits(2 * GIB))
        return False

    assert ledger.reconcile(gone_but_restarted) == []
    assert ledger.get("k1").memory_limit == 2 * GIB


def test_reconcile_sees_every_allocation_once_and_releases_nothing_alive(open_ledger, gpu):
    ledger = open_ledger([gpu(0, 16)])
    admitted = [ledger.admit(f"k{number}", SliceLimits(GIB, 10)) for number in range(3)]
    judged = []
    assert ledger.reconcile(lambda allocation: judged.append(allocation) or True) == []
    assert judged == admitted == ledger.allocations()


# -- concurrency -------------------------------------------------------------------------------


def _admit_after_barrier(ledger: Ledger, barrier, kernel_id: str) -> str:
    barrier.wait()
    try:
        ledger.admit(kernel_id, SliceLimits(GIB, 5))
    except CapacityError as error:
        return f"refused: {error.resource}"
    return "admitted"


@pytest.mark.parametrize("shared", [True, False], ids=["one-ledger-for-all-threads", "a-ledger-per-thread"])
def test_twenty_concurrent_threads_against_room_for_ten_admit_exactly_ten(open_ledger, gpu, shared):
    # A ledger per thread: another EmbeddedLedger on the file each (as other processes open it),
    # or another client of the one service each (as other users' servers).
    first = open_ledger([gpu(0, 10)])
    ledgers = [first] * 20 if shared else [first] + [open_ledger.another(first) for _ in range(19)]
    barrier = threading.Barrier(20)
    outcomes = [None] * 20

    def start(number: int) -> None:
        outcomes[number] = _admit_after_barrier(ledgers[number], barrier, f"kernel-{number}")

    threads = [threading.Thread(target=start, args=(number,)) for number in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == {"admitted": 10, "refused: memory": 10}
    assert first.devices_usage()[0].memory_free == 0


# -- property: a random history against a simple model -----------------------------------------

MACHINE_RESERVE = GIB
MACHINE_SHARE_CAPACITY = 150
MACHINE_SLICE_LIMIT = 5
KERNEL_IDS = st.sampled_from([f"k{number}" for number in range(7)])
MEMORY = st.integers(1, 8).map(lambda halves: halves * GIB // 2)
SHARES = st.sampled_from([5, 25, 40, 50, 60, 100])
POLICY = st.sampled_from(["hard", "burst"])


class LedgerAgainstModel(RuleBasedStateMachine):
    """Admit / resize / release / crash-and-reopen / reconcile, checked against a dict of slices."""

    def __init__(self, open_ledger, devices: list[Device]):
        super().__init__()
        self.open_ledger = open_ledger
        self.devices = devices
        self.directory = tempfile.mkdtemp(prefix="vgpu-ledger-")
        self.path = Path(self.directory) / "ledger.sqlite"
        self.model: dict[str, tuple[str, int, int, str]] = {}  # kernel -> (device uuid, memory, share, policy)

    @initialize(placement=st.sampled_from(PLACEMENTS))
    def open_the_ledger(self, placement):
        self.placement = placement
        self.ledger = self.reopen()

    def reopen(self) -> Ledger:
        return self.open_ledger(
            self.devices,
            path=self.path,
            reserve=MACHINE_RESERVE,
            burst_oversubscription=MACHINE_SHARE_CAPACITY / 100,
            placement=self.placement,
            server_slice_limit=MACHINE_SLICE_LIMIT,
        )

    def model_free(self, device: Device, excluding: str | None = None) -> tuple[int, int, int]:
        held = [slice_ for kernel, slice_ in self.model.items() if slice_[0] == device.uuid and kernel != excluding]
        memory = device.memory_total - MACHINE_RESERVE - sum(slice_[1] for slice_ in held)
        hard = 100 - sum(slice_[2] for slice_ in held if slice_[3] == "hard")
        total = MACHINE_SHARE_CAPACITY - sum(slice_[2] for slice_ in held)
        return memory, hard, total

    def model_fits(self, device, memory, share, policy, excluding=None) -> bool:
        free_memory, free_hard, free_total = self.model_free(device, excluding)
        return memory <= free_memory and share <= free_total and (policy == "burst" or share <= free_hard)

    def near_the_edge(self, devices, excluding=None) -> tuple[st.SearchStrategy, st.SearchStrategy]:
        """Random sizes and shares, or exactly the room left and just past it, where off-by-one
        errors live."""
        memories, shares = set(), set()
        for device in devices:
            free_memory, free_hard, free_total = self.model_free(device, excluding)
            memories |= {free_memory, free_memory + 1}
            shares |= {free_hard, free_hard + 1, free_total, free_total + 1}
        memories = sorted(memory for memory in memories if memory > 0)
        shares = sorted(share for share in shares if 1 <= share <= 100)
        return (
            MEMORY | (st.sampled_from(memories) if memories else st.nothing()),
            SHARES | (st.sampled_from(shares) if shares else st.nothing()),
        )

    @rule(data=st.data(), kernel=KERNEL_IDS, policy=POLICY, device=st.none() | st.integers(0, 2))
    def admit(self, data, kernel, policy, device):
        memories, shares = self.near_the_edge(self.devices)
        memory, share = data.draw(memories, label="memory"), data.draw(shares, label="share")
        candidates = [d for d in self.devices if device is None or d.index == device]
        fitting = [d for d in candidates if self.model_fits(d, memory, share, policy)]
        request = SliceLimits(memory, share, policy)
        if kernel in self.model:
            with pytest.raises(SliceExists):
                self.ledger.admit(kernel, request, device=device)
        elif len(self.model) >= MACHINE_SLICE_LIMIT or not fitting:
            with pytest.raises(CapacityError):
                self.ledger.admit(kernel, request, device=device)
        else:
            sign = 1 if self.placement == "binpack" else -1
            expected = min(fitting, key=lambda d: (sign * self.model_free(d)[0], d.index))
            allocation = self.ledger.admit(kernel, request, device=device)
            assert allocation.device_uuid == expected.uuid
            self.model[kernel] = (expected.uuid, memory, share, policy)

    @rule(kernel=KERNEL_IDS, memory=MEMORY)
    def resize_a_kernel_without_a_slice(self, kernel, memory):
        if kernel not in self.model:
            with pytest.raises(UnknownSlice):
                self.ledger.resize(kernel, memory_limit=memory)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), policy=st.none() | POLICY)
    def resize(self, data, policy):
        kernel = data.draw(st.sampled_from(sorted(self.model)), label="kernel")
        uuid, old_memory, old_share, old_policy = self.model[kernel]
        device = next(d for d in self.devices if d.uuid == uuid)
        memories, shares = self.near_the_edge([device], excluding=kernel)
        memory = data.draw(st.none() | memories, label="memory")
        share = data.draw(st.none() | shares, label="share")
        wanted = (uuid, memory or old_memory, share or old_share, policy or old_policy)
        if self.model_fits(device, *wanted[1:], excluding=kernel):
            resized = self.ledger.resize(kernel, memory_limit=memory, sm_share=share, policy=policy)
            assert (resized.device_uuid, resized.memory_limit, resized.sm_share, resized.policy) == wanted
            self.model[kernel] = wanted
        else:
            with pytest.raises(CapacityError):
                self.ledger.resize(kernel, memory_limit=memory, sm_share=share, policy=policy)

    @rule(kernel=KERNEL_IDS)
    def release(self, kernel):
        released = self.ledger.release(kernel)
        expected = self.model.pop(kernel, None)
        assert (released is None) == (expected is None)

    @rule()
    def crash_and_reopen(self):
        # No close(): the object is dropped as a killed server drops it (the remote kind: a new
        # service on the same file, the old one left running as a crashed peer would leave it).
        self.ledger = self.reopen()

    @rule(alive=st.sets(KERNEL_IDS))
    def reconcile(self, alive):
        released = self.ledger.reconcile(lambda allocation: allocation.kernel_id in alive)
        dead = {kernel for kernel in self.model if kernel not in alive}
        assert {allocation.kernel_id for allocation in released} == dead
        for kernel in dead:
            del self.model[kernel]

    @precondition(lambda self: self.model)
    @rule()
    def release_everything_frees_all_capacity(self):
        for kernel in list(self.model):
            self.ledger.release(kernel)
        self.model.clear()
        for usage in self.ledger.devices_usage():
            assert (usage.memory_allocated, usage.hard_share, usage.total_share, usage.slices) == (0, 0, 0, 0)
            assert usage.memory_free == usage.memory_capacity == usage.device.memory_total - MACHINE_RESERVE

    @invariant()
    def the_ledger_matches_the_model(self):
        assert ledger_slices(self.ledger, "device_uuid", "memory_limit", "sm_share", "policy") == self.model

    @invariant()
    def no_device_is_ever_over_committed(self):
        for usage in self.ledger.devices_usage():
            assert usage.memory_allocated <= usage.memory_capacity
            assert usage.hard_share <= 100
            assert usage.total_share <= MACHINE_SHARE_CAPACITY
            assert usage.memory_free == usage.memory_capacity - usage.memory_allocated

    def teardown(self):
        self.open_ledger.close_all()
        shutil.rmtree(self.directory, ignore_errors=True)


# Each remote example starts services over HTTP; fewer of them still cover every rule many times.
MODEL_EXAMPLES = {"embedded": 300, "remote": 50}


def test_the_ledger_against_a_model(open_ledger, gpu):
    devices = [gpu(0, 8), gpu(1, 6), gpu(2, 4)]
    run_state_machine_as_test(
        lambda: LedgerAgainstModel(open_ledger, devices),
        settings=settings(max_examples=MODEL_EXAMPLES[open_ledger.kind], stateful_step_count=40, deadline=None),
    )
