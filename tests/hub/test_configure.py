"""jupyter_vgpu.hub.configure(c, "classroom.yaml"): the hub configuration a classroom file makes,
merged with the hub's own, and the size choice it gives local spawners (JupyterHub's options
form, options_from_form and apply_user_options on a real LocalProcessSpawner)."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from pathlib import Path

import pytest
import yaml
from jupyterhub import orm, roles, scopes
from jupyterhub.app import JupyterHub
from jupyterhub.objects import Hub
from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from jupyterhub.utils import format_exception
from tornado import web
from traitlets.config import Config

import jupyter_vgpu.hub
from jupyter_vgpu.hub import ClassroomError, configure
from jupyter_vgpu.hub.classroom import DEFAULT_STATE_DIR, load_classroom, server_environment

CLASSROOM = {
    "gpus": {"count": 2, "memory": "16GiB"},
    "simulate": True,
    "groups": {"students": ["alice", "bob"], "staff": ["teacher"]},
    "admins": ["teacher"],
    "admin_groups": ["staff"],
    "sizes": [
        {
            "name": "small",
            "display_name": "Small <2 GiB> & 20%",
            "description": "<script>alert('x')</script> for exercises",
            "memory": "2GiB",
            "cores": 20,
            "policy": "burst",
            "groups": ["students", "staff"],
            "default": True,
            "kernel": {"memory": "1GiB", "cores": 10},
        },
        {"name": "large", "memory": "8GiB", "cores": 50, "groups": ["staff"]},
    ],
    "limits": {"kernels": 3, "groups": {"staff": {"kernels": 6}}},
}
VGPU_SCOPES = ["custom:vgpu:use!user", "access:services!service=vgpu"]
SERVER_ROLE_SCOPES = ["users:activity!user", "access:servers!server"]  # JupyterHub 6.1's server role


@pytest.fixture
def classroom_path(tmp_path) -> Path:
    path = tmp_path / "classroom.yaml"
    path.write_text(yaml.safe_dump(CLASSROOM, sort_keys=False))
    return path


def user(name: str, *groups: str) -> types.SimpleNamespace:
    """A stand-in for JupyterHub's User: a name and groups (objects with .name), as the spawner sees it."""
    return types.SimpleNamespace(
        name=name, escaped_name=name, url=f"/user/{name}/", groups=[types.SimpleNamespace(name=g) for g in groups]
    )


def spawner(c: Config, who, klass=LocalProcessSpawner, **kwargs):
    return klass(user=who, hub=Hub(), config=c, oauth_client_id="jupyterhub-user-test", **kwargs)


def test_a_fresh_config(classroom_path):
    c = Config()
    classroom = configure(c, classroom_path)
    assert classroom.path == classroom_path.resolve()

    (service,) = c.JupyterHub.services
    assert service["name"] == "vgpu"
    assert service["url"] == "http://127.0.0.1:10101"
    assert service["command"] == [sys.executable, "-m", "jupyter_vgpu", "broker", "--classroom", str(classroom.path)]
    assert service["display"] is False

    assert set(c.JupyterHub.custom_scopes) == {"custom:vgpu:use", "custom:vgpu:admin"}
    assert all(scope["description"] for scope in c.JupyterHub.custom_scopes.values())

    by_name = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert set(by_name) == {"vgpu-broker", "vgpu-admin"}
    assert by_name["vgpu-broker"]["services"] == ["vgpu"]
    assert set(by_name["vgpu-broker"]["scopes"]) == {"list:users", "read:users", "read:users:groups", "read:servers"}
    assert set(by_name["vgpu-admin"]["scopes"]) == {
        "custom:vgpu:admin",
        "access:services!service=vgpu",
        "read:services!service=vgpu",  # status --all finds the broker's URL from the hub
    }
    assert by_name["vgpu-admin"]["users"] == ["teacher"]
    assert by_name["vgpu-admin"]["groups"] == ["staff"]
    # Every user: through extra_user_scopes, which keeps JupyterHub's own user role ('self').
    assert set(c.JupyterHub.extra_user_scopes) == set(VGPU_SCOPES)

    assert c.JupyterHub.load_groups == {"students": {"users": ["alice", "bob"]}, "staff": {"users": ["teacher"]}}
    assert c.Spawner.server_token_scopes == SERVER_ROLE_SCOPES + VGPU_SCOPES
    assert callable(c.Spawner.options_form)
    assert callable(c.Spawner.options_from_form)
    assert callable(c.Spawner.apply_user_options)
    assert "profile_list" not in c.KubeSpawner


def test_server_token_default_is_jupyterhub_s_server_role():
    default = next(role for role in roles.get_default_roles() if role["name"] == "server")
    assert default["scopes"] == SERVER_ROLE_SCOPES


def test_merged_with_the_hub_s_own_config(classroom_path):
    c = Config()
    culler = {"name": "idle-culler", "command": ["cull"]}
    c.JupyterHub.services = [culler]
    c.JupyterHub.custom_scopes = {"custom:lab:read": {"description": "read"}}
    c.JupyterHub.load_roles = [
        {"name": "culler", "scopes": ["list:users"], "services": ["idle-culler"]},
        {"name": "vgpu-admin", "scopes": ["read:metrics"], "users": ["principal"]},
    ]
    c.JupyterHub.extra_user_scopes = {"read:hub"}
    c.JupyterHub.load_groups = {"students": ["carol"], "tas": {"users": ["dan"], "properties": {"k": "v"}}}
    c.Spawner.server_token_scopes = ["users:activity!user", "read:users:name!user"]

    configure(c, classroom_path)

    assert c.JupyterHub.services[0] == culler and c.JupyterHub.services[1]["name"] == "vgpu"
    assert set(c.JupyterHub.custom_scopes) == {"custom:lab:read", "custom:vgpu:use", "custom:vgpu:admin"}
    by_name = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert by_name["culler"] == {"name": "culler", "scopes": ["list:users"], "services": ["idle-culler"]}
    assert by_name["vgpu-admin"]["scopes"] == [
        "read:metrics",
        "custom:vgpu:admin",
        "access:services!service=vgpu",
        "read:services!service=vgpu",
    ]
    assert by_name["vgpu-admin"]["users"] == ["principal", "teacher"]
    assert set(c.JupyterHub.extra_user_scopes) == {"read:hub", *VGPU_SCOPES}
    assert c.JupyterHub.load_groups == {
        "students": {"users": ["carol", "alice", "bob"]},
        "tas": {"users": ["dan"], "properties": {"k": "v"}},
        "staff": {"users": ["teacher"]},
    }
    assert c.Spawner.server_token_scopes == ["users:activity!user", "read:users:name!user", *VGPU_SCOPES]


def test_lazy_values_the_hub_appended(classroom_path):
    c = Config()
    c.JupyterHub.services.append({"name": "other", "url": "http://127.0.0.1:1"})
    c.JupyterHub.load_roles.append({"name": "mine", "scopes": ["read:hub"]})
    configure(c, classroom_path)
    assert [service["name"] for service in c.JupyterHub.services] == ["other", "vgpu"]
    assert [role["name"] for role in c.JupyterHub.load_roles] == ["mine", "vgpu-broker", "vgpu-admin"]


def test_the_hub_s_own_user_role_is_extended(classroom_path):
    c = Config()
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "read:hub"]}]
    configure(c, classroom_path)
    user_role = next(role for role in c.JupyterHub.load_roles if role["name"] == "user")
    # JupyterHub ignores extra_user_scopes when load_roles defines the user role: extend that role.
    assert user_role["scopes"] == ["self", "read:hub", *VGPU_SCOPES]
    assert "extra_user_scopes" not in c.JupyterHub


def test_the_hub_s_server_role_is_the_token_default(classroom_path):
    c = Config()
    c.JupyterHub.load_roles = [{"name": "server", "scopes": ["users:activity!user", "read:users:name!user"]}]
    configure(c, classroom_path)
    assert c.Spawner.server_token_scopes == ["users:activity!user", "read:users:name!user", *VGPU_SCOPES]


def test_callable_server_token_scopes_are_extended(classroom_path):
    c = Config()
    c.Spawner.server_token_scopes = lambda spawner: ["users:activity!user", f"read:users!user={spawner.user.name}"]
    configure(c, classroom_path)
    scopes_of = c.Spawner.server_token_scopes
    got = asyncio.run(scopes_of(types.SimpleNamespace(user=user("alice"))))
    assert got == ["users:activity!user", "read:users!user=alice", *VGPU_SCOPES]


def test_configure_twice_replaces_its_own(classroom_path):
    c = Config()
    configure(c, classroom_path)
    configure(c, classroom_path)
    assert [service["name"] for service in c.JupyterHub.services] == ["vgpu"]
    assert [role["name"] for role in c.JupyterHub.load_roles] == ["vgpu-broker", "vgpu-admin"]
    assert c.Spawner.server_token_scopes == SERVER_ROLE_SCOPES + VGPU_SCOPES
    assert c.JupyterHub.load_groups["students"] == {"users": ["alice", "bob"]}


ONLY_SLICED = [
    "--KernelSpecManager.allowed_kernelspecs=python3-vgpu",
    "--MappingKernelManager.default_kernel_name=python3-vgpu",
]


def test_servers_offer_only_the_sliced_kernelspecs_unless_told_otherwise(classroom_path):
    """The unsliced "Python 3 (ipykernel)" would use the GPU outside the broker's accounting."""
    c = Config()
    c.Spawner.args = ["--allow-root"]
    configure(c, classroom_path)
    configure(c, classroom_path)  # again: its own arguments once
    assert c.Spawner.args == ["--allow-root", *ONLY_SLICED]

    c = Config()
    configure(c, classroom_path, kernelspecs=["pytorch-vgpu", "python3-vgpu"])
    assert c.Spawner.args == [
        "--KernelSpecManager.allowed_kernelspecs=pytorch-vgpu",
        "--KernelSpecManager.allowed_kernelspecs=python3-vgpu",
        "--MappingKernelManager.default_kernel_name=pytorch-vgpu",
    ]

    c = Config()
    configure(c, classroom_path, kernelspecs="python3-vgpu")  # one name, not its letters
    assert c.Spawner.args == ONLY_SLICED

    c = Config()
    configure(c, classroom_path, kernelspecs=None)  # the way out: every kernelspec, as installed
    assert "args" not in c.Spawner

    c = Config()
    configure(c, classroom_path, spawner="kubernetes")  # the pod's HAMi slice holds every kernel
    assert "args" not in c.Spawner

    c = Config()
    c.Spawner.args = ["--KernelSpecManager.allowed_kernelspecs=python3"]
    with pytest.raises(ClassroomError, match=r"sets --KernelSpecManager.allowed_kernelspecs=python3 already.*None"):
        configure(c, classroom_path)
    c = Config()
    with pytest.raises(ValueError, match=r"give kernelspec names, or None"):
        configure(c, classroom_path, kernelspecs=[])
    assert c == Config()  # refused before anything is set


def test_refuses_what_it_would_overwrite(classroom_path):
    c = Config()
    c.JupyterHub.services = [{"name": "vgpu", "url": "http://127.0.0.1:1"}]
    with pytest.raises(ClassroomError, match=r"broker\.name: the hub has a service named 'vgpu' already"):
        configure(c, classroom_path)

    c = Config()
    c.Spawner.options_form = "<input name='image'>"
    with pytest.raises(ClassroomError, match=r"c\.Spawner\.options_form is set already"):
        configure(c, classroom_path)

    c = Config()
    c.Spawner.apply_user_options = {"image": "image"}
    with pytest.raises(ClassroomError, match=r"c\.Spawner\.apply_user_options is a dict"):
        configure(c, classroom_path)


def test_groups_from_the_hub_s_load_groups_may_be_named(tmp_path):
    data = {**CLASSROOM, "admin_groups": ["tas"]}
    path = tmp_path / "classroom.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ClassroomError, match=r"admin_groups\[0\]: unknown group 'tas'"):
        configure(Config(), path)
    c = Config()
    c.JupyterHub.load_groups = {"tas": ["dan"]}
    assert configure(c, path).admin_groups == ("tas",)
    assert c.JupyterHub.load_groups["tas"] == {"users": ["dan"]}


def test_bad_file_is_refused_before_anything_is_set(tmp_path):
    path = tmp_path / "classroom.yaml"
    path.write_text("gpus: {count: 1, memory: 16GiB}\nsizes: [{name: x, memory: 40GiB, cores: 5}]\n")
    c = Config()
    with pytest.raises(ClassroomError, match=r"classroom\.yaml: sizes\[0\]\.memory: 40GiB is more than one GPU's"):
        configure(c, path)
    assert "services" not in c.JupyterHub and "options_form" not in c.Spawner


@pytest.mark.parametrize(
    ("spawner_class", "kind"),
    [
        ("kubespawner.KubeSpawner", "kubernetes"),
        ("kubespawner.spawner.KubeSpawner", "kubernetes"),
        ("simple", "local"),
        ("jupyterhub.spawner.LocalProcessSpawner", "local"),
        ("systemdspawner.SystemdSpawner", "local"),
        (LocalProcessSpawner, "local"),
    ],
)
def test_the_spawner_kind_is_detected(classroom_path, spawner_class, kind):
    c = Config()
    c.JupyterHub.spawner_class = spawner_class
    configure(c, classroom_path)
    assert ("profile_list" in c.KubeSpawner) == (kind == "kubernetes")
    assert ("services" in c.JupyterHub) == (kind == "local")
    assert ("options_form" in c.Spawner) == (kind == "local")


def test_kubespawner_class_object_is_detected(classroom_path):
    from kubespawner import KubeSpawner

    c = Config()
    c.JupyterHub.spawner_class = type("MySpawner", (KubeSpawner,), {})
    configure(c, classroom_path)
    assert callable(c.KubeSpawner.profile_list)
    # No broker under KubeSpawner (HAMi schedules), but the groups the profiles filter by.
    assert "services" not in c.JupyterHub and "load_roles" not in c.JupyterHub
    assert set(c.JupyterHub.load_groups) == {"students", "staff"}


def test_explicit_spawner_kind(classroom_path):
    c = Config()
    configure(c, classroom_path, spawner="kubernetes")
    assert callable(c.KubeSpawner.profile_list)
    with pytest.raises(ValueError, match="spawner='docker' is not one of 'local', 'kubernetes'"):
        configure(Config(), classroom_path, spawner="docker")


# The options form, options_from_form and apply_user_options on a real spawner


def test_options_form_lists_the_user_s_sizes_escaped(classroom_path):
    c = Config()
    configure(c, classroom_path)
    student = asyncio.run(spawner(c, user("alice", "students")).get_options_form())
    assert '<select class="form-select" id="vgpu-profile" name="profile">' in student
    assert '<option value="small" selected>Small &lt;2 GiB&gt; &amp; 20%</option>' in student
    assert 'value="large"' not in student
    assert "<script>" not in student and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; for exercises" in student

    teacher = asyncio.run(spawner(c, user("teacher", "staff")).get_options_form())
    assert '<option value="small" selected>' in teacher and '<option value="large">' in teacher

    # The size the user picked last time is preselected.
    again = spawner(c, user("teacher", "staff"))
    again.user_options = {"profile": "large"}
    assert '<option value="large" selected>' in asyncio.run(again.get_options_form())

    nobody = asyncio.run(spawner(c, user("guest")).get_options_form())
    assert "No GPU size is open to your groups" in nobody and "<select" not in nobody


def test_options_from_form(classroom_path):
    c = Config()
    configure(c, classroom_path)
    s = spawner(c, user("alice", "students"))
    assert s.run_options_from_form({"profile": ["small"]}) == {"profile": "small"}
    assert s.run_options_from_form({}) == {}
    assert s.run_options_from_form({"profile": ["a", "b"]}) == {}
    assert s.run_options_from_form({"profile": [" "]}) == {}


def test_apply_user_options_sets_the_server_environment(classroom_path):
    c = Config()
    c.Spawner.environment = {"KEEP": "me"}
    configure(c, classroom_path)
    s = spawner(c, user("teacher", "staff"), klass=SimpleLocalProcessSpawner)
    asyncio.run(s._run_apply_user_options({"profile": "large"}))
    # The variables of the large size for a member of staff, as tests/hub/test_classroom_file.py's
    # test_server_environment spells them out, and the spawner's own kept beside them.
    large = server_environment(load_classroom(classroom_path), {"profile": "large"}, ["staff"])
    assert large["JUPYTER_VGPU_SERVER_MEMORY_LIMIT"] == "8GiB"
    assert large["JUPYTER_VGPU_BROKER_LIMITS_DIR"] == str(classroom_path.parent / DEFAULT_STATE_DIR / "limits")
    assert s.environment == {"KEEP": "me", **large}
    # ...and they reach the single-user server's environment.
    env = s.get_env()
    assert env["JUPYTER_VGPU_SERVER_MEMORY_LIMIT"] == "8GiB" and env["KEEP"] == "me"

    # No options: the user's default size.
    asyncio.run(s._run_apply_user_options({}))
    assert s.environment["JUPYTER_VGPU_DEFAULT_MEMORY"] == "1GiB"
    assert s.environment["JUPYTER_VGPU_DEFAULT_POLICY"] == "burst"
    assert s.environment["JUPYTER_VGPU_SERVER_MEMORY_LIMIT"] == "2GiB"


def test_apply_user_options_drops_what_no_longer_applies(tmp_path):
    data = {
        **CLASSROOM,
        "simulate": False,
        "limits": {"groups": {"students": {"kernels": 2}, "staff": {"kernels": None}}},
    }
    path = tmp_path / "classroom.yaml"
    path.write_text(yaml.safe_dump(data))
    c = Config()
    configure(c, path)
    s = spawner(c, user("alice", "students"))
    asyncio.run(s._run_apply_user_options({}))
    assert s.environment["JUPYTER_VGPU_SERVER_SLICE_LIMIT"] == "2"
    assert "JUPYTER_VGPU_SIMULATE" not in s.environment and "VGPU_SIM_DEVICES" not in s.environment
    s.user.groups.append(types.SimpleNamespace(name="staff"))  # staff: no kernel limit
    asyncio.run(s._run_apply_user_options({}))
    assert "JUPYTER_VGPU_SERVER_SLICE_LIMIT" not in s.environment


def test_apply_user_options_refuses_a_size_not_for_the_user(classroom_path):
    c = Config()
    configure(c, classroom_path)
    s = spawner(c, user("alice", "students"))
    with pytest.raises(web.HTTPError) as caught:
        asyncio.run(s._run_apply_user_options({"profile": "large"}))
    assert caught.value.status_code == 400
    # The spawn page and the REST API show the message, not 'Invalid user options'.
    message, _ = format_exception(caught.value)
    assert message == ("GPU size 'large' is for groups staff, not for groups students; the sizes you may pick: small")
    assert "JUPYTER_VGPU_BROKER_URL" not in s.environment
    with pytest.raises(web.HTTPError, match="GPU size 'huge' does not exist"):
        asyncio.run(s._run_apply_user_options({"profile": "huge"}))


def test_the_hub_s_own_apply_user_options_runs_after(classroom_path):
    seen = []

    async def hub_apply(spawner, user_options):
        seen.append((spawner.environment.get("JUPYTER_VGPU_MAX_CORES"), dict(user_options)))

    c = Config()
    c.Spawner.apply_user_options = hub_apply
    configure(c, classroom_path)
    configure(c, classroom_path)  # again: the hub's hook still runs once
    s = spawner(c, user("alice", "students"))
    asyncio.run(s._run_apply_user_options({"profile": "small", "image": "x"}))
    assert seen == [("20", {"profile": "small", "image": "x"})]


# The configuration as JupyterHub itself loads it


def test_jupyterhub_loads_it_and_grants_the_scopes(classroom_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # JupyterHub may write files in its working directory
    c = Config()
    c.JupyterHub.db_url = "sqlite://"
    c.JupyterHub.cookie_secret = os.urandom(32)
    c.JupyterHub.authenticator_class = "dummy"
    c.JupyterHub.spawner_class = "simple"
    c.ConfigurableHTTPProxy.auth_token = "test-proxy-token"
    c.JupyterHub.load_roles = [{"name": "lab-admins", "scopes": ["admin:users"], "users": ["teacher"]}]
    configure(c, classroom_path)

    async def check():
        app = JupyterHub(config=c)
        await app.initialize([])
        db = app.db

        def scopes_of(thing):
            return roles.roles_to_scopes(roles.get_roles_for(thing))

        alice, teacher = orm.User.find(db, "alice"), orm.User.find(db, "teacher")
        assert [group.name for group in alice.groups] == ["students"]
        assert {"self", *VGPU_SCOPES} <= scopes_of(alice)
        assert "custom:vgpu:admin" not in scopes_of(alice)
        assert {"custom:vgpu:admin", "admin:users", *VGPU_SCOPES} <= scopes_of(teacher)
        broker = orm.Service.find(db, "vgpu")
        assert scopes_of(broker) == {"list:users", "read:users", "read:users:groups", "read:servers"}

        # What alice's server token gets: the requested scopes she holds (as User.spawn resolves them).
        requested = {
            scope + "=alice/" if scope.endswith("!server") else scope for scope in c.Spawner.server_token_scopes
        }
        client = db.query(orm.OAuthClient).filter_by(identifier="jupyterhub").one()
        granted, excluded = scopes._resolve_requested_scopes(
            requested, scopes_of(alice) | {"inherit"}, alice, client, db
        )
        assert set(VGPU_SCOPES) <= granted and not excluded
        db.close()

    asyncio.run(check())


def test_reexports():
    for name in ("Classroom", "Size", "Budget", "UserLimits", "IdlePolicy", "load_classroom", "profile_list"):
        assert hasattr(jupyter_vgpu.hub, name)
