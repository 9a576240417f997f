"""The size choice for local spawners (LocalProcessSpawner, SimpleLocalProcessSpawner,
SystemdSpawner), with JupyterHub's own hooks and no spawner subclass.

- ``options_form``: a ``<select name="profile">`` of the sizes the user's groups may pick;
- ``options_from_form``: the form's data to ``{"profile": name}`` (KubeSpawner's key, so the broker
  reads one key whatever the spawner);
- ``apply_user_options`` (JupyterHub >= 5.3, called before every start, whether the options came
  from the form or the REST API): refuses a size the user may not pick, with a message the spawn
  page shows, and sets the single-user server's ``JUPYTER_VGPU_*`` environment.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

from tornado import web

from jupyter_vgpu.hub.classroom import SERVER_ENVIRONMENT, Classroom, ClassroomError, Size, server_environment

FORM_FIELD = "profile"


class SizeRefused(web.HTTPError):
    """A 400 whose message JupyterHub shows as it is (on the spawn page: ``jupyterhub_message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, "%s", message)
        self.jupyterhub_message = message


def user_groups(spawner: Any) -> list[str]:
    """The names of the groups of a spawner's user (JupyterHub's ``User.groups`` are ``orm.Group``s)."""
    return [group.name for group in getattr(spawner.user, "groups", None) or ()]


def render_form(classroom: Classroom, groups: list[str], chosen: str | None = None) -> str:
    """The options form's HTML: a select of the sizes open to ``groups``, ``chosen`` (or the
    user's default size) preselected, each size's description below it. Every text is escaped."""
    sizes = classroom.sizes_for(groups)
    if not sizes:
        return (
            '<p class="alert alert-warning">No GPU size is open to your groups; '
            "ask your teacher to add you to a group that has one.</p>"
        )
    names = {size.name for size in sizes}
    selected = chosen if chosen in names else classroom.size_for(None, groups).name
    options = "\n".join(_option(size, size.name == selected) for size in sizes)
    details = "\n".join(
        f"<dt>{html.escape(size.display_name)}</dt><dd>{html.escape(size.description)}</dd>" for size in sizes
    )
    # Bootstrap 5's classes, as JupyterHub 5 and 6 pages use them: with Bootstrap 3's form-control
    # the select rendered like a text box, without its arrow.
    return (
        '<div class="mb-3">\n'
        f'<label class="form-label" for="vgpu-profile">GPU size</label>\n'
        f'<select class="form-select" id="vgpu-profile" name="{FORM_FIELD}">\n{options}\n</select>\n'
        f'<dl class="form-text">\n{details}\n</dl>\n'
        "</div>"
    )


def _option(size: Size, selected: bool) -> str:
    mark = " selected" if selected else ""
    return f'<option value="{html.escape(size.name)}"{mark}>{html.escape(size.display_name)}</option>'


def options_form(classroom: Classroom) -> Callable[[Any], str]:
    """``c.Spawner.options_form``: called with the spawner of the user about to start."""

    def form(spawner: Any) -> str:
        previous = (spawner.user_options or {}).get(FORM_FIELD)
        return render_form(classroom, user_groups(spawner), previous if isinstance(previous, str) else None)

    return form


def options_from_form(form_data: Mapping[str, list[str]]) -> dict[str, str]:
    """``c.Spawner.options_from_form``: form data (each field a list of strings) to ``{"profile": name}``."""
    value: object = form_data.get(FORM_FIELD)
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return {FORM_FIELD: value.strip()} if isinstance(value, str) and value.strip() else {}


def apply_user_options(classroom: Classroom) -> Callable[[Any, Mapping[str, Any]], None]:
    """``c.Spawner.apply_user_options``: refuse a size the user's groups may not pick, else set the
    server's environment for the chosen (or default) size. Variables of an earlier start that no
    longer apply are taken away; anything else in ``spawner.environment`` stays."""

    def apply(spawner: Any, user_options: Mapping[str, Any]) -> None:
        try:
            environment = server_environment(classroom, user_options, user_groups(spawner))
        except ClassroomError as error:
            raise SizeRefused(str(error)) from error
        kept = {name: value for name, value in spawner.environment.items() if name not in SERVER_ENVIRONMENT}
        spawner.environment = {**kept, **environment}

    return apply
