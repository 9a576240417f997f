"""The classroom file: what it accepts, what it refuses (naming the file and the key), its
defaults, and the sizes, limits and budgets it gives users by their groups."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jupyter_vgpu.hub.classroom import (
    SERVER_ENVIRONMENT,
    Budget,
    ClassroomError,
    IdlePolicy,
    UserLimits,
    exact_size,
    load_classroom,
    server_environment,
)
from jupyter_vgpu.model import parse_size

GIB = 1 << 30
MIB = 1 << 20
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "classroom.example.yaml"

BASE = {
    "gpus": {"count": 2, "memory": "16GiB"},
    "groups": {"students": ["alice", "bob"], "staff": ["teacher"]},
    "admins": ["teacher"],
    "sizes": [
        {"name": "small", "memory": "2GiB", "cores": 20, "groups": ["students", "staff"], "default": True},
        {"name": "large", "memory": "8GiB", "cores": 50, "groups": ["staff"], "policy": "burst"},
    ],
    "limits": {"kernels": 3, "groups": {"staff": {"kernels": 6}}},
}


def write(tmp_path: Path, data: object, name: str = "classroom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def load(tmp_path: Path, change=None, **kwargs):
    data = copy.deepcopy(BASE)
    if change is not None:
        change(data)
    return load_classroom(write(tmp_path, data), **kwargs)


def refused(tmp_path: Path, change, **kwargs) -> str:
    with pytest.raises(ClassroomError) as caught:
        load(tmp_path, change, **kwargs)
    return str(caught.value)


def test_the_example_file_loads(tmp_path):
    classroom = load_classroom(EXAMPLE)
    assert classroom.path == EXAMPLE
    assert classroom.gpus.count == 2 and classroom.gpus.memory == 16 * GIB and classroom.gpus.sms == 100
    assert classroom.simulate is True
    assert classroom.broker_url == "http://127.0.0.1:10101/services/vgpu/"
    assert classroom.state_dir == EXAMPLE.parent / "vgpu-broker"
    assert [size.name for size in classroom.sizes] == ["small", "project", "large"]
    small = classroom.sizes[0]
    assert (small.memory, small.cores, small.policy, small.default) == (2 * GIB, 20, "burst", True)
    assert (small.kernel_memory, small.kernel_cores) == (GIB, 10)
    assert classroom.admins == ("teacher",)
    assert classroom.idle == IdlePolicy(
        lower_after=1200.0, floor_cores=5, cull_after=7200.0, suspend_after=3600.0, suspend_host_memory=64 * GIB
    )
    assert classroom.oversubscribe is False
    assert (classroom.gpus.reserve, classroom.gpus.burst_oversubscription, classroom.gpus.placement) == (
        512 * MIB,
        2.0,
        "binpack",
    )


def test_defaults_of_a_minimal_file(tmp_path):
    path = write(tmp_path, "gpus: {count: 1, memory: 16GiB}\nsizes:\n  - {name: only, memory: 2GiB, cores: 20}\n")
    classroom = load_classroom(path)
    assert classroom.service_name == "vgpu" and classroom.broker_port == 10101
    assert classroom.broker_url == "http://127.0.0.1:10101/services/vgpu/"
    assert classroom.state_dir == tmp_path.resolve() / "vgpu-broker"
    assert classroom.simulate is False and classroom.oversubscribe is False
    assert classroom.gpus.sms == 100
    # The ledger's defaults: no reserve, burst shares to 100% of a GPU, binpack.
    assert (classroom.gpus.reserve, classroom.gpus.burst_oversubscription, classroom.gpus.placement) == (
        0,
        1.0,
        "binpack",
    )
    assert (classroom.gpus.usable_memory, classroom.gpus.share_capacity) == (16 * GIB, 100)
    assert classroom.groups == {} and classroom.admins == () and classroom.admin_groups == ()
    assert classroom.idle == IdlePolicy(lower_after=None, floor_cores=5, cull_after=None)
    (size,) = classroom.sizes
    assert size.policy == "hard" and size.groups == () and size.default is False
    assert size.display_name == "Only: 2GiB, 20% of a GPU"
    assert "2GiB" in size.description and "20%" in size.description
    # No kernel limit: a kernel's default slice is the whole budget.
    assert (size.kernel_memory, size.kernel_cores) == (2 * GIB, 20)
    assert classroom.limits_for([]) == UserLimits(kernels=None, memory=None)
    # A user in no group may pick a size open to everyone.
    assert classroom.size_for(None, []) is size


def test_broker_settings_and_state_dir(tmp_path):
    classroom = load(tmp_path, lambda d: d.update(broker={"port": 9999, "name": "gpus", "state_dir": "state/b"}))
    assert classroom.broker_url == "http://127.0.0.1:9999/services/gpus/"
    assert classroom.state_dir == tmp_path.resolve() / "state" / "b"
    absolute = load(tmp_path, lambda d: d.update(broker={"state_dir": str(tmp_path / "elsewhere")}))
    assert absolute.state_dir == tmp_path / "elsewhere"


@pytest.mark.parametrize(
    ("given", "reserve", "burst", "placement"),
    [
        ({"reserve": "1GiB", "burst_oversubscription": 2.5, "placement": "spread"}, GIB, 2.5, "spread"),
        ({"reserve": 512, "burst_oversubscription": 3}, 512 * MIB, 3.0, "binpack"),
        ({"reserve": 0, "burst_oversubscription": 1.0, "placement": "binpack"}, 0, 1.0, "binpack"),
        ({"reserve": None, "burst_oversubscription": None, "placement": None}, 0, 1.0, "binpack"),
    ],
)
def test_gpu_sharing_settings(tmp_path, given, reserve, burst, placement):
    classroom = load(tmp_path, lambda d: d["gpus"].update(given))
    gpus = classroom.gpus
    assert (gpus.reserve, gpus.burst_oversubscription, gpus.placement) == (reserve, burst, placement)
    assert gpus.usable_memory == 16 * GIB - reserve
    assert gpus.share_capacity == int(100 * burst)


def test_durations(tmp_path):
    classroom = load(tmp_path, lambda d: d.update(idle={"lower_after": "90s", "cull_after": 3600, "floor_cores": 2}))
    assert classroom.idle == IdlePolicy(lower_after=90.0, floor_cores=2, cull_after=3600.0)
    assert load(tmp_path, lambda d: d.update(idle={"lower_after": "1.5h"})).idle.lower_after == 5400.0
    assert load(tmp_path, lambda d: d.update(idle={"cull_after": "2 m"})).idle.cull_after == 120.0


def test_suspend_settings(tmp_path):
    idle = {"lower_after": "5m", "suspend_after": "20m", "suspend_host_memory": "64GiB", "cull_after": "2h"}
    classroom = load(tmp_path, lambda d: d.update(idle=idle))
    assert classroom.idle == IdlePolicy(
        lower_after=300.0, floor_cores=5, cull_after=7200.0, suspend_after=1200.0, suspend_host_memory=64 * GIB
    )
    # Without a cap: the broker takes half the node's RAM; without cull_after: never culled.
    only = load(tmp_path, lambda d: d.update(idle={"suspend_after": 600})).idle
    assert (only.suspend_after, only.suspend_host_memory, only.cull_after) == (600.0, None, None)


def test_room_hold_reaches_the_broker_and_every_server(tmp_path):
    """idle.room_hold: how long a kernel that just got its room is left alone by room-making (the
    broker's and each server's, VGPUApp.room_hold); 0 turns the hold off; left out, the pool's default."""
    from jupyter_vgpu.server.app import VGPUApp, environment_variable

    assert load(tmp_path).idle.room_hold is None
    assert "JUPYTER_VGPU_ROOM_HOLD" not in server_environment(load(tmp_path), None, ["students"])
    for value, seconds in (("2m", 120.0), (0, 0.0), ("0s", 0.0)):
        classroom = load(tmp_path, lambda d, value=value: d.update(idle={"room_hold": value}))
        assert classroom.idle.room_hold == seconds
        environment = server_environment(classroom, None, ["students"])
        assert (
            VGPUApp.class_traits()["room_hold"].from_string(environment[environment_variable("room_hold")]) == seconds
        )
    assert "JUPYTER_VGPU_ROOM_HOLD" in SERVER_ENVIRONMENT


def setting(path: str, value):
    """A change that sets one dotted key (``sizes.1.memory``) of the base file."""

    def change(data):
        *parents, last = path.split(".")
        target = data
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return change


REFUSALS = [
    # unknown keys, with what is accepted
    (setting("sizez", []), "sizez: unknown key (did you mean 'sizes'?); accepted: gpus, simulate"),
    (setting("gpus.memroy", "1GiB"), "gpus.memroy: unknown key (did you mean 'memory'?); accepted: count, memory, sms"),
    (setting("sizes.0.memroy", "1GiB"), "sizes[0].memroy: unknown key (did you mean 'memory'?)"),
    (setting("sizes.0.kernel", {"cpus": 1}), "sizes[0].kernel.cpus: unknown key; accepted: memory, cores"),
    (setting("limits.group", {}), "limits.group: unknown key (did you mean 'groups'?)"),
    (setting("limits.groups.staff.kernel", 2), "limits.groups.staff.kernel: unknown key (did you mean 'kernels'?)"),
    (setting("idle.cull", "2h"), "idle.cull: unknown key (did you mean 'cull_after'?)"),
    (setting("broker.prot", 1), "broker.prot: unknown key (did you mean 'port'?)"),
    # unknown groups
    (setting("sizes.1.groups", ["staf"]), "sizes[1].groups[0]: unknown group 'staf'; groups are those under groups:"),
    (setting("limits.groups.tas", {"kernels": 2}), "limits.groups.tas: unknown group 'tas'"),
    (setting("admin_groups", ["teachers"]), "admin_groups[0]: unknown group 'teachers'"),
    # sizes
    (setting("sizes.1.memory", "40GiB"), "sizes[1].memory: 40GiB is more than one GPU's 16GiB (gpus.memory)"),
    (setting("sizes.1.memory", "lots"), "sizes[1].memory: memory size 'lots' is not a size like 512MiB, 4GiB"),
    (setting("sizes.0.cores", 120), "sizes[0].cores: SM share '120' is not a whole percentage from 1 to 100"),
    (setting("sizes.0.cores", 0), "sizes[0].cores: SM share '0' is not a whole percentage from 1 to 100"),
    (setting("sizes.0.policy", "soft"), "sizes[0].policy: policy 'soft' is not 'hard'"),
    (setting("sizes.0.name", "Small"), "sizes[0].name: 'Small' is not a size name: lowercase letters, digits and -"),
    (setting("sizes.1.name", "small"), "sizes[1].name: 'small' is also the name of sizes[0]; names must be unique"),
    (setting("sizes.1.default", True), "sizes[1].default: sizes[0] is the default already; at most one size is"),
    (setting("sizes.0.default", "yes"), "sizes[0].default: must be true or false, not 'yes'"),
    (setting("sizes.0.groups", "students"), "sizes[0].groups: must be a list of group names like [alice, bob]"),
    (
        setting("sizes.0.kernel", {"memory": "3GiB"}),
        "sizes[0].kernel.memory: a kernel's default 3GiB is more than the size's budget 2GiB (sizes[0].memory)",
    ),
    (
        setting("sizes.0.kernel", {"cores": 30}),
        "sizes[0].kernel.cores: a kernel's default 30% is more than the size's budget 20% (sizes[0].cores)",
    ),
    (setting("sizes", []), "sizes: must be a list of sizes"),
    (setting("sizes.0", "small"), "sizes[0]: must be a mapping with keys name, display_name"),
    (lambda d: d["sizes"][0].pop("cores"), "sizes[0].cores: missing; a size needs name, memory and cores"),
    (lambda d: d.pop("sizes"), "sizes: missing: list the GPU sizes users pick from"),
    # the node
    (lambda d: d.pop("gpus"), "gpus: missing: say what the node has"),
    (lambda d: d["gpus"].pop("memory"), "gpus.memory: missing"),
    (setting("gpus.count", 0), "gpus.count: must be a whole number from 1 to 64, not 0"),
    (setting("gpus.sms", "many"), "gpus.sms: must be a whole number from 1 to 1024, not 'many'"),
    (setting("gpus.reserve", "lots"), "gpus.reserve: memory size 'lots' is not a size like 512MiB, 4GiB"),
    (setting("gpus.reserve", -1), "gpus.reserve: memory size '-1' must be more than zero"),
    (
        setting("gpus.reserve", "16GiB"),
        "gpus.reserve: 16GiB kept free leaves nothing of a GPU's 16GiB (gpus.memory); reserve less than the memory, or 0",
    ),
    (
        setting("gpus.reserve", "10GiB"),
        "sizes[1].memory: 8GiB is more than one GPU's 6GiB (gpus.memory less gpus.reserve)",
    ),
    (
        setting("gpus.burst_oversubscription", 0.5),
        (
            "gpus.burst_oversubscription: must be a number of 1.0 or more (burst shares may add up to this many times "
            "100% of each GPU), not 0.5"
        ),
    ),
    (setting("gpus.burst_oversubscription", "2x"), "gpus.burst_oversubscription: must be a number of 1.0 or more"),
    (setting("gpus.burst_oversubscription", True), "gpus.burst_oversubscription: must be a number of 1.0 or more"),
    (setting("gpus.burst_oversubscription", float("inf")), "gpus.burst_oversubscription: must be a number of 1.0"),
    (setting("gpus.burst_oversubscription", float("nan")), "gpus.burst_oversubscription: must be a number of 1.0"),
    (
        setting("gpus.placement", "pack"),
        (
            "gpus.placement: must be binpack (a new slice on the fullest GPU it fits on) or spread (on the emptiest), "
            "not 'pack'"
        ),
    ),
    (
        setting("gpus.oversubscription", 2),
        (
            "gpus.oversubscription: unknown key (did you mean 'burst_oversubscription'?); accepted: count, memory, sms, "
            "reserve, burst_oversubscription, placement"
        ),
    ),
    # limits
    (
        setting("limits.memory", "4GiB"),
        "limits.memory: 4GiB is less than size 'large' (8GiB, sizes[1]) offered to group staff",
    ),
    (
        setting("limits.groups.students", {"memory": "1GiB"}),
        "limits.groups.students.memory: 1GiB is less than size 'small' (2GiB, sizes[0]) offered to group students",
    ),
    (setting("limits.kernels", 0), "limits.kernels: must be a whole number of 1 or more, not 0"),
    (setting("limits.kernels", True), "limits.kernels: must be a whole number of 1 or more, not True"),
    # the rest
    (setting("simulate", "yes"), "simulate: must be true or false"),
    (setting("broker.port", 70000), "broker.port: must be a whole number from 1 to 65535, not 70000"),
    (setting("broker.name", "v gpu"), "broker.name: 'v gpu' is not a service name"),
    (setting("groups.students", ["alice", 7]), "groups.students[1]: must be a user name, not 7 (quote it in YAML"),
    (setting("groups.students", ["alice", "alice"]), "groups.students[1]: 'alice' is listed twice"),
    (setting("admins", "teacher"), "admins: must be a list of user names like [alice, bob], not 'teacher'"),
    (setting("idle.lower_after", "soon"), "idle.lower_after: 'soon' is not a duration like 90s, 20m, 2h"),
    (setting("idle.cull_after", 0), "idle.cull_after: '0' must be more than zero"),
    (setting("idle.floor_cores", 200), "idle.floor_cores: SM share '200' is not a whole percentage from 1 to 100"),
    (setting("idle.suspend_after", "later"), "idle.suspend_after: 'later' is not a duration like 90s, 20m, 2h"),
    (setting("idle.suspend", "20m"), "idle.suspend: unknown key (did you mean 'suspend_after'?)"),
    (
        setting("idle", {"suspend_after": "2h", "cull_after": "1h"}),
        (
            "idle.suspend_after: 7200 s is not less than idle.cull_after (3600 s): a kernel is suspended before it is "
            "stopped"
        ),
    ),
    (
        setting("idle", {"suspend_after": "20m", "suspend_host_memory": "lots"}),
        "idle.suspend_host_memory: memory size 'lots' is not a size like 512MiB, 4GiB",
    ),
    (
        setting("idle", {"suspend_host_memory": "64GiB"}),
        (
            "idle.suspend_host_memory: caps the host memory of suspended kernels, but no kernel is suspended without "
            "idle.suspend_after"
        ),
    ),
]


@pytest.mark.parametrize(("change", "message"), REFUSALS, ids=[message.split(":")[0] for _, message in REFUSALS])
def test_refused_with_the_file_and_the_key(tmp_path, change, message):
    text = refused(tmp_path, change)
    assert text.startswith(f"{tmp_path / 'classroom.yaml'}: "), text
    assert message in text, text


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    """One refusal lists every problem of the file's entries, in the file's order, each with its
    key, so a teacher fixes them in one go (the checks across entries follow once they are right)."""

    def change(data):
        data["gpus"]["count"] = 0
        data["gpus"]["memroy"] = "1GiB"
        data["broker"] = {"port": 70000}
        data["groups"]["students"] = ["alice", "alice"]
        data["sizes"][0]["cores"] = 120
        data["sizes"][1]["memory"] = "40GiB"
        data["sizes"][1]["groups"] = ["staf"]
        data["idle"] = {"lower_after": "soon", "cull": "2h"}

    with pytest.raises(ClassroomError) as caught:
        load(tmp_path, change)
    assert caught.value.problems == (
        (
            "gpus.memroy: unknown key (did you mean 'memory'?); accepted: count, memory, sms, reserve, "
            "burst_oversubscription, placement"
        ),
        "gpus.count: must be a whole number from 1 to 64, not 0",
        "broker.port: must be a whole number from 1 to 65535, not 70000",
        "groups.students[1]: 'alice' is listed twice",
        "sizes[0].cores: SM share '120' is not a whole percentage from 1 to 100",
        "sizes[1].memory: 40GiB is more than one GPU's 16GiB (gpus.memory)",
        "sizes[1].groups[0]: unknown group 'staf'; groups are those under groups: or the hub's (staff, students)",
        (
            "idle.cull: unknown key (did you mean 'cull_after'?); accepted: lower_after, floor_cores, suspend_after, "
            "suspend_host_memory, cull_after, room_hold"
        ),
        "idle.lower_after: 'soon' is not a duration like 90s, 20m, 2h or a bare number of seconds",
    )
    listed = "".join(f"\n  - {problem}" for problem in caught.value.problems)
    assert str(caught.value) == f"{tmp_path / 'classroom.yaml'}: 9 problems:{listed}"


def test_one_problem_reads_as_one_sentence(tmp_path):
    with pytest.raises(ClassroomError) as caught:
        load(tmp_path, setting("sizes.0.cores", 120))
    assert caught.value.problems == ("sizes[0].cores: SM share '120' is not a whole percentage from 1 to 100",)
    assert str(caught.value) == f"{tmp_path / 'classroom.yaml'}: {caught.value.problems[0]}"


def test_a_hub_started_with_a_bad_file_says_every_problem_where_its_output_starts(tmp_path):
    """JupyterHub reports an error of its config file as an empty log line and a traceback whose
    last line is the error: the refusal is logged first, as its own line on the hub's log."""
    write(tmp_path, {**BASE, "gpus": {"count": 0, "memory": "16GiB"}, "idle": {"cull_after": "soon"}})
    (tmp_path / "jupyterhub_config.py").write_text(
        "import jupyter_vgpu.hub\njupyter_vgpu.hub.configure(c, 'classroom.yaml')\n"
    )
    hub = subprocess.run(
        [str(Path(sys.executable).with_name("jupyterhub")), "-f", "jupyterhub_config.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert hub.returncode != 0
    # The hub's first log record (a record's lines after its first are indented), before its traceback.
    first, *rest = re.split(r"\n(?=\[)", hub.stderr, maxsplit=1)[0].splitlines()
    assert re.match(r"\[E [\d-]+ [\d:.]+ JupyterHub ", first), hub.stderr
    assert first.endswith("jupyter-vgpu: the hub cannot start with this classroom file: classroom.yaml: 2 problems:")
    assert "Traceback" in hub.stderr.split(first, 1)[1]
    assert [line.strip() for line in rest] == [
        "- gpus.count: must be a whole number from 1 to 64, not 0",
        "- idle.cull_after: 'soon' is not a duration like 90s, 20m, 2h or a bare number of seconds",
    ]


def test_the_message_names_the_file_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, {"gpus": {"count": 1, "memory": "16GiB"}, "sizes": [{"name": "x", "memory": "40GiB", "cores": 5}]})
    with pytest.raises(
        ClassroomError, match=r"^classroom\.yaml: sizes\[0\]\.memory: 40GiB is more than one GPU's 16GiB"
    ):
        load_classroom("classroom.yaml")


def test_refused_files_that_are_no_classroom(tmp_path):
    for text, message in [
        ("", "the file is empty; it needs at least gpus: and sizes:"),
        ("gpus: [1, 2\n", "not valid YAML (line 2, column 1)"),
        ("- a list\n", "must be a mapping with keys gpus, simulate"),
    ]:
        with pytest.raises(ClassroomError, match="^" + re.escape(str(tmp_path / "classroom.yaml"))) as caught:
            load_classroom(write(tmp_path, text))
        assert message in str(caught.value)
    with pytest.raises(ClassroomError, match=r"missing\.yaml: cannot read the classroom file"):
        load_classroom(tmp_path / "missing.yaml")


def test_groups_the_hub_defines_may_be_named(tmp_path):
    def change(data):
        data["sizes"][1]["groups"] = ["tas"]
        data["admin_groups"] = ["tas"]

    assert "unknown group 'tas'" in refused(tmp_path, change)
    classroom = load(tmp_path, change, hub_groups=["tas"])
    assert classroom.sizes_for(["tas"])[-1].name == "large"
    assert classroom.admin_groups == ("tas",)
    # hub_groups=None: the hub's groups are not known here (the broker), references are taken.
    assert load(tmp_path, change, hub_groups=None).admin_groups == ("tas",)


def test_oversubscription_says_the_totals(tmp_path):
    def crowd(data):
        data["groups"]["students"] = [f"student{i}" for i in range(16)]  # 16 x 2GiB + teacher 2GiB = 34GiB

    message = refused(tmp_path, crowd)
    assert message.startswith(f"{tmp_path / 'classroom.yaml'}: oversubscribe: "), message
    assert "the default budgets of the 17 users under groups: need 34GiB and 340% of a GPU's SMs together" in message
    assert "more than the node's 2 GPUs have (32GiB, 200%)" in message
    assert "oversubscribe: true" in message

    def cores_only(data):
        data["groups"]["students"] = [f"student{i}" for i in range(10)]  # 11 x 20% = 220% > 200%, 22GiB fits

    assert "need 22GiB and 220%" in refused(tmp_path, cores_only)

    def allowed(data):
        crowd(data)
        data["oversubscribe"] = True

    assert load(tmp_path, allowed).oversubscribe is True
    # Exactly full fits: 9 students and the teacher need 20GiB and 200%.
    assert (
        len(load(tmp_path, lambda d: d["groups"].update(students=[f"s{i}" for i in range(9)])).groups["students"]) == 9
    )


def burst_class(students: int, **gpus):
    """A change: ``students`` students (and the teacher) whose default size is a burst 2GiB 20%."""

    def change(data):
        data["groups"]["students"] = [f"student{i}" for i in range(students)]
        data["sizes"][0]["policy"] = "burst"
        data["gpus"].update(gpus)

    return change


def test_burst_oversubscription_in_the_fit_check(tmp_path):
    # 11 x 20% burst = 220% > 200% on 2 GPUs without oversubscription.
    message = refused(tmp_path, burst_class(10))
    assert message.startswith(f"{tmp_path / 'classroom.yaml'}: oversubscribe: "), message
    assert "need 22GiB and 220% of a GPU's SMs together (burst), more than the node's 2 GPUs have (32GiB, 200%)" in (
        message
    )
    assert "raise gpus.burst_oversubscription, or set oversubscribe: true" in message
    # burst_oversubscription 1.5: burst shares up to 300% on the node; 220% fits, 15 x 20% = 300% fits exactly.
    assert load(tmp_path, burst_class(10, burst_oversubscription=1.5)).gpus.burst_oversubscription == 1.5
    assert len(load(tmp_path, burst_class(14, burst_oversubscription=1.5)).groups["students"]) == 14
    message = refused(tmp_path, burst_class(15, burst_oversubscription=1.5))
    assert "need 32GiB and 320% of a GPU's SMs together (burst)" in message
    assert "(32GiB, 200% hard, 300% hard and burst with gpus.burst_oversubscription 1.5)" in message
    # Memory is not oversubscribed: 17 x 2GiB = 34GiB > 32GiB whatever the burst shares may do.
    message = refused(tmp_path, burst_class(16, burst_oversubscription=4))
    assert "need 34GiB and 340%" in message and "(32GiB, 200% hard, 800% hard and burst" in message
    assert "raise gpus.burst_oversubscription" not in message


def test_hard_shares_are_not_oversubscribed(tmp_path):
    # The students' default is hard (20% each): 11 x 20% = 220% > 200% whatever burst_oversubscription says.
    def hard_class(data):
        data["groups"]["students"] = [f"student{i}" for i in range(10)]
        data["gpus"]["burst_oversubscription"] = 4

    message = refused(tmp_path, hard_class)
    assert "need 22GiB and 220% of a GPU's SMs together, more than the node's 2 GPUs have (32GiB, 200% hard" in message
    assert "raise gpus.burst_oversubscription" not in message

    # Hard and burst together count against the oversubscribed capacity: the staff's burst size.
    def mixed(data):
        data["groups"]["students"] = [f"student{i}" for i in range(9)]  # 9 x 20% hard = 180%
        data["groups"]["staff"] = ["teacher", "ta"]
        data["sizes"][1]["default"] = True  # staff's default: large, 8GiB 50% burst
        data["sizes"][0]["default"] = False
        data["sizes"][0]["groups"] = ["students"]
        data["gpus"]["burst_oversubscription"] = 1.2  # 240% on the node

    message = refused(tmp_path, mixed)
    assert "need 34GiB and 280% of a GPU's SMs together (180% hard, 100% burst)" in message


def test_reserve_in_the_fit_check(tmp_path):
    # 15 students and the teacher: 16 x 2GiB = 32GiB, the node's whole memory; fits without a reserve.
    crowd = burst_class(15, burst_oversubscription=2)
    assert load(tmp_path, crowd).gpus.reserve == 0

    def reserved(data):
        crowd(data)
        data["gpus"]["reserve"] = "1GiB"

    message = refused(tmp_path, reserved)
    assert "need 32GiB and 320% of a GPU's SMs together (burst), more than the node's 2 GPUs have (30GiB after " in (
        message
    )
    assert "gpus.reserve, 200% hard, 400% hard and burst with gpus.burst_oversubscription 2)" in message


def test_a_member_counted_once_and_with_their_own_default(tmp_path):
    def change(data):
        data["groups"]["students"] = ["alice", "teacher"]  # teacher in both groups: counted once
        data["sizes"][0]["groups"] = ["students"]
        data["sizes"][1]["default"] = True
        data["sizes"][0]["default"] = False
        data["gpus"] = {"count": 1, "memory": "16GiB"}

    # alice: small (her only size) 2GiB 20%; teacher: large (the default, open to staff) 8GiB 50%.
    classroom = load(tmp_path, change)
    assert classroom.budget_for(None, ["students", "staff"]).size_name == "large"
    message = refused(tmp_path, lambda d: (change(d), d["groups"].update(staff=["teacher", "t2"])))
    assert "the 3 users under groups: need 18GiB and 120%" in message


def test_kernel_default_divides_the_budget_by_the_kernel_limit(tmp_path):
    def change(data):
        data["sizes"][0]["memory"] = "2GiB"
        data["sizes"][0]["cores"] = 2
        data["limits"] = {"kernels": 3, "groups": {"staff": {"kernels": 6}}}

    classroom = load(tmp_path, change)
    small, large = classroom.sizes
    # small is open to students (3 kernels) and staff (6): the size's own default is for the
    # strictest of them; 2GiB / 3 = 682.67MiB floored to whole MiB, 2% / 3 floored but at least 1.
    assert (small.kernel_memory, small.kernel_cores) == (682 * MIB, 1)
    # Each user's default divides by their own limit.
    student = classroom.budget_for(None, ["students"])
    assert (student.kernel_memory, student.kernel_cores, student.kernels) == (682 * MIB, 1, 3)
    teacher = classroom.budget_for(None, ["staff"])
    assert (teacher.kernel_memory, teacher.kernel_cores, teacher.kernels) == (341 * MIB, 1, 6)
    # large is for staff only: 8GiB / 6, 50% / 6.
    assert (large.kernel_memory, large.kernel_cores) == (1365 * MIB, 8)


def test_kernel_default_given_in_the_file_is_everyone_s(tmp_path):
    classroom = load(tmp_path, setting("sizes.0.kernel", {"memory": "1GiB", "cores": 10}))
    small = classroom.sizes[0]
    assert (small.kernel_memory, small.kernel_cores) == (GIB, 10)
    for groups in (["students"], ["staff"]):
        budget = classroom.budget_for(None, groups)
        assert (budget.kernel_memory, budget.kernel_cores) == (GIB, 10)
    # Half given: the other half divides.
    half = load(tmp_path, setting("sizes.0.kernel", {"cores": 10})).budget_for(None, ["staff"])
    assert (half.kernel_memory, half.kernel_cores) == (341 * MIB, 10)


def test_sizes_and_limits_by_groups(tmp_path):
    classroom = load(tmp_path)
    small, large = classroom.sizes
    assert classroom.sizes_for(["students"]) == [small]
    assert classroom.sizes_for(["staff"]) == [small, large]
    assert classroom.sizes_for(["students", "staff"]) == [small, large]
    assert classroom.sizes_for("staff") == [small, large]  # one group's name is one group
    assert classroom.sizes_for([]) == []
    assert classroom.sizes_for(["visitors"]) == []

    assert classroom.limits_for([]) == UserLimits(kernels=3, memory=None)
    assert classroom.limits_for(["students"]) == UserLimits(kernels=3, memory=None)
    assert classroom.limits_for(["staff"]) == UserLimits(kernels=6, memory=None)
    assert classroom.limits_for(["students", "staff"]) == UserLimits(kernels=6, memory=None)


def test_most_generous_limits_of_several_groups(tmp_path):
    def change(data):
        data["groups"]["tas"] = ["carol"]
        data["limits"] = {
            "kernels": 4,
            "memory": "8GiB",
            "groups": {"students": {"kernels": 2}, "staff": {"memory": "12GiB"}, "tas": {"kernels": None}},
        }

    classroom = load(tmp_path, change)
    assert classroom.limits_for(["students"]) == UserLimits(kernels=2, memory=8 * GIB)
    # a group's entry leaves out what it does not set: staff keeps the file's 4 kernels
    assert classroom.limits_for(["staff"]) == UserLimits(kernels=4, memory=12 * GIB)
    assert classroom.limits_for(["students", "staff"]) == UserLimits(kernels=4, memory=12 * GIB)
    # an explicit null is no limit, the most generous of all
    assert classroom.limits_for(["students", "tas"]) == UserLimits(kernels=None, memory=8 * GIB)
    # groups without an entry of their own do not count
    assert classroom.limits_for(["students", "visitors"]) == UserLimits(kernels=2, memory=8 * GIB)


def test_size_for_the_chosen_or_default_size(tmp_path):
    classroom = load(tmp_path)
    small, large = classroom.sizes
    assert classroom.size_for(None, ["students"]) is small
    assert classroom.size_for({}, ["staff"]) is small
    assert classroom.size_for({"profile": ""}, ["staff"]) is small
    assert classroom.size_for({"profile": "large"}, ["staff"]) is large
    assert classroom.size_for({"profile": ["large"]}, ["staff"]) is large  # a form's list
    assert classroom.size_for({"profile": "large", "other": 1}, ["students", "staff"]) is large

    with pytest.raises(ClassroomError, match=r"'large' is for groups staff, not for groups students; .*pick: small$"):
        classroom.size_for({"profile": "large"}, ["students"])
    with pytest.raises(ClassroomError, match=r"GPU size 'huge' does not exist; the sizes you may pick: small, large"):
        classroom.size_for({"profile": "huge"}, ["staff"])
    with pytest.raises(ClassroomError, match=r"must be a size's name, not 3"):
        classroom.size_for({"profile": 3}, ["staff"])
    with pytest.raises(ClassroomError, match=r"no GPU size is open to a user in no group"):
        classroom.size_for(None, [])
    with pytest.raises(ClassroomError, match=r"no GPU size is open to groups visitors; .*small \(students, staff\)"):
        classroom.size_for(None, ["visitors"])


def test_default_size_not_open_to_the_user_is_their_first_size(tmp_path):
    def change(data):
        data["sizes"][0]["default"] = False
        data["sizes"][1]["default"] = True

    classroom = load(tmp_path, change)
    assert classroom.size_for(None, ["students"]).name == "small"
    assert classroom.size_for(None, ["staff"]).name == "large"
    # no default at all: the first size the user may pick
    assert load(tmp_path, setting("sizes.0.default", False)).size_for(None, ["staff"]).name == "small"


def test_budget_for(tmp_path):
    classroom = load(tmp_path)
    assert classroom.budget_for(None, ["students"]) == Budget(
        size_name="small", memory=2 * GIB, cores=20, policy="hard", kernels=3, kernel_memory=682 * MIB, kernel_cores=6
    )
    large = classroom.budget_for({"profile": "large"}, ["staff"])
    assert (large.size_name, large.memory, large.cores, large.policy, large.kernels) == (
        "large",
        8 * GIB,
        50,
        "burst",
        6,
    )
    with pytest.raises(ClassroomError):
        classroom.budget_for({"profile": "large"}, ["students"])


def test_budget_memory_is_capped_by_the_user_s_memory_limit(tmp_path):
    def change(data):
        data["groups"]["guests"] = ["gina"]
        data["sizes"].append({"name": "open", "memory": "8GiB", "cores": 10})
        # A user in no group with limits of its own: 4GiB. Refused: 'open' is offered to everyone.
        data["limits"]["memory"] = "4GiB"

    assert "limits.memory: 4GiB is less than size 'large'" in refused(tmp_path, change)

    def capped(data):
        change(data)
        data["limits"]["groups"]["staff"]["memory"] = "8GiB"
        data["limits"]["groups"]["students"] = {"memory": "8GiB"}
        data["limits"]["groups"]["guests"] = {"memory": "8GiB"}

    # Every group is covered, but the limits of a user in no group are 4GiB: still refused.
    assert "limits.memory: 4GiB is less than size 'open' (8GiB, sizes[2]) offered to every user" in refused(
        tmp_path, capped
    )


def node(tmp_path: Path, gpus: str) -> Path:
    return write(tmp_path, f"gpus: {gpus}\nsizes:\n  - {{name: tiny, memory: 16MiB, cores: 5}}\n")


def test_simulated_devices_spec(tmp_path):
    classroom = load_classroom(node(tmp_path, "{count: 2, memory: 1.5GiB, sms: 80}"))
    assert classroom.simulated_devices == (
        "name=jupyter-vgpu simulated GPU,memory=1536MiB,sms=80;name=jupyter-vgpu simulated GPU,memory=1536MiB,sms=80"
    )
    odd = load_classroom(node(tmp_path, "{count: 1, memory: 16777217B}"))
    assert odd.simulated_devices == "name=jupyter-vgpu simulated GPU,memory=16777217B,sms=100"


def test_simulated_devices_spec_is_what_the_simulator_reads(tmp_path):
    """The spec goes to native/sim's parser as it is: it must make the node the file describes."""
    classroom = load_classroom(node(tmp_path, "{count: 2, memory: 1.5GiB, sms: 80}"))
    program = (
        "import json\n"
        "from jupyter_vgpu.model import list_devices, use_simulator\n"
        "use_simulator()\n"
        "print(json.dumps([[d.memory_total, d.sm_count] for d in list_devices()]))\n"
    )
    environment = {
        **os.environ,
        "VGPU_SIM_DEVICES": classroom.simulated_devices,
        "VGPU_SIM_STATE": str(tmp_path / "sim.state"),
    }
    result = subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [[1536 * MIB, 80], [1536 * MIB, 80]]


def test_server_environment(tmp_path):
    classroom = load(tmp_path, lambda d: d.update(simulate=True))
    assert server_environment(classroom, {"profile": "large"}, ["staff"]) == {
        "JUPYTER_VGPU_BROKER_URL": "http://127.0.0.1:10101/services/vgpu/",
        # the broker's limits pages, beside its ledger in the classroom's state folder
        "JUPYTER_VGPU_BROKER_LIMITS_DIR": str(classroom.state_dir / "limits"),
        "JUPYTER_VGPU_DEFAULT_MEMORY": "1365MiB",
        "JUPYTER_VGPU_DEFAULT_CORES": "8",
        "JUPYTER_VGPU_DEFAULT_POLICY": "burst",
        "JUPYTER_VGPU_SERVER_MEMORY_LIMIT": "8GiB",
        "JUPYTER_VGPU_SERVER_SLICE_LIMIT": "6",
        "JUPYTER_VGPU_MAX_CORES": "50",
        "JUPYTER_VGPU_SIMULATE": "1",
        # the broker's simulated devices: a slice it places on GPU 1 finds a GPU 1 in its kernel
        "VGPU_SIM_DEVICES": "name=jupyter-vgpu simulated GPU,memory=16384MiB,sms=100;"
        "name=jupyter-vgpu simulated GPU,memory=16384MiB,sms=100",
    }
    plain = load(tmp_path, lambda d: d.pop("limits"))
    environment = server_environment(plain, None, ["students"], broker=False)
    assert "JUPYTER_VGPU_SERVER_SLICE_LIMIT" not in environment  # no limit
    assert "JUPYTER_VGPU_SIMULATE" not in environment and "VGPU_SIM_DEVICES" not in environment
    assert "JUPYTER_VGPU_BROKER_URL" not in environment and "JUPYTER_VGPU_BROKER_LIMITS_DIR" not in environment
    assert environment["JUPYTER_VGPU_DEFAULT_MEMORY"] == "2GiB"
    with pytest.raises(ClassroomError):
        server_environment(classroom, {"profile": "large"}, ["students"])


def test_server_environment_carries_the_idle_policy(tmp_path):
    from jupyter_vgpu.server.app import VGPUApp, environment_variable

    idle = {"lower_after": "20m", "floor_cores": 3, "cull_after": "2h"}
    environment = server_environment(load(tmp_path, lambda d: d.update(idle=idle)), None, ["students"])
    assert {name: value for name, value in environment.items() if "IDLE" in name} == {
        "JUPYTER_VGPU_IDLE_LOWER_AFTER": "1200.0",
        "JUPYTER_VGPU_IDLE_FLOOR_CORES": "3",
        "JUPYTER_VGPU_IDLE_CULL_AFTER": "7200.0",
    }
    # Each is the variable of the server's trait, in a form the trait reads back.
    traits = VGPUApp.class_traits()
    for trait, expected in (("idle_lower_after", 1200.0), ("idle_floor_cores", 3), ("idle_cull_after", 7200.0)):
        assert traits[trait].from_string(environment[environment_variable(trait)]) == expected
    only_cull = server_environment(load(tmp_path, lambda d: d.update(idle={"cull_after": 90})), None, ["students"])
    assert {name for name in only_cull if "IDLE" in name} == {"JUPYTER_VGPU_IDLE_CULL_AFTER"}
    suspending = {"suspend_after": "20m", "suspend_host_memory": "48GiB", "cull_after": "2h"}
    environment = server_environment(load(tmp_path, lambda d: d.update(idle=suspending)), None, ["students"])
    assert (environment["JUPYTER_VGPU_IDLE_SUSPEND_AFTER"], environment["JUPYTER_VGPU_SUSPEND_HOST_MEMORY"]) == (
        "1200.0",
        "48GiB",
    )
    for trait, expected in (("idle_suspend_after", 1200.0), ("suspend_host_memory", "48GiB")):
        assert traits[trait].from_string(environment[environment_variable(trait)]) == expected
    # No idle policy: none of them; a later start takes away those an earlier one set.
    assert not {
        name for name in server_environment(load(tmp_path), None, ["students"]) if "IDLE" in name or "SUSPEND" in name
    }
    assert {
        "JUPYTER_VGPU_IDLE_LOWER_AFTER",
        "JUPYTER_VGPU_IDLE_FLOOR_CORES",
        "JUPYTER_VGPU_IDLE_CULL_AFTER",
        "JUPYTER_VGPU_IDLE_SUSPEND_AFTER",
        "JUPYTER_VGPU_SUSPEND_HOST_MEMORY",
    } <= set(SERVER_ENVIRONMENT)


@pytest.mark.parametrize("size", [GIB, 1536 * MIB, 682 * MIB, int(1.25 * GIB), 1342177281, 5 * GIB // 3])
def test_sizes_in_the_environment_read_back_exactly(size):
    assert parse_size(exact_size(size)) == size
