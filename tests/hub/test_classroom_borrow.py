"""A classroom size's ``borrow:`` (issue 25, item 4): how far above its guarantee a size may
borrow, what it gives a user's budget and server, what the broker's gate makes of it, and what is
refused (naming the file, the key and what is accepted)."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from jupyter_vgpu.hub.broker import HubGate
from jupyter_vgpu.hub.classroom import (
    ENV_MAX_CORES,
    ENV_SERVER_MEMORY_LIMIT,
    ClassroomError,
    load_classroom,
    server_environment,
)
from jupyter_vgpu.ledger import OwnerBudget
from jupyter_vgpu.ledger.edge import Caller

GIB = 1 << 30
BASE = {
    "gpus": {"count": 1, "memory": "16GiB", "reserve": "1GiB"},
    "groups": {"students": ["alice", "bob"]},
    "sizes": [
        {"name": "small", "memory": "2GiB", "cores": 20, "default": True, "borrow": {"memory": "6GiB", "cores": 30}},
        {"name": "fixed", "memory": "2GiB", "cores": 20},
    ],
    "limits": {"groups": {"students": {"memory": "4GiB"}}},
}


def load(tmp_path, change=None):
    data = copy.deepcopy(BASE)
    if change is not None:
        change(data)
    path = tmp_path / "classroom.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_classroom(path)


def refused(tmp_path, borrow) -> str:
    def change(data):
        data["sizes"][0]["borrow"] = borrow

    with pytest.raises(ClassroomError) as caught:
        load(tmp_path, change)
    return str(caught.value)


def test_a_size_that_borrows_guarantees_its_memory_and_cores_and_allows_more_up_to_the_users_memory_limit(tmp_path):
    classroom = load(tmp_path)
    student = classroom.budget_for(None, ["students"])
    assert (student.memory, student.cores) == (2 * GIB, 20)
    # 2 GiB + 6 GiB borrowed, but no student holds more than the 4 GiB of limits.groups.students.memory.
    assert (student.max_memory, student.max_cores) == (4 * GIB, 50)
    outsider = classroom.budget_for(None, [])
    assert (outsider.max_memory, outsider.max_cores) == (8 * GIB, 50)
    fixed = classroom.budget_for({"profile": "fixed"}, [])
    assert (fixed.max_memory, fixed.max_cores) == (fixed.memory, fixed.cores) == (2 * GIB, 20)
    # The server checks its kernels against the most it may hold; the broker decides what is borrowed.
    environment = server_environment(classroom, None, [])
    assert (environment[ENV_SERVER_MEMORY_LIMIT], environment[ENV_MAX_CORES]) == ("8GiB", "50")


class StandInUsers:
    def __init__(self, options):
        self.options = options

    async def user(self, name):
        return {"name": name, "groups": [], "servers": {"": {"user_options": self.options}}}


@pytest.mark.parametrize(
    ("options", "budget"),
    [
        (
            {},
            OwnerBudget(
                memory=8 * GIB,
                sm_share=50,
                slices=None,
                policy="hard",
                label="bob's GPU size 'small'",
                guaranteed_memory=2 * GIB,
                guaranteed_sm_share=20,
            ),
        ),
        # A size that does not borrow guarantees all it allows: borrowers give it back (issue 34 item 4).
        (
            {"profile": "fixed"},
            OwnerBudget(
                memory=2 * GIB,
                sm_share=20,
                label="bob's GPU size 'fixed'",
                guaranteed_memory=2 * GIB,
                guaranteed_sm_share=20,
            ),
        ),
    ],
)
async def test_the_brokers_gate_allows_the_maximum_and_names_every_sizes_guarantee(tmp_path, options, budget):
    gate = HubGate(load(tmp_path), auth=None, users=StandInUsers(options))
    assert await gate.budget(Caller("bob")) == budget


@pytest.mark.parametrize(
    ("borrow", "message"),
    [
        ("4GiB", "sizes[0].borrow: must be a mapping like {memory: 4GiB, cores: 30}"),
        ({}, "sizes[0].borrow: must be a mapping like {memory: 4GiB, cores: 30}"),
        (
            {"max_memory": "4GiB"},
            "sizes[0].borrow.max_memory: unknown key (did you mean 'memory'?); accepted: memory, cores",
        ),
        ({"memory": "lots"}, "sizes[0].borrow.memory: "),
        (
            {"memory": "14GiB"},
            (
                "sizes[0].borrow.memory: 2GiB guaranteed and 14GiB borrowed make 16GiB, more than one GPU's 15GiB "
                "(gpus.memory less gpus.reserve); borrow at most 13GiB"
            ),
        ),
        (
            {"cores": 81},
            "sizes[0].borrow.cores: 20% guaranteed and 81% borrowed make 101%, more than one GPU's 100%; borrow at most 80",
        ),
        ({"cores": "many"}, "sizes[0].borrow.cores: must be a whole number from 0 to 100, not 'many'"),
    ],
)
def test_a_borrow_that_is_not_accepted_is_refused_saying_what_is(tmp_path, borrow, message):
    assert message in refused(tmp_path, borrow)
    assert re.match(r"^\S*classroom\.yaml: ", refused(tmp_path, borrow))
