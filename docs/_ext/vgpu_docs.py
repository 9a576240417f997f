"""Directives of jupyter-vgpu's docs that render what the code says, at build time, so that the
reference cannot drift from it:

- ``vgpu-cli``: every ``jupyter vgpu`` command (found in the CLI's own subcommand tables) with
  the output of its own ``--help``, run as a user runs it;
- ``vgpu-classroom-keys``: every key the classroom file accepts, from the tables that
  jupyter_vgpu/hub/classroom/keys.py keeps for the file's reader, and their help next to them there;
- ``vgpu-api-description``: api.yaml's own ``info.description`` (units, errors, paths), which
  sphinxcontrib-openapi leaves out.

A key without help, help for a key the validator does not accept, or a command whose help fails
is a build warning, and the docs build (``-W``) turns it into an error.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from traitlets.utils.importstring import import_item

ROOT = Path(__file__).resolve().parents[2]
API_YAML = ROOT / "jupyter_vgpu" / "server" / "api.yaml"
log = logging.getLogger(__name__)


def cli_commands() -> list[tuple[str, ...]]:
    """Every command of ``jupyter vgpu``, as the words after ``jupyter vgpu`` (() is the group
    itself), read from the CLI's own subcommand tables, groups before their subcommands."""
    from jupyter_vgpu.cli import VGPUCommand

    found: list[tuple[str, ...]] = []

    def walk(app: type, words: tuple[str, ...]) -> None:
        found.append(words)
        table = getattr(app, "subcommands", None)  # a class of none has traitlets' Dict trait here
        for name, (sub, _help) in (table if isinstance(table, dict) else {}).items():
            walk(import_item(sub) if isinstance(sub, str) else sub, (*words, name))

    walk(VGPUCommand, ())
    return found


def cli_help(words: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``jupyter vgpu WORDS --help``, with this checkout's jupyter_vgpu first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("JUPYTER_VGPU_SIMULATE", None)
    return subprocess.run(
        [sys.executable, "-m", "jupyter_vgpu", *words, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=ROOT,
    )


class CliReference(SphinxDirective):
    """A section per command: ``$ jupyter vgpu ... --help`` and what it prints."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        commands = cli_commands()
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(cli_help, commands))
        sections: list[nodes.Node] = []
        for words, result in zip(commands, results, strict=True):
            command = " ".join(["jupyter", "vgpu", *words])
            if result.returncode != 0 or not result.stdout.strip():
                log.warning(
                    "%s --help exited %s: %s",
                    command,
                    result.returncode,
                    result.stderr.strip()[-500:],
                    location=self.get_location(),
                )
            section = nodes.section(ids=[nodes.make_id(command)], names=[nodes.fully_normalize_name(command)])
            section += nodes.title(command, "", nodes.literal(command, command))
            block = f"$ {command} --help\n{result.stdout.rstrip()}\n"
            section += nodes.literal_block(block, block, language="none")
            self.state.document.note_implicit_target(section, section)
            sections.append(section)
        return sections


class ClassroomKeys(SphinxDirective):
    """A table per part of the classroom file: each key it accepts and what it means."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        classroom = importlib.import_module("jupyter_vgpu.hub.classroom.keys")

        sections: dict[str, tuple[str, ...]] = classroom.KEY_SECTIONS
        helps: dict[str, str] = classroom.KEY_HELP
        tables = {name for name in vars(classroom) if name.startswith("_") and name.endswith("_KEYS")}
        covered = {name for name in tables if any(getattr(classroom, name) is keys for keys in sections.values())}
        for name in sorted(tables - covered):
            log.warning(
                "classroom/keys.py's %s is in no KEY_SECTIONS entry: its keys are not documented",
                name,
                location=self.get_location(),
            )
        documented = set()
        parts: list[nodes.Node] = []
        for section, keys in sections.items():
            title = "The top level" if not section else section
            lines = ["| key | what it is |", "| --- | --- |"]
            for key in keys:
                path = f"{section}.{key}" if section else key
                documented.add(path)
                help_text = helps.get(path)
                if not help_text:
                    log.warning(
                        "classroom file key %s has no help in classroom/keys.py's KEY_HELP",
                        path,
                        location=self.get_location(),
                    )
                    help_text = ""
                lines.append(f"| `{key}` | {' '.join(help_text.split()).replace('|', '&#124;')} |")
            name = f"classroom-{section or 'top'}"
            part = nodes.section(ids=[nodes.make_id(name)], names=[nodes.fully_normalize_name(name)])
            part += nodes.title(title, "", nodes.literal(title, title) if section else nodes.Text(title))
            self.state.nested_parse(StringList(lines, "classroom/keys.py"), self.content_offset, part)
            self.state.document.note_implicit_target(part, part)
            parts.append(part)
        for path in sorted(set(helps) - documented):
            log.warning(
                "KEY_HELP documents %s, which the classroom file does not accept", path, location=self.get_location()
            )
        return parts


class ApiDescription(SphinxDirective):
    """api.yaml's ``info.description``, as the Markdown it is written in."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(API_YAML))
        description = yaml.safe_load(API_YAML.read_text())["info"]["description"]
        container = nodes.container()
        self.state.nested_parse(StringList(description.splitlines(), str(API_YAML)), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("vgpu-cli", CliReference)
    app.add_directive("vgpu-classroom-keys", ClassroomKeys)
    app.add_directive("vgpu-api-description", ApiDescription)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
