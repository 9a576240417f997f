"""Every install line in the docs works as written: jupyter-vgpu is not on PyPI (a name there
would be someone else's), so each line installs it from this repository.

The classroom's install block (docs/classroom.md) is run as written in a copy of the checkout,
with a fresh virtual environment's `pip` first on PATH and npm's global prefix in the test's
folder, and then the server's (docs/server.md), which brings JupyterLab with the wheel (a line
the classroom's block already ran in the same checkout is not run twice: it would build the same
wheel again). The kernel image's Dockerfile (docs/kubernetes.md) cannot be built here (no Docker): its
COPY is carried out into a scratch folder standing in for the image's root, and its RUN line is
run as written against that folder, in the same environment with jupyter-vgpu uninstalled first.

Cost: one wheel build and one virtual environment whose dependencies come from pip's cache at
the running one's versions; several minutes on the shared two-core machine.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from support import venv_with_pinned_dependencies

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(page for page in (ROOT / "docs").rglob("*.md") if "_build" not in page.parts)]
PACKAGE_NAMES = {"jupyter-vgpu", "jupyter_vgpu"}
pytestmark = pytest.mark.timeout(900)  # as tests/packaging/test_wheel.py: a wheel build and a venv


def marked_block(document: Path, marker: str) -> str:
    """The fenced block right after ``<!-- doc-test:MARKER -->`` in a document."""
    text = document.read_text()
    found = re.search(rf"<!-- doc-test:{marker} -->\s*```\w*\n(.*?)\n\s*```", text, re.DOTALL)
    assert found, f"{document.name} has no block marked doc-test:{marker}"
    return "\n".join(line.strip() for line in found.group(1).splitlines())


def install_lines(text: str) -> list[str]:
    """The pip install commands of a document: lines of its fenced blocks, and inline code spans in
    its prose (prose itself is not a command: "this machine's" would read as an open quote)."""
    commands, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        candidates = [line] if fenced else re.findall(r"`([^`]*)`", line)
        commands += [command.strip() for command in candidates if re.search(r"\bpip3? install\b", command)]
    return commands


def test_no_install_line_in_the_docs_asks_pypi_for_jupyter_vgpu():
    asked = []
    for document in DOCS:
        for line in install_lines(document.read_text()):
            command = line.split("#")[0].split("&&")[0]
            for word in shlex.split(command.split("install", 1)[1]):
                requirement = re.split(r"[\[<>=~!; ]", word, maxsplit=1)[0]
                if requirement.lower() in PACKAGE_NAMES:
                    asked.append(f"{document.name}: {line}")
    assert not asked, f"these install jupyter-vgpu from PyPI, where it is not: {asked}"


def test_readme_s_install_section_says_what_brings_jupyterlab_with_a_wheel():
    """A wheel's dependencies leave JupyterLab out: README's install section says so in the line
    of docs/server.md's block, which the test below runs as written."""
    readme = (ROOT / "README.md").read_text()
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    server = marked_block(ROOT / "docs" / "server.md", "server-install")
    (wheel_line,) = [line for line in server.splitlines() if "jupyterlab" in line.split()]
    assert f"`{wheel_line}`" in " ".join(install.split()), install


def run(command: str | list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{command} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the working tree as a clone would have it (tracked and new files, no builds)."""
    copy = tmp_path_factory.mktemp("checkout") / "jupyter-vgpu"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def test_the_classroom_install_block_and_the_kernel_image_install_jupyter_vgpu_as_written(checkout, tmp_path):
    venv, constraints = venv_with_pinned_dependencies(tmp_path)
    npm_prefix = tmp_path / "npm-global"
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith(("VIRTUAL_ENV", "JUPYTER_VGPU_"))},
        "PATH": f"{venv / 'bin'}{os.pathsep}{npm_prefix / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PIP_CONSTRAINT": str(constraints),
        "npm_config_prefix": str(npm_prefix),
        "npm_config_prefer_offline": "true",
        "npm_config_audit": "false",
        "npm_config_fund": "false",
    }

    classroom = marked_block(ROOT / "docs" / "classroom.md", "classroom-install")
    run(["bash", "-euo", "pipefail", "-c", classroom], cwd=checkout, env=env)
    for command in (["jupyterhub", "--version"], ["jupyter", "vgpu", "--version"], ["configurable-http-proxy", "-V"]):
        run(command, env=env, cwd=tmp_path)
    server = marked_block(ROOT / "docs" / "server.md", "server-install")
    not_run_yet = [line for line in server.splitlines() if line not in classroom.splitlines()]
    assert any("jupyterlab" in line for line in not_run_yet), server
    run(["bash", "-euo", "pipefail", "-c", "\n".join(not_run_yet)], cwd=checkout, env=env)
    run(["jupyter", "lab", "--version"], env=env, cwd=tmp_path)
    where = run(["python", "-c", "import jupyter_vgpu; print(jupyter_vgpu.__file__)"], env=env, cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout

    # The kernel image: COPY into the stand-in root, then its RUN line as written under that root.
    image = marked_block(ROOT / "docs" / "kubernetes.md", "kernel-image")
    image_root = tmp_path / "image-root"
    run(["pip", "uninstall", "-y", "jupyter-vgpu"], env=env)
    for line in image.splitlines():
        if line.startswith("COPY "):
            source, destination = line.split()[1:]
            shutil.copytree(checkout / source, image_root / destination.lstrip("/"), dirs_exist_ok=True)
        elif line.startswith("RUN "):
            command = line.removeprefix("RUN ").replace(" /tmp/", f" {image_root}/tmp/")
            run(["bash", "-euo", "pipefail", "-c", command], env=env, cwd=tmp_path)
    assert "RUN " in image and "COPY " in image
    run(["jupyter", "vgpu", "--version"], env=env, cwd=tmp_path)
    assert not (image_root / "tmp" / "jupyter-vgpu").exists()  # the RUN line cleans up after itself
