"""The classroom's sizes as KubeSpawner profiles: HAMi's resources and the JUPYTER_VGPU_*
variables, filtered by the user's groups, loaded by a real KubeSpawner (its own validation and
override merging) into the pod it would create."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path

import kubespawner.spawner
import pytest
import yaml
from kubespawner import KubeSpawner
from traitlets.config import Config

from jupyter_vgpu.hub import configure, load_classroom, profile_list

CLASSROOM = {
    "gpus": {"count": 2, "memory": "16GiB"},
    "groups": {"students": ["alice", "bob"], "staff": ["teacher"]},
    "sizes": [
        {
            "name": "small",
            "display_name": "Small <2 GiB>",
            "description": "for <b>exercises</b> & more",
            "memory": "1.5GiB",
            "cores": 20,
            "policy": "burst",
            "groups": ["students", "staff"],
            "kernel": {"memory": "512MiB", "cores": 10},
        },
        {"name": "medium", "memory": "4GiB", "cores": 30, "groups": ["students", "staff"], "default": True},
        {"name": "large", "memory": "8GiB", "cores": 50, "groups": ["staff"]},
    ],
    "limits": {"kernels": 3, "groups": {"staff": {"kernels": None}}},
}


@pytest.fixture
def classroom(tmp_path):
    path = tmp_path / "classroom.yaml"
    path.write_text(yaml.safe_dump(CLASSROOM, sort_keys=False))
    return load_classroom(path)


@pytest.fixture
def no_cluster(monkeypatch):
    """KubeSpawner(_mock=True) still loads a kube config at construction; there is no cluster here
    and nothing in these tests calls one."""
    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kwargs: None)


def user(name: str, *groups: str) -> types.SimpleNamespace:
    """A stand-in for JupyterHub's User as KubeSpawner sees it (groups are objects with .name)."""
    return types.SimpleNamespace(
        name=name, id=1, url=f"/user/{name}/", escaped_name=name, groups=[types.SimpleNamespace(name=g) for g in groups]
    )


def test_profiles_for_a_student(classroom):
    profiles = profile_list(classroom, ["students"])
    assert json.loads(json.dumps(profiles)) == profiles  # JSON as it is
    assert [profile["slug"] for profile in profiles] == ["small", "medium"]
    assert [profile["default"] for profile in profiles] == [False, True]
    small, medium = profiles
    assert small["display_name"] == "Small &lt;2 GiB&gt;"  # KubeSpawner's form does not escape
    assert small["description"] == "for &lt;b&gt;exercises&lt;/b&gt; &amp; more"
    assert small["kubespawner_override"] == {
        "extra_resource_limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1536", "nvidia.com/gpucores": "20"},
        "environment": {
            "JUPYTER_VGPU_SERVER_SLICE_LIMIT": "3",
            "JUPYTER_VGPU_DEFAULT_MEMORY": "512MiB",
            "JUPYTER_VGPU_DEFAULT_CORES": "10",
            "JUPYTER_VGPU_DEFAULT_POLICY": "burst",
            "JUPYTER_VGPU_SERVER_MEMORY_LIMIT": "1.5GiB",
            "JUPYTER_VGPU_MAX_CORES": "20",
            "GPU_CORE_UTILIZATION_POLICY": None,  # burst: no HAMi force (None removes a stale one)
        },
    }
    environment = medium["kubespawner_override"]["environment"]
    assert environment["GPU_CORE_UTILIZATION_POLICY"] == "force"  # hard: HAMi caps even a lone pod
    assert environment["JUPYTER_VGPU_DEFAULT_MEMORY"] == "1365MiB"  # 4GiB / 3 kernels
    assert "JUPYTER_VGPU_BROKER_URL" not in environment  # no broker under KubeSpawner
    assert "JUPYTER_VGPU_SIMULATE" not in environment


def test_profiles_for_staff_and_for_nobody(classroom):
    profiles = profile_list(classroom, ["staff"])
    assert [profile["slug"] for profile in profiles] == ["small", "medium", "large"]
    large = profiles[2]["kubespawner_override"]
    assert large["extra_resource_limits"]["nvidia.com/gpumem"] == "8192"
    assert large["extra_resource_limits"]["nvidia.com/gpucores"] == "50"
    # Staff have no kernel limit: the variable is taken away, a kernel's default is the budget.
    assert large["environment"]["JUPYTER_VGPU_SERVER_SLICE_LIMIT"] is None
    assert large["environment"]["JUPYTER_VGPU_DEFAULT_MEMORY"] == "8GiB"
    assert profile_list(classroom, "staff") == profiles  # a group's name is one group
    assert profile_list(classroom, ["visitors"]) == []


def test_every_size_without_groups(classroom):
    profiles = profile_list(classroom)
    assert [profile["slug"] for profile in profiles] == ["small", "medium", "large"]
    assert [profile["default"] for profile in profiles] == [False, True, False]
    # A static list cannot tell users apart: each profile holds for its strictest picker
    # (medium is for students, 3 kernels, and staff, none: 3).
    medium = profiles[1]["kubespawner_override"]["environment"]
    assert medium["JUPYTER_VGPU_SERVER_SLICE_LIMIT"] == "3"
    assert medium["JUPYTER_VGPU_DEFAULT_MEMORY"] == "1365MiB"
    large = profiles[2]["kubespawner_override"]["environment"]
    assert large["JUPYTER_VGPU_SERVER_SLICE_LIMIT"] is None


def test_memory_is_floored_to_hami_s_mib(tmp_path):
    path = tmp_path / "classroom.yaml"
    path.write_text("gpus: {count: 1, memory: 16GiB}\nsizes: [{name: odd, memory: 1000.5MiB, cores: 7}]\n")
    (profile,) = profile_list(load_classroom(path), [])
    assert profile["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpumem"] == "1000"
    assert profile["default"] is True  # the only size
    # The server's budget is what HAMi grants the pod.
    assert profile["kubespawner_override"]["environment"]["JUPYTER_VGPU_SERVER_MEMORY_LIMIT"] == "1000MiB"
    assert profile["kubespawner_override"]["environment"]["JUPYTER_VGPU_DEFAULT_MEMORY"] == "1000MiB"


async def loaded(spawner: KubeSpawner, options: dict) -> KubeSpawner:
    spawner.user_options = options
    await spawner.load_user_options()
    return spawner


@pytest.mark.parametrize(("who", "groups"), [("alice", ["students"]), ("teacher", ["staff"])])
def test_every_profile_loads_in_kubespawner(classroom, no_cluster, who, groups):
    c = Config()
    configure(c, classroom.path, spawner="kubernetes")

    async def check():
        for profile in profile_list(classroom, groups):
            override = profile["kubespawner_override"]
            spawner = KubeSpawner(_mock=True, config=c, user=user(who, *groups))
            await loaded(spawner, {"profile": profile["slug"]})
            assert spawner.extra_resource_limits == override["extra_resource_limits"]
            wanted = {name: value for name, value in override["environment"].items() if value is not None}
            assert spawner.environment == wanted
            pod = await spawner.get_pod_manifest()
            (container,) = pod.spec.containers
            assert container.resources.limits == override["extra_resource_limits"]
            env = {variable.name: variable.value for variable in container.env}
            assert {name: env[name] for name in wanted} == wanted

    asyncio.run(check())


def test_no_choice_is_the_user_s_default(classroom, no_cluster):
    async def check():
        spawner = KubeSpawner(_mock=True, profile_list=_profiles(classroom), user=user("alice", "students"))
        await loaded(spawner, {})
        assert spawner.extra_resource_limits["nvidia.com/gpumem"] == "4096"  # medium, the default

    asyncio.run(check())


def test_kubespawner_refuses_a_profile_not_for_the_user(classroom, no_cluster):
    async def check():
        spawner = KubeSpawner(_mock=True, profile_list=_profiles(classroom), user=user("alice", "students"))
        with pytest.raises(ValueError, match=r"No such profile: large\. Options include: small, medium"):
            await loaded(spawner, {"profile": "large"})
        assert spawner.extra_resource_limits == {}

    asyncio.run(check())


def test_a_later_start_takes_away_what_no_longer_applies(classroom, no_cluster):
    async def check():
        spawner = KubeSpawner(_mock=True, profile_list=_profiles(classroom), user=user("bob", "students"))
        await loaded(spawner, {"profile": "medium"})
        assert spawner.environment["GPU_CORE_UTILIZATION_POLICY"] == "force"
        await loaded(spawner, {"profile": "small"})  # burst: no force
        assert "GPU_CORE_UTILIZATION_POLICY" not in spawner.environment
        spawner.user.groups.append(types.SimpleNamespace(name="staff"))  # no kernel limit now
        await loaded(spawner, {"profile": "small"})
        assert "JUPYTER_VGPU_SERVER_SLICE_LIMIT" not in spawner.environment

    asyncio.run(check())


def test_kubespawner_s_form_shows_the_user_s_profiles_escaped(classroom, no_cluster):
    async def check():
        spawner = KubeSpawner(_mock=True, profile_list=_profiles(classroom), user=user("alice", "students"))
        form = await spawner.get_options_form()
        assert 'value="small"' in form and 'value="medium"' in form and 'value="large"' not in form
        assert "Small &lt;2 GiB&gt;" in form and "<b>exercises</b>" not in form

    asyncio.run(check())


def _profiles(classroom):
    c = Config()
    configure(c, classroom.path, spawner="kubernetes")
    return c.KubeSpawner.profile_list


def test_the_example_file_s_profiles():
    example = Path(__file__).resolve().parents[2] / "docs" / "classroom.example.yaml"
    profiles = profile_list(load_classroom(example))
    assert [profile["slug"] for profile in profiles] == ["small", "project", "large"]
    assert all(
        profile["kubespawner_override"]["extra_resource_limits"]["nvidia.com/gpu"] == "1" for profile in profiles
    )
