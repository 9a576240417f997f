"""A suspended slice in the embedded ledger (issue 18): its memory and SM share are lent to other
admissions and resizes on its device, its claim and its owner's budget are kept, the state
survives a killed server, and a resume admits it on its device again or refuses while it does
not fit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_vgpu.ledger import CapacityError, EmbeddedLedger, OwnerBudget, UnknownSlice
from jupyter_vgpu.ledger.base import UnpromisedMemory
from jupyter_vgpu.model import Device, SliceLimits

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
GPU = Device("GPU-0", 0, "test", 16 * GIB, 100)


def test_a_suspended_slices_memory_and_share_are_lent_to_others_on_its_device(ledger_path):
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        ledger.admit("a", SliceLimits(12 * GIB, 60, "hard"))
        with pytest.raises(CapacityError):
            ledger.admit("b", SliceLimits(12 * GIB, 60, "hard"))
        suspended = ledger.suspend("a", host_memory=3 * GIB, details={"processes": [{"pid": 1}]})
        assert suspended.suspended and suspended.host_memory == 3 * GIB
        assert suspended.metadata["suspended"]["processes"] == [{"pid": 1}]
        usage = ledger.devices_usage()[0]
        assert (usage.memory_free, usage.hard_share, usage.slices) == (16 * GIB, 0, 0)
        ledger.admit("b", SliceLimits(12 * GIB, 60, "hard"))
        ledger.admit("c", SliceLimits(GIB, 10, "hard"))
        ledger.resize("c", memory_limit=4 * GIB, sm_share=40)
        # The claim is kept: the slice is still there, with its limits.
        assert ledger.get("a").limits == SliceLimits(12 * GIB, 60, "hard")


def test_resume_admits_it_again_only_where_it_fits(ledger_path):
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        ledger.admit("a", SliceLimits(12 * GIB, 30))
        ledger.suspend("a", host_memory=12 * GIB)
        ledger.admit("b", SliceLimits(8 * GIB, 30))
        with pytest.raises(CapacityError, match=r"cannot resume yet: its 12GiB slice needs 12GiB on GPU 0") as refused:
            ledger.resume("a")
        assert (refused.value.resource, refused.value.available) == ("memory", 8 * GIB)
        assert ledger.get("a").suspended  # still suspended, still lent
        ledger.release("b")
        resumed = ledger.resume("a")
        assert not resumed.suspended and resumed.host_memory == 0
        assert ledger.devices_usage()[0].memory_free == 4 * GIB
        with pytest.raises(CapacityError):
            ledger.admit("b", SliceLimits(8 * GIB, 30))
        assert ledger.resume("a") == resumed  # not suspended: nothing to do
        with pytest.raises(UnknownSlice):
            ledger.resume("nobody")
        with pytest.raises(UnknownSlice):
            ledger.suspend("nobody", host_memory=0)


def test_a_resume_needs_its_share_too(ledger_path):
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        ledger.admit("a", SliceLimits(GIB, 60, "hard"))
        ledger.suspend("a", host_memory=GIB)
        ledger.admit("b", SliceLimits(GIB, 50, "hard"))
        with pytest.raises(CapacityError, match="the other slices leave 50%") as refused:
            ledger.resume("a")
        assert refused.value.resource == "sm_share"


def test_an_owners_budget_still_counts_a_suspended_slice(ledger_path):
    budget = OwnerBudget(memory=8 * GIB, label="alice's size 'small'")
    with EmbeddedLedger(ledger_path, [GPU]) as ledger:
        ledger.admit("a1", SliceLimits(6 * GIB, 10, "burst"), owner="alice", budget=budget)
        ledger.suspend("a1", host_memory=6 * GIB)
        with pytest.raises(CapacityError) as refused:
            ledger.admit("a2", SliceLimits(4 * GIB, 10, "burst"), owner="alice", budget=budget)
        assert refused.value.resource == "user_memory"
        # Another owner may use the lent memory.
        ledger.admit("b1", SliceLimits(14 * GIB, 10, "burst"), owner="bob")


def test_memory_a_suspended_slice_still_holds_is_not_lent(ledger_path):
    """What the device reader sees a 'suspended' slice's processes hold is held beyond its
    promise, which is nothing while it is suspended: a server that said so before its processes
    gave the memory back cannot have it lent."""
    seen_caps = []

    def reader(allocations):
        seen_caps.append({a.kernel_id: a.memory_limit for a in allocations})
        # Slice a's processes still hold 12 GiB on the device (as holders/device_memory.py counts).
        caps = [a.memory_limit for a in allocations if a.kernel_id == "a"]
        return {GPU.uuid: UnpromisedMemory(over_cap=max(0, 12 * GIB - caps[0]) if caps else 0)}

    with EmbeddedLedger(ledger_path, [GPU], reader=reader) as ledger:
        ledger.admit("a", SliceLimits(12 * GIB, 30))
        ledger.suspend("a", host_memory=12 * GIB)
        with pytest.raises(CapacityError, match="held by slices over their caps"):
            ledger.admit("b", SliceLimits(12 * GIB, 30))
        assert seen_caps[-1] == {"a": 0}


def test_a_server_killed_while_a_slice_is_suspended_finds_it_suspended(ledger_path):
    code = (
        "import os, signal\n"
        "from jupyter_vgpu.ledger import EmbeddedLedger\n"
        "from jupyter_vgpu.model import Device, SliceLimits\n"
        f"ledger = EmbeddedLedger({str(ledger_path)!r}, [Device('GPU-0', 0, 'test', 16 << 30, 100)])\n"
        "ledger.admit('k1', SliceLimits(12 << 30, 40))\n"
        "ledger.suspend('k1', host_memory=5 << 30)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    killed = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    with EmbeddedLedger(ledger_path, [GPU]) as reopened:
        assert reopened.get("k1").suspended and reopened.get("k1").host_memory == 5 * GIB
        assert reopened.devices_usage()[0].memory_free == 16 * GIB
        assert not reopened.resume("k1").suspended
        assert reopened.devices_usage()[0].memory_free == 4 * GIB
