"""Owner budgets in the embedded ledger: what all the slices of one owner may hold together
(the classroom size the broker reads from the hub), checked in the same decision that admits or
grows one of them. Each refusal names the budget and says what to ask for instead."""

from __future__ import annotations

import pytest

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, OwnerBudget
from jupyter_vgpu.model import SliceLimits, SliceValueError

GIB = 1 << 30
LABEL = "alice's GPU size 'small'"


@pytest.fixture
def ledger(ledger_path, gpu):
    """Two roomy GPUs, so that only the budgets refuse."""
    with EmbeddedLedger(ledger_path, [gpu(0, 32), gpu(1, 32)], burst_oversubscription=2.0) as ledger:
        yield ledger


def budget(**fields) -> OwnerBudget:
    return OwnerBudget(label=LABEL, **fields)


# -- slices -------------------------------------------------------------------------------------


def test_the_slices_budget_refuses_one_slice_too_many(ledger):
    limit = budget(slices=2)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=limit)
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a3", SliceLimits(GIB, 10), owner="alice", budget=limit)
    error = refused.value
    assert error.resource == "user_slices"
    assert (error.requested, error.available) == (1, 0)
    assert LABEL in str(error)
    assert "2 GPU slices at once" in str(error) and "all 2 are in use" in str(error)
    assert "stop one of your kernels first" in str(error)
    assert ledger.get("a3") is None


def test_one_slice_is_said_in_the_singular(ledger):
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=budget(slices=1))
    with pytest.raises(CapacityError, match=r"allows 1 GPU slice at once and all 1 are in use"):
        ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=budget(slices=1))


def test_a_released_slice_gives_its_place_in_the_budget_back(ledger):
    limit = budget(slices=1)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    ledger.release("a1")
    assert ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=limit).owner == "alice"


def test_resizes_never_count_as_another_slice(ledger):
    limit = budget(slices=1)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    assert ledger.resize("a1", memory_limit=2 * GIB, budget=limit).memory_limit == 2 * GIB


# -- memory -------------------------------------------------------------------------------------


def test_the_memory_budget_counts_all_the_owners_slices_together(ledger):
    limit = budget(memory=4 * GIB)
    ledger.admit("a1", SliceLimits(3 * GIB, 10), owner="alice", budget=limit)
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a2", SliceLimits(2 * GIB, 10), owner="alice", budget=limit)
    error = refused.value
    assert error.resource == "user_memory"
    assert (error.requested, error.available) == (2 * GIB, GIB)
    message = str(error)
    assert message.startswith(f"2GiB of GPU memory does not fit in {LABEL}: it allows 4GiB for all your slices")
    assert "your other slices hold 3GiB" in message
    assert "ask for at most 1GiB, or stop a kernel" in message
    # What the message says to ask for is admitted.
    assert ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=limit).memory_limit == GIB


def test_a_full_memory_budget_says_to_stop_a_kernel(ledger):
    limit = budget(memory=2 * GIB)
    ledger.admit("a1", SliceLimits(2 * GIB, 10), owner="alice", budget=limit)
    with pytest.raises(CapacityError, match="stop one of your kernels first") as refused:
        ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=limit)
    assert refused.value.available == 0
    assert "ask for at most" not in str(refused.value)


def test_a_first_slice_bigger_than_the_memory_budget_is_refused(ledger):
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a1", SliceLimits(5 * GIB, 10), owner="alice", budget=budget(memory=4 * GIB))
    assert refused.value.resource == "user_memory"
    assert "you hold no other slice" in str(refused.value)
    assert "ask for at most 4GiB" in str(refused.value)


def test_a_slice_that_fills_the_memory_budget_exactly_is_admitted(ledger):
    limit = budget(memory=4 * GIB)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    assert ledger.admit("a2", SliceLimits(3 * GIB, 10), owner="alice", budget=limit).memory_limit == 3 * GIB


# -- SM share -----------------------------------------------------------------------------------


def test_the_share_budget_bounds_the_sum_of_the_owners_shares(ledger):
    limit = budget(sm_share=50)
    # On both GPUs: the budget is the sum over the owner's slices, wherever they are.
    ledger.admit("a1", SliceLimits(GIB, 30), owner="alice", device=0, budget=limit)
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a2", SliceLimits(GIB, 30), owner="alice", device=1, budget=limit)
    error = refused.value
    assert error.resource == "user_sm_share"
    assert (error.requested, error.available) == (30, 20)
    message = str(error)
    assert message.startswith(f"an SM share of 30% does not fit in {LABEL}: it allows 50% for all your slices")
    assert "your other slices hold 30%" in message
    assert "ask for at most 20%, or stop a kernel" in message
    assert ledger.admit("a2", SliceLimits(GIB, 20), owner="alice", device=1, budget=limit).sm_share == 20


def test_burst_shares_count_against_the_share_budget_too(ledger):
    limit = budget(sm_share=40, policy="burst")
    ledger.admit("a1", SliceLimits(GIB, 40, "burst"), owner="alice", budget=limit)
    with pytest.raises(CapacityError, match="stop one of your kernels first") as refused:
        ledger.admit("a2", SliceLimits(GIB, 1, "burst"), owner="alice", budget=limit)
    assert refused.value.resource == "user_sm_share"
    assert refused.value.available == 0


def test_the_slices_budget_is_checked_before_memory_and_share(ledger):
    limit = budget(slices=1, memory=GIB, sm_share=10)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=limit)
    assert refused.value.resource == "user_slices"


# -- policy -------------------------------------------------------------------------------------


def test_a_burst_budget_refuses_hard_slices_and_says_to_ask_for_burst(ledger):
    limit = budget(policy="burst")
    with pytest.raises(SliceValueError) as refused:
        ledger.admit("a1", SliceLimits(GIB, 10, "hard"), owner="alice", budget=limit)
    assert LABEL in str(refused.value)
    assert "gives burst slices, not hard ones" in str(refused.value)
    assert "ask for policy burst" in str(refused.value)
    assert ledger.allocations() == []
    assert ledger.admit("a1", SliceLimits(GIB, 10, "burst"), owner="alice", budget=limit).policy == "burst"


def test_a_burst_budget_refuses_turning_a_burst_slice_hard(ledger):
    limit = budget(policy="burst")
    ledger.admit("a1", SliceLimits(GIB, 10, "burst"), owner="alice", budget=limit)
    with pytest.raises(SliceValueError, match="ask for policy burst"):
        ledger.resize("a1", policy="hard", budget=limit)
    assert ledger.get("a1").policy == "burst"


def test_a_hard_slice_admitted_under_a_hard_budget_may_stay_hard_under_a_burst_one(ledger):
    ledger.admit("a1", SliceLimits(2 * GIB, 20, "hard"), owner="alice", budget=budget(policy="hard"))
    burst = budget(policy="burst")
    # The budget changed (the user restarted with a burst size); the slice may still shrink, or
    # grow within the budget, without being made burst.
    assert ledger.resize("a1", memory_limit=GIB, budget=burst).policy == "hard"
    assert ledger.resize("a1", sm_share=30, budget=burst).sm_share == 30


def test_a_hard_budget_admits_both_policies(ledger):
    limit = budget(policy="hard")
    ledger.admit("a1", SliceLimits(GIB, 10, "hard"), owner="alice", budget=limit)
    ledger.admit("a2", SliceLimits(GIB, 10, "burst"), owner="alice", budget=limit)
    assert ledger.resize("a2", policy="hard", budget=limit).policy == "hard"


# -- resizes ------------------------------------------------------------------------------------


def test_a_resize_is_checked_against_the_budget_where_it_grows(ledger):
    limit = budget(memory=4 * GIB, sm_share=50)
    ledger.admit("a1", SliceLimits(GIB, 20), owner="alice", budget=limit)
    ledger.admit("a2", SliceLimits(2 * GIB, 20), owner="alice", budget=limit)
    with pytest.raises(CapacityError) as refused:
        ledger.resize("a1", memory_limit=3 * GIB, budget=limit)
    assert refused.value.resource == "user_memory"
    # Only the slice's own size is replaced: the other slice's 2GiB plus at most 2GiB.
    assert refused.value.available == 2 * GIB
    assert "your other slices hold 2GiB" in str(refused.value)
    with pytest.raises(CapacityError) as refused:
        ledger.resize("a1", sm_share=31, budget=limit)
    assert refused.value.resource == "user_sm_share"
    assert refused.value.available == 30
    assert ledger.get("a1").limits == SliceLimits(GIB, 20)
    assert ledger.resize("a1", memory_limit=2 * GIB, sm_share=30, budget=limit).limits == SliceLimits(2 * GIB, 30)


def test_a_shrink_is_always_allowed_also_under_a_lowered_budget(ledger):
    ledger.admit("a1", SliceLimits(4 * GIB, 40), owner="alice", budget=budget(memory=8 * GIB, sm_share=80))
    ledger.admit("a2", SliceLimits(4 * GIB, 40), owner="alice", budget=budget(memory=8 * GIB, sm_share=80))
    lowered = budget(memory=2 * GIB, sm_share=20, slices=1)
    # Over the lowered budget in memory, share and slices; shrinking is still taken.
    assert ledger.resize("a1", memory_limit=3 * GIB, budget=lowered).memory_limit == 3 * GIB
    assert ledger.resize("a1", sm_share=30, budget=lowered).sm_share == 30
    assert ledger.resize("a1", memory_limit=2 * GIB, sm_share=10, budget=lowered).limits == SliceLimits(2 * GIB, 10)
    # Changing nothing is no growth either.
    assert ledger.resize("a2", budget=lowered).limits == SliceLimits(4 * GIB, 40)
    # Growing one dimension is checked; the other, shrinking at the same time, is not.
    with pytest.raises(CapacityError) as refused:
        ledger.resize("a1", memory_limit=GIB, sm_share=11, budget=lowered)
    assert refused.value.resource == "user_sm_share"
    # A new slice is over every limit of the lowered budget; slices are checked first.
    with pytest.raises(CapacityError) as refused:
        ledger.admit("a3", SliceLimits(GIB, 1), owner="alice", budget=lowered)
    assert refused.value.resource == "user_slices"


def test_a_resize_without_a_budget_is_held_to_the_devices_only(ledger):
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=budget(memory=GIB, sm_share=10))
    assert ledger.resize("a1", memory_limit=8 * GIB, sm_share=90).limits == SliceLimits(8 * GIB, 90)


# -- owners -------------------------------------------------------------------------------------


def test_other_owners_slices_never_count_against_a_budget(ledger):
    for number in range(4):
        ledger.admit(f"b{number}", SliceLimits(4 * GIB, 40, "burst"), owner="bob")
    ledger.admit("unowned", SliceLimits(4 * GIB, 40, "burst"))
    limit = budget(memory=4 * GIB, sm_share=40, slices=1)
    alice = ledger.admit("a1", SliceLimits(4 * GIB, 40), owner="alice", budget=limit)
    assert alice.owner == "alice"
    assert ledger.resize("a1", memory_limit=3 * GIB, budget=limit).memory_limit == 3 * GIB
    assert ledger.resize("a1", memory_limit=4 * GIB, budget=limit).memory_limit == 4 * GIB
    # And alice's full budget does not stop bob (who has a budget of his own).
    ledger.admit("b4", SliceLimits(GIB, 10), owner="bob", budget=budget(memory=32 * GIB))


def test_a_budget_is_checked_against_the_owner_the_decision_names(ledger):
    limit = budget(memory=2 * GIB)
    ledger.admit("a1", SliceLimits(2 * GIB, 10), owner="alice", budget=limit)
    # The same budget object applied to another owner counts that owner's slices, not alice's.
    assert ledger.admit("c1", SliceLimits(2 * GIB, 10), owner="carol", budget=limit).owner == "carol"
    with pytest.raises(CapacityError) as refused:
        ledger.admit("c2", SliceLimits(GIB, 10), owner="carol", budget=limit)
    assert refused.value.resource == "user_memory"


def test_a_resize_counts_the_slices_owner_whatever_budget_is_given(ledger):
    ledger.admit("b1", SliceLimits(3 * GIB, 10), owner="bob")
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice")
    # alice's other slices: none; bob's 3GiB is not hers.
    assert ledger.resize("a1", memory_limit=4 * GIB, budget=budget(memory=4 * GIB)).memory_limit == 4 * GIB


def test_no_budget_means_no_limit_beyond_the_devices(ledger):
    for number in range(6):
        ledger.admit(f"a{number}", SliceLimits(4 * GIB, 30), owner="alice", budget=budget())
    assert len(ledger.allocations()) == 6


def test_a_refusal_by_the_budget_changes_nothing(ledger):
    limit = budget(memory=2 * GIB, sm_share=20, slices=2)
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=limit)
    before = (ledger.allocations(), ledger.devices_usage())
    for call in (
        lambda: ledger.admit("a2", SliceLimits(2 * GIB, 10), owner="alice", budget=limit),
        lambda: ledger.admit("a2", SliceLimits(GIB, 11), owner="alice", budget=limit),
        lambda: ledger.resize("a1", memory_limit=3 * GIB, budget=limit),
        lambda: ledger.resize("a1", sm_share=21, budget=limit),
    ):
        with pytest.raises(CapacityError):
            call()
    assert (ledger.allocations(), ledger.devices_usage()) == before


def test_the_budget_and_the_devices_are_both_checked(ledger_path, gpu):
    with EmbeddedLedger(ledger_path, [gpu(0, 4)]) as small:
        small.admit("b1", SliceLimits(3 * GIB, 10), owner="bob")
        # Within alice's budget, but the device has only 1GiB left.
        with pytest.raises(CapacityError) as refused:
            small.admit("a1", SliceLimits(2 * GIB, 10), owner="alice", budget=budget(memory=8 * GIB))
        assert refused.value.resource == "memory"


def test_the_default_label_names_the_budget_generically(ledger):
    ledger.admit("a1", SliceLimits(GIB, 10), owner="alice", budget=OwnerBudget(slices=1))
    with pytest.raises(CapacityError, match="^this budget allows 1 GPU slice"):
        ledger.admit("a2", SliceLimits(GIB, 10), owner="alice", budget=OwnerBudget(slices=1))
