"""JupyterHub integration: one classroom file, one call in ``jupyterhub_config.py``::

    import jupyter_vgpu.hub
    jupyter_vgpu.hub.configure(c, "classroom.yaml")

With a local spawner (the default: LocalProcessSpawner, SimpleLocalProcessSpawner,
SystemdSpawner) the hub runs the node's broker as a managed service that owns the node's ledger,
every single-user server uses it with its own hub token, and users pick a size on JupyterHub's
own options form. With KubeSpawner each size is a profile asking HAMi for the pod's slice (see
:mod:`jupyter_vgpu.hub.profiles`); there is no broker.
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from inspect import isawaitable
from pathlib import Path
from typing import Any, TypeVar

from traitlets.config import Config
from traitlets.config.loader import LazyConfigValue
from traitlets.log import get_logger

from jupyter_vgpu.hub.classroom import (
    Budget,
    Classroom,
    ClassroomError,
    Gpus,
    IdlePolicy,
    Size,
    UserLimits,
    load_classroom,
    server_environment,
)
from jupyter_vgpu.hub.options import apply_user_options, options_form, options_from_form
from jupyter_vgpu.hub.profiles import kubespawner_profile_list, profile_list

__all__ = [
    "ADMIN_ROLE",
    "ADMIN_SCOPE",
    "BROKER_ROLE",
    "BROKER_SCOPES",
    "USE_SCOPE",
    "Budget",
    "Classroom",
    "ClassroomError",
    "Gpus",
    "IdlePolicy",
    "Size",
    "UserLimits",
    "configure",
    "load_classroom",
    "profile_list",
    "server_environment",
]

USE_SCOPE = "custom:vgpu:use"
ADMIN_SCOPE = "custom:vgpu:admin"
CUSTOM_SCOPES = {
    USE_SCOPE: {
        "description": "Hold GPU slices through the node's vGPU broker, within the size picked at server start.",
    },
    ADMIN_SCOPE: {
        "description": "See and resize every user's GPU slices on the node's vGPU broker.",
    },
}
BROKER_ROLE = "vgpu-broker"
ADMIN_ROLE = "vgpu-admin"
# What the broker reads of the hub: users (list:users), their groups (read:users:groups, part of
# read:users) to find their sizes and limits, and their servers with the user_options each was
# started with (read:servers).
BROKER_SCOPES = ["list:users", "read:users", "read:users:groups", "read:servers"]
LOCAL = "local"
KUBERNETES = "kubernetes"
# The kernelspec jupyter-vgpu installs (kernels/python3-vgpu): what students may start by default.
SLICED_KERNELSPECS = ("python3-vgpu",)
# The single-user server's options that hide every other kernelspec, the unsliced "Python 3
# (ipykernel)" included, and make the first allowed one the default (the launcher's and
# POST /api/sessions' without a name).
_ALLOWED_ARG = "--KernelSpecManager.allowed_kernelspecs="
_DEFAULT_ARG = "--MappingKernelManager.default_kernel_name="


def configure(
    c: Config,
    path: str | Path,
    *,
    spawner: str | None = None,
    kernelspecs: Iterable[str] | None = SLICED_KERNELSPECS,
) -> Classroom:
    """Configure a JupyterHub from a classroom file; returns the loaded :class:`Classroom`.

    Merges with what ``c`` has already (services, roles, groups, scopes are added to, never
    replaced), so call it anywhere in ``jupyterhub_config.py``. ``spawner`` is ``"local"`` or
    ``"kubernetes"``; by default KubeSpawner when ``c.JupyterHub.spawner_class`` names it, else
    local. A bad file raises :class:`ClassroomError` naming the file and, for every problem, the
    key; the same sentences are logged first on the hub's log, where the hub's output starts,
    since JupyterHub shows the error itself only as the last line of a traceback.

    Local spawners get: the broker service, the ``custom:vgpu:use`` and ``custom:vgpu:admin``
    scopes, the broker's role, ``custom:vgpu:use!user`` and access to the broker for every user
    (``c.JupyterHub.extra_user_scopes``, or the hub's own ``user`` role where ``load_roles``
    defines one), the ``vgpu-admin`` role for ``admins`` and ``admin_groups``, the same two scopes
    on every server's token, the options form with ``apply_user_options``, and single-user
    servers that offer only the ``kernelspecs`` named (by default the sliced ``python3-vgpu``; the
    first is the default kernel): a kernel of the unsliced "Python 3 (ipykernel)" would use the GPU
    outside the broker's accounting. ``kernelspecs=None`` leaves the servers' kernelspecs as they
    are. KubeSpawner gets ``profile_list`` (its pod's slice holds every kernel of the pod). Both
    get ``load_groups``.
    """
    try:
        return _configure(c, path, spawner, kernelspecs)
    except ClassroomError as refused:
        # The hub logs an empty line and a traceback, this sentence its very last line: say it first.
        get_logger().error("jupyter-vgpu: the hub cannot start with this classroom file: %s", refused)
        raise


def _configure(c: Config, path: str | Path, spawner: str | None, kernelspecs: Iterable[str] | None) -> Classroom:
    """:func:`configure`, its refusals raised."""
    # Checked at run time: a hub's config file is not type-checked (a bare "python3-vgpu" would
    # otherwise be taken letter by letter).
    offered = None if kernelspecs is None else [kernelspecs] if isinstance(kernelspecs, str) else list(kernelspecs)
    names_given = offered and all(isinstance(name, str) for name in offered) and all(offered)
    if offered is not None and not names_given:
        raise ValueError(f"kernelspecs={kernelspecs!r}: give kernelspec names, or None to keep every kernelspec")
    hub_groups = _current(c.JupyterHub, "load_groups", {})
    classroom = load_classroom(path, hub_groups=list(hub_groups))
    kind = _spawner_kind(c, spawner)
    c.JupyterHub.load_groups = _merge_groups(hub_groups, classroom.groups)
    if kind == KUBERNETES:
        _configure_kubespawner(c, classroom)
    else:
        _configure_local(c, classroom)
        if offered is not None:
            c.Spawner.args = _kernelspec_args(classroom, _current(c.Spawner, "args", []), offered)
    return classroom


def _current(section: Config, key: str, initial: Any) -> Any:
    """A copy of a config value as set so far (``initial`` when unset; a lazy value such as
    ``c.JupyterHub.services.append(...)`` applied to ``initial``)."""
    if key not in section:
        return copy.deepcopy(initial)
    value = section[key]
    if isinstance(value, LazyConfigValue):
        return value.get_value(copy.deepcopy(initial))
    return copy.deepcopy(value)


def _spawner_kind(c: Config, spawner: str | None) -> str:
    if spawner is not None:
        if spawner not in (LOCAL, KUBERNETES):
            raise ValueError(f"spawner={spawner!r} is not one of {LOCAL!r}, {KUBERNETES!r}")
        return spawner
    spawner_class = c.JupyterHub.get("spawner_class")
    if spawner_class is None:
        return LOCAL
    if isinstance(spawner_class, str):
        names = [spawner_class]
    else:
        names = [f"{klass.__module__}.{klass.__qualname__}" for klass in getattr(spawner_class, "__mro__", ())]
    return KUBERNETES if any("kubespawner" in name.lower() for name in names) else LOCAL


def _merge_groups(hub_groups: dict[str, Any], groups: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """The hub's groups with the classroom's members added (either form of ``load_groups``)."""
    merged: dict[str, Any] = {}
    for name, spec in hub_groups.items():
        merged[name] = {"users": list(spec)} if isinstance(spec, list) else dict(spec)
    for name, members in groups.items():
        spec = merged.setdefault(name, {})
        users = list(spec.get("users", []))
        spec["users"] = users + [member for member in members if member not in users]
    return merged


def _configure_kubespawner(c: Config, classroom: Classroom) -> None:
    existing = _current(c.KubeSpawner, "profile_list", None)
    if existing and not _is_marked(existing):
        raise ClassroomError(
            f"{classroom.path}: c.KubeSpawner.profile_list is set already; the classroom file makes the "
            "profiles (its sizes): keep one or the other"
        )
    c.KubeSpawner.profile_list = _mark(kubespawner_profile_list(classroom))


def _configure_local(c: Config, classroom: Classroom) -> None:
    name = classroom.service_name
    access = f"access:services!service={name}"
    use = f"{USE_SCOPE}!user"

    existing = _current(c.JupyterHub, "services", [])
    if any(service.get("name") == name and not _is_ours(service) for service in existing):
        raise ClassroomError(
            f"{classroom.path}: broker.name: the hub has a service named {name!r} already; name the broker "
            "another way (broker: {name: ...})"
        )
    services = [service for service in existing if service.get("name") != name]  # configure() again: ours goes
    services.append(
        {
            "name": name,
            "url": f"http://127.0.0.1:{classroom.broker_port}",
            "command": [sys.executable, "-m", "jupyter_vgpu", "broker", "--classroom", str(classroom.path)],
            "display": False,  # an API for single-user servers, no page for people
        }
    )
    c.JupyterHub.services = services

    scopes = _current(c.JupyterHub, "custom_scopes", {})
    scopes.update(copy.deepcopy(CUSTOM_SCOPES))
    c.JupyterHub.custom_scopes = scopes

    roles = _current(c.JupyterHub, "load_roles", [])
    _add_role(
        roles,
        {
            "name": BROKER_ROLE,
            "description": "The vGPU broker: reads users, their groups and their servers' user_options",
            "scopes": BROKER_SCOPES,
            "services": [name],
        },
    )
    _add_role(
        roles,
        {
            "name": ADMIN_ROLE,
            "description": "See and resize every user's GPU slices (the vGPU broker)",
            # read:services: `jupyter vgpu status --all` finds the broker's URL from the hub.
            "scopes": [ADMIN_SCOPE, access, f"read:services!service={name}"],
            "users": list(classroom.admins),
            "groups": list(classroom.admin_groups),
        },
    )
    user_role = next((role for role in roles if role.get("name") == "user"), None)
    if user_role is not None and "scopes" in user_role:
        # The hub defines the user role itself: JupyterHub then ignores extra_user_scopes.
        user_role["scopes"] = _union(user_role["scopes"], [use, access])
    else:
        c.JupyterHub.extra_user_scopes = set(_current(c.JupyterHub, "extra_user_scopes", set())) | {use, access}
    c.JupyterHub.load_roles = roles

    c.Spawner.server_token_scopes = _server_token_scopes(c, roles, [use, access])

    for option in ("options_form", "options_from_form"):
        value = _current(c.Spawner, option, None)
        if value and not _is_marked(value):
            raise ClassroomError(
                f"{classroom.path}: c.Spawner.{option} is set already; the classroom file makes the spawn "
                "form (its sizes): keep one or the other"
            )
    c.Spawner.options_form = _mark(options_form(classroom))
    c.Spawner.options_from_form = _mark(options_from_form)
    hub_apply = _current(c.Spawner, "apply_user_options", None)
    c.Spawner.apply_user_options = _then(apply_user_options(classroom), getattr(hub_apply, _HUB_HOOK, hub_apply))


def _kernelspec_args(classroom: Classroom, args: list[str], kernelspecs: list[str]) -> list[str]:
    """The single-user servers' ``args`` with the options that offer only ``kernelspecs``."""
    ours = [*(_ALLOWED_ARG + name for name in kernelspecs), _DEFAULT_ARG + kernelspecs[0]]
    theirs = [arg for arg in args if str(arg).startswith((_ALLOWED_ARG, _DEFAULT_ARG)) and arg not in ours]
    if theirs:
        raise ClassroomError(
            f"{classroom.path}: c.Spawner.args sets {', '.join(theirs)} already; configure() sets the "
            "kernelspecs students may start (kernelspecs=[...]); pass kernelspecs=None to keep yours"
        )
    return [arg for arg in args if arg not in ours] + ours


def _is_ours(service: dict[str, Any]) -> bool:
    command = service.get("command") or []
    return list(command[1:4]) == ["-m", "jupyter_vgpu", "broker"]


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    merged = list(first)
    return merged + [item for item in second if item not in merged]


def _add_role(roles: list[dict[str, Any]], role: dict[str, Any]) -> None:
    """Add a role, or merge it into the hub's role of that name (scopes and members added)."""
    existing = next((r for r in roles if r.get("name") == role["name"]), None)
    if existing is None:
        roles.append(role)
        return
    for key in ("scopes", "users", "groups", "services"):
        if key in role:
            existing[key] = _union(existing.get(key, []), role[key])
    existing.setdefault("description", role["description"])


def _server_token_scopes(c: Config, roles: list[dict[str, Any]], extra: list[str]) -> Any:
    """The hub's server-token scopes plus ``extra``: what it set, else JupyterHub's default (the
    ``server`` role's scopes, as the hub defines them or as JupyterHub ships them)."""
    configured = _current(c.Spawner, "server_token_scopes", [])
    configured = getattr(configured, _HUB_HOOK, configured)
    if callable(configured):

        async def scopes(spawner: Any) -> list[str]:
            base = configured(spawner)
            if isawaitable(base):
                base = await base
            return _union(base or _server_role_scopes(roles), extra)

        setattr(scopes, _HUB_HOOK, configured)
        return _mark(scopes)
    return _union(configured or _server_role_scopes(roles), extra)


def _server_role_scopes(roles: list[dict[str, Any]]) -> list[str]:
    # Imported here: the hub has it, the profiles command does not need it.
    get_default_roles = importlib.import_module("jupyterhub.roles").get_default_roles
    server = next((role for role in roles if role.get("name") == "server" and "scopes" in role), None)
    if server is None:
        server = next(role for role in get_default_roles() if role["name"] == "server")
    return list(server["scopes"])


def _then(first: Callable[[Any, Any], Any], second: Callable[[Any, Any], Any] | None) -> Callable[[Any, Any], Any]:
    """``first``, then the hub's own ``apply_user_options`` (a callable) if it has one."""
    if second is None or _is_marked(second):
        return _mark(first)
    if not callable(second):
        raise ClassroomError(
            "c.Spawner.apply_user_options is a dict; the classroom's sizes need a callable there: "
            "apply your options in a function instead"
        )

    async def both(spawner: Any, user_options: Any) -> None:
        first(spawner, user_options)
        result = second(spawner, user_options)
        if isawaitable(result):
            await result

    setattr(both, _HUB_HOOK, second)
    return _mark(both)


# configure() marks the hooks it makes, so that calling it again replaces them instead of taking
# them for the hub's own; a hook wrapping one of the hub's keeps that one under _HUB_HOOK.
_MARK = "_jupyter_vgpu_hook"
_HUB_HOOK = "_jupyter_vgpu_hub_hook"
_F = TypeVar("_F")


def _mark(hook: _F) -> _F:
    setattr(hook, _MARK, True)
    return hook


def _is_marked(value: object) -> bool:
    return getattr(value, _MARK, False) is True
