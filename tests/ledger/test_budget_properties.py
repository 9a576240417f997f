"""The broker's decisions as a state machine (hypothesis): any interleaving of admissions (random
users, sizes, policies, devices), resizes, releases, budget changes and restarts never puts a
device over its capacity, nor a user over the budget that was in force when what they hold last
grew.

The decisions are the EmbeddedLedger's with ``budget=``, as the broker makes them (its gate
passes the caller's budget, read from the hub at each admission and growth); a restart closes the
ledger and opens the same file again, as a broker killed and started again by the hub does. A
model kept here predicts every decision (admitted or refused, and where a slice goes) and holds
what each user's slices may sum to; the invariants read the ledger's own ``allocations()`` and
``devices_usage()``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import astuple, dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support import ledger_slices

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, OwnerBudget
from jupyter_vgpu.ledger.embedded import PLACEMENTS
from jupyter_vgpu.model import FULL_SHARE, Device, SliceLimits, SliceValueError

GIB = 1 << 30
MIB = 1 << 20
DEVICES = [
    Device(f"GPU-prop0000-0000-4000-8000-00000000000{index}", index, "test GPU", 8 * GIB, 100) for index in (0, 1)
]
USERS = ("alice", "bob", "carol")
DIMENSIONS = ("memory", "sm_share", "slices")

memories = st.sampled_from([512 * MIB, GIB, 2 * GIB, 3 * GIB, 4 * GIB, 6 * GIB, 8 * GIB])
shares = st.sampled_from([5, 10, 25, 40, 50, 75, 100])
policies = st.sampled_from(["hard", "burst"])
budgets = st.one_of(
    st.none(),
    st.builds(
        OwnerBudget,
        memory=st.sampled_from([None, 2 * GIB, 4 * GIB, 8 * GIB, 12 * GIB]),
        sm_share=st.sampled_from([None, 20, 50, 100, 150]),
        slices=st.sampled_from([None, 1, 2, 3, 5]),
        policy=policies,
    ),
)


@dataclass(frozen=True)
class Held:
    """A slice as the model holds it."""

    owner: str
    device: str
    memory: int
    share: int
    policy: str


class BrokerDecisions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="vgpu-budget-props-"))
        self.path = self.folder / "ledger.sqlite"
        self.ledger: EmbeddedLedger | None = None
        self.model: dict[str, Held] = {}
        self.budgets: dict[str, OwnerBudget | None] = dict.fromkeys(USERS)
        # Per user and dimension: the budget's figure in force when that sum last grew (None: no limit).
        self.bounds: dict[str, dict[str, int | None]] = {user: dict.fromkeys(DIMENSIONS) for user in USERS}
        self.next_kernel = 0

    @initialize(oversubscription=st.sampled_from([1.0, 1.5, 2.0]), placement=st.sampled_from(PLACEMENTS))
    def open_ledger(self, oversubscription: float, placement: str) -> None:
        self.options = {"burst_oversubscription": oversubscription, "placement": placement}
        self.share_capacity = int(FULL_SHARE * oversubscription)
        self.placement = placement
        self.ledger = EmbeddedLedger(self.path, DEVICES, **self.options)

    def teardown(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- the model ------------------------------------------------------------------------------

    def device_sums(self, uuid: str, excluding: str | None = None) -> tuple[int, int, int]:
        """(memory, hard share, total share) the model's slices hold on a device."""
        held = [slice_ for kernel, slice_ in self.model.items() if slice_.device == uuid and kernel != excluding]
        return (
            sum(slice_.memory for slice_ in held),
            sum(slice_.share for slice_ in held if slice_.policy == "hard"),
            sum(slice_.share for slice_ in held),
        )

    def room(self, uuid: str, excluding: str | None = None) -> tuple[int, int, int]:
        """(memory free, share free for a hard slice, share free for a burst one) on a device."""
        memory, hard, total = self.device_sums(uuid, excluding)
        capacity = next(device.memory_total for device in DEVICES if device.uuid == uuid)
        total_free = self.share_capacity - total
        return capacity - memory, max(0, min(FULL_SHARE - hard, total_free)), max(0, total_free)

    def owned(self, owner: str, excluding: str | None = None) -> tuple[int, int, int]:
        held = [slice_ for kernel, slice_ in self.model.items() if slice_.owner == owner and kernel != excluding]
        return sum(slice_.memory for slice_ in held), sum(slice_.share for slice_ in held), len(held)

    def within_budget(
        self, budget: OwnerBudget | None, owned: tuple[int, int, int], wanted: Held, current: Held | None
    ) -> bool:
        if budget is None:
            return True
        memory, share, slices = owned
        if current is None and budget.slices is not None and slices >= budget.slices:
            return False
        if budget.policy == "burst" and wanted.policy == "hard" and (current is None or current.policy != "hard"):
            return False
        grows_memory = current is None or wanted.memory > current.memory
        if grows_memory and budget.memory is not None and memory + wanted.memory > budget.memory:
            return False
        grows_share = current is None or wanted.share > current.share
        return not (grows_share and budget.sm_share is not None and share + wanted.share > budget.sm_share)

    def fits(self, uuid: str, memory: int, share: int, policy: str, excluding: str | None = None) -> bool:
        memory_free, hard_free, burst_free = self.room(uuid, excluding)
        return memory_free >= memory and (hard_free if policy == "hard" else burst_free) >= share

    def grew(self, user: str, dimensions: tuple[str, ...]) -> None:
        budget = self.budgets[user]
        for dimension in dimensions:
            self.bounds[user][dimension] = None if budget is None else getattr(budget, dimension)

    # -- decisions ------------------------------------------------------------------------------

    @rule(
        user=st.sampled_from(USERS),
        memory=memories,
        share=shares,
        policy=policies,
        device=st.sampled_from([None, 0, 1, DEVICES[1].uuid]),
    )
    def admit(self, user: str, memory: int, share: int, policy: str, device: int | str | None) -> None:
        kernel_id = f"kernel-{self.next_kernel}"
        self.next_kernel += 1
        budget = self.budgets[user]
        candidates = [d for d in DEVICES if device is None or device in (d.index, d.uuid)]
        fitting = [d for d in candidates if self.fits(d.uuid, memory, share, policy)]
        wanted = Held(user, "", memory, share, policy)
        expected = self.within_budget(budget, self.owned(user), wanted, None) and bool(fitting)
        try:
            allocation = self.ledger.admit(
                kernel_id, SliceLimits(memory, share, policy), owner=user, device=device, budget=budget
            )
        except (CapacityError, SliceValueError) as error:
            assert not expected, f"refused what fits the devices and {user}'s budget {budget}: {error}"
            return
        assert expected, f"admitted {wanted} for {user} beyond the devices or the budget {budget}"
        sign = 1 if self.placement == "binpack" else -1
        chosen = min(fitting, key=lambda d: (sign * self.room(d.uuid)[0], d.index))
        assert allocation.device_uuid == chosen.uuid, (allocation, self.placement)
        assert (allocation.owner, allocation.memory_limit, allocation.sm_share, allocation.policy) == (
            user,
            memory,
            share,
            policy,
        )
        self.model[kernel_id] = Held(user, allocation.device_uuid, memory, share, policy)
        self.grew(user, DIMENSIONS)

    @precondition(lambda self: self.model)
    @rule(
        data=st.data(),
        memory=st.one_of(st.none(), memories),
        share=st.one_of(st.none(), shares),
        policy=st.one_of(st.none(), policies),
    )
    def resize(self, data, memory: int | None, share: int | None, policy: str | None) -> None:
        kernel_id = data.draw(st.sampled_from(sorted(self.model)), label="kernel")
        current = self.model[kernel_id]
        wanted = Held(
            current.owner,
            current.device,
            current.memory if memory is None else memory,
            current.share if share is None else share,
            current.policy if policy is None else policy,
        )
        budget = self.budgets[current.owner]
        grows_memory = wanted.memory > current.memory
        grows_hard = wanted.policy == "hard" and (current.policy != "hard" or wanted.share > current.share)
        grows_share = wanted.share > current.share
        fits = True
        if grows_memory or grows_hard or grows_share:
            memory_free, hard_free, burst_free = self.room(current.device, excluding=kernel_id)
            fits = not (grows_memory and wanted.memory > memory_free)
            most = hard_free if wanted.policy == "hard" else burst_free
            fits = fits and not ((grows_hard or grows_share) and wanted.share > most)
        owned = self.owned(current.owner, excluding=kernel_id)
        expected = fits and self.within_budget(budget, owned, wanted, current)
        try:
            allocation = self.ledger.resize(
                kernel_id, memory_limit=memory, sm_share=share, policy=policy, budget=budget
            )
        except (CapacityError, SliceValueError) as error:
            assert not expected, f"refused resizing {current} to {wanted} under {budget}: {error}"
            return
        assert expected, f"resized {current} to {wanted} beyond its device or the budget {budget}"
        assert (allocation.memory_limit, allocation.sm_share, allocation.policy) == (
            wanted.memory,
            wanted.share,
            wanted.policy,
        )
        assert allocation.device_uuid == current.device, "a resize moved the slice"
        self.model[kernel_id] = wanted
        self.grew(
            current.owner, tuple(name for name, grows in (("memory", grows_memory), ("sm_share", grows_share)) if grows)
        )

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def release(self, data) -> None:
        kernel_id = data.draw(st.sampled_from(sorted(self.model)), label="kernel")
        released = self.ledger.release(kernel_id)
        assert released is not None and released.owner == self.model.pop(kernel_id).owner

    @rule()
    def release_unknown(self) -> None:
        assert self.ledger.release("never-admitted") is None

    @rule(user=st.sampled_from(USERS), budget=budgets)
    def change_budget(self, user: str, budget: OwnerBudget | None) -> None:
        """The user restarts their server with another size (or the hub's groups change)."""
        if budget is not None:
            budget = OwnerBudget(
                memory=budget.memory,
                sm_share=budget.sm_share,
                slices=budget.slices,
                policy=budget.policy,
                label=f"{user}'s GPU size",
            )
        self.budgets[user] = budget

    @rule()
    def restart(self) -> None:
        """The broker is killed and started again: the same file, opened anew."""
        self.ledger.close()
        self.ledger = EmbeddedLedger(self.path, DEVICES, **self.options)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def ledger_holds_what_the_model_holds(self) -> None:
        if self.ledger is None:
            return
        held = ledger_slices(self.ledger, "owner", "device_uuid", "memory_limit", "sm_share", "policy")
        assert held == {kernel_id: astuple(slice_) for kernel_id, slice_ in self.model.items()}

    @invariant()
    def no_device_is_over_capacity(self) -> None:
        if self.ledger is None:
            return
        allocations = self.ledger.allocations()
        usages = {usage.device.uuid: usage for usage in self.ledger.devices_usage()}
        assert set(usages) == {device.uuid for device in DEVICES}
        for device in DEVICES:
            on_it = [allocation for allocation in allocations if allocation.device_uuid == device.uuid]
            memory = sum(allocation.memory_limit for allocation in on_it)
            hard = sum(allocation.sm_share for allocation in on_it if allocation.policy == "hard")
            total = sum(allocation.sm_share for allocation in on_it)
            assert memory <= device.memory_total, (device.index, memory)
            assert hard <= FULL_SHARE, (device.index, hard)
            assert total <= self.share_capacity, (device.index, total)
            usage = usages[device.uuid]
            assert (usage.memory_allocated, usage.hard_share, usage.total_share, usage.slices) == (
                memory,
                hard,
                total,
                len(on_it),
            )
            assert usage.memory_free == device.memory_total - memory
            assert usage.share_capacity == self.share_capacity

    @invariant()
    def no_user_is_over_the_budget_their_last_growth_was_decided_under(self) -> None:
        if self.ledger is None:
            return
        allocations = self.ledger.allocations()
        for user in USERS:
            mine = [allocation for allocation in allocations if allocation.owner == user]
            sums = {
                "memory": sum(allocation.memory_limit for allocation in mine),
                "sm_share": sum(allocation.sm_share for allocation in mine),
                "slices": len(mine),
            }
            for dimension, bound in self.bounds[user].items():
                assert bound is None or sums[dimension] <= bound, (user, dimension, sums[dimension], bound)


TestBrokerDecisions = BrokerDecisions.TestCase
TestBrokerDecisions.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
