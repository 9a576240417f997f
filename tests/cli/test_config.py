"""README's list of the server extension's options is VGPUApp's, and the command it names prints
each of them with its help (jupyter_server's own --help-all lists no extension's options)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_vgpu.provisioning.local import VGPUProvisioner
from jupyter_vgpu.provisioning.pod import VGPUPodProvisioner
from jupyter_vgpu.server.app import VGPUApp

README = Path(__file__).resolve().parents[2] / "README.md"


def configuration_bullet() -> str:
    """The "Configuration" bullet of README's "A short tour", its lines joined."""
    tour = README.read_text().split("## A short tour", 1)[1].split("\n## ", 1)[0]
    (bullet,) = [item for item in re.split(r"\n(?=- )", tour) if item.startswith("- **Configuration**")]
    return " ".join(bullet.split())


def documented(text: str) -> list[str]:
    """The option names in ``text``: `lower_case` words, leaving out a parenthesised aside such
    as the values of one option (`binpack` | `spread`)."""
    return re.findall(r"`([a-z_]+)`", re.sub(r"\([^()]*\)", "", text))


def bullet_parts() -> tuple[str, list[str], list[str]]:
    """(the command it says prints the options, VGPUApp's options, the provisioner's options)."""
    bullet = configuration_bullet()
    command = re.search(r"`(jupyter vgpu [^`]+)`", bullet).group(1)
    server, provisioner = bullet.split("provisioner", 1)
    return command, documented(server), documented(provisioner)


def test_readme_lists_exactly_vgpuapps_options():
    _, server_options, _ = bullet_parts()
    assert len(server_options) == len(set(server_options))
    assert set(server_options) == set(VGPUApp.class_own_traits(config=True))


def test_readme_names_kernelspec_options_the_provisioner_has():
    _, _, provisioner_options = bullet_parts()
    assert provisioner_options and set(provisioner_options) <= set(VGPUProvisioner.class_own_traits(config=True))


@pytest.fixture(scope="module")
def printed() -> str:
    """What the command README names prints, run as written."""
    command, _, _ = bullet_parts()
    argv = shlex.split(command)
    assert argv[:2] == ["jupyter", "vgpu"]
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    result = subprocess.run([jupyter, *argv[1:]], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("cls", [VGPUApp, VGPUProvisioner, VGPUPodProvisioner], ids=lambda cls: cls.__name__)
def test_the_documented_command_prints_every_option_with_its_help(printed, cls):
    for name, trait in cls.class_own_traits(config=True).items():
        entry = re.search(rf"^--{cls.__name__}\.{name}=.*\n((?:    .*\n)+)", printed, re.MULTILINE)
        assert entry, f"--{cls.__name__}.{name} is not printed"
        assert " ".join(entry.group(1).split()).startswith(" ".join(trait.help.split()))


def test_only_our_own_options_are_printed(printed):
    """Options an extension app inherits (open_browser, default_url, ...) are jupyter_server's."""
    listed = set(re.findall(r"^--(\w+\.\w+)=", printed, re.MULTILINE))
    ours = {
        f"{cls.__name__}.{name}"
        for cls in (VGPUApp, VGPUProvisioner, VGPUPodProvisioner)
        for name in cls.class_own_traits(config=True)
    }
    assert listed == ours
