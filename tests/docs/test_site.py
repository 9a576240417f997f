"""The documentation site (docs/) builds as README's test block builds it, warnings as errors and
internal links checked, and its reference, generated from the code, says everything the code has:
every configurable trait of the four apps, every command of the CLI with its own help, every path
of api.yaml, every key the classroom file accepts.

The site is built once for the module (about 15 s on the shared two-core machine)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from jupyter_vgpu.cli import BrokerApp
from jupyter_vgpu.hub.classroom import keys as classroom_keys
from jupyter_vgpu.provisioning.local import VGPUProvisioner
from jupyter_vgpu.provisioning.pod import VGPUPodProvisioner
from jupyter_vgpu.server.app import VGPUApp

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
from vgpu_docs import cli_commands, cli_help  # noqa: E402 -- the docs' own extension, as the build runs it

APPS = [VGPUApp, VGPUProvisioner, VGPUPodProvisioner, BrokerApp]
README_STEP = "python -m sphinx -W --keep-going -n -b html docs docs/_build/html"


def sphinx(source: Path, output: Path, builder: str = "html") -> subprocess.CompletedProcess[str]:
    """The README's build command, into ``output``."""
    argv = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-b", builder, str(source), str(output)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("site") / "html"
    result = sphinx(DOCS, output)
    assert result.returncode == 0, f"the site does not build:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return output


class Entries(HTMLParser):
    """The ids of a page's definition terms (autodoc's, httpdomain's) and the text of the
    description that follows each, and the page's whole text."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, str] = {}
        self.text: list[str] = []
        self._current: str | None = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag == "dt" and dict(attrs).get("id"):
            self._current, self._depth = dict(attrs)["id"], 0
            self.entries[self._current] = ""
        elif tag == "dd" and self._current is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "dd" and self._current is not None:
            self._depth -= 1
            if self._depth == 0:
                self._current = None

    def handle_data(self, data):
        self.text.append(data)
        if self._current is not None and self._depth > 0:
            self.entries[self._current] += data


def page(site: Path, name: str) -> Entries:
    parsed = Entries()
    parsed.feed((site / name).read_text())
    return parsed


def words(text: str) -> str:
    """Text as a reader sees it, whitespace and Sphinx's typographic quotes and markup aside."""
    plain = html.unescape(text).translate(str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}))
    return " ".join(plain.replace("`", "").split())


def test_the_readme_test_block_builds_the_site_with_warnings_as_errors():
    block = (ROOT / "README.md").read_text().split("<!-- ci:test -->", 1)[1].split("```", 2)[1]
    assert any(line.split("#")[0].strip() == README_STEP for line in block.splitlines())
    assert "docs/_build/" in (ROOT / ".gitignore").read_text().splitlines()


def test_read_the_docs_builds_the_same_site_with_warnings_as_errors():
    config = yaml.safe_load((ROOT / ".readthedocs.yaml").read_text())
    assert config["sphinx"] == {"configuration": "docs/conf.py", "builder": "html", "fail_on_warning": True}
    (install,) = config["python"]["install"]
    assert install == {"method": "pip", "path": ".", "extra_requirements": ["docs"]}
    extras = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1]
    assert re.search(r"^docs = \[", extras, re.MULTILINE) and '"jupyter-vgpu[docs]"' in extras


@pytest.mark.parametrize("cls", APPS, ids=lambda cls: cls.__name__)
def test_the_options_reference_lists_every_configurable_trait_with_its_help(site, cls):
    entries = page(site, "reference/config.html").entries
    prefix = f"{cls.__module__}.{cls.__name__}."
    listed = {key.removeprefix(prefix): text for key, text in entries.items() if key.startswith(prefix)}
    traits = cls.class_traits(config=True)
    assert sorted(listed) == sorted(traits)
    for name, trait in traits.items():
        if trait.help:  # jupyter_server's ExtensionApp.default_url has none
            assert words(listed[name]).startswith(words(trait.help)[:60]), name


def test_the_cli_reference_shows_every_command_with_its_own_help(site):
    text = words("".join(page(site, "reference/cli.html").text))
    commands = cli_commands()
    assert {("run",), ("kernelspec", "install"), ("hub", "profiles"), ("broker",)} <= set(commands)
    for command in commands:
        shown = cli_help(command)
        assert shown.returncode == 0, shown.stderr
        assert f"$ {' '.join(['jupyter', 'vgpu', *command])} --help {words(shown.stdout)}" in text, command


def test_the_rest_reference_shows_every_path_and_method_of_api_yaml(site):
    spec = yaml.safe_load((ROOT / "jupyter_vgpu" / "server" / "api.yaml").read_text())
    expected = {
        f"{method.upper()} {path}"
        for path, item in spec["paths"].items()
        for method in item
        if method in {"get", "put", "post", "patch", "delete"}
    }
    text = words("".join(page(site, "reference/rest.html").text))
    shown = set(re.findall(r"\b(GET|PUT|POST|PATCH|DELETE) (/api/vgpu[^\s#]*)", text))
    assert {" ".join(found) for found in shown} == expected
    assert words(spec["info"]["description"].split("\n\n")[1]).split("(")[0] in text.replace("`", "")


def test_the_classroom_reference_lists_every_key_the_reader_accepts_with_its_help(site):
    text = words("".join(page(site, "reference/classroom-file.html").text))
    tables = [value for name, value in vars(classroom_keys).items() if re.fullmatch(r"_[A-Z_]+_KEYS", name)]
    assert tables and all(any(table is keys for keys in classroom_keys.KEY_SECTIONS.values()) for table in tables)
    for section, keys in classroom_keys.KEY_SECTIONS.items():
        for key in keys:
            help_text = classroom_keys.KEY_HELP[f"{section}.{key}" if section else key]
            assert f"{key} {words(help_text)}" in text, (section, key)


def test_a_link_to_a_missing_page_or_heading_fails_the_build(tmp_path):
    """Internal links are checked: a copy of the site with one broken link and one broken
    anchor does not build (the dummy builder reads everything, writes nothing)."""
    source = tmp_path / "docs"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build"))
    for name in ("CHANGELOG.md", "CONTRIBUTING.md"):  # the pages that include them
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "jupyter_vgpu").symlink_to(ROOT / "jupyter_vgpu")  # api.yaml and the CLI
    with (source / "sizes.md").open("a") as page_file:
        page_file.write("\nSee [the old page](no-such-page.md) and [a section](run.md#no-such-section).\n")
    result = sphinx(source, tmp_path / "out", builder="dummy")
    assert result.returncode != 0
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, result.stderr[-3000:]
    assert "no-such-page" in warnings[0] + warnings[1] and "no-such-section" in warnings[0] + warnings[1]


def test_no_page_shows_an_empty_section_navigation_column(site):
    """pydata-sphinx-theme draws a "Section Navigation" column beside every page under a
    top-level one; this site's pages are all top-level leaves, so the column listed nothing.
    A page has the column on wide screens only where it lists pages (the site's pages stay in
    the top bar, and in the small-screen menu)."""
    empty, shown = [], []
    for path in sorted(site.rglob("*.html")):
        text = path.read_text()
        name = path.relative_to(site).as_posix()
        nav = re.search(r'aria-label="Section Navigation">(.*?)</nav>', text, re.DOTALL)
        if nav and "<a " not in nav.group(1):
            empty.append(name)
        column = re.search(r'id="pst-primary-sidebar" class="([^"]*)"', text)
        if column and "hide-on-wide" not in column.group(1) and not nav:
            shown.append(name)
    assert empty == [] and shown == []
