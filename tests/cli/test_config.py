"""The command the server's page names (docs/server.md) prints each option of the server extension
and the provisioners with its help (jupyter_server's own --help-all lists no extension's options).
That the site's options reference lists every option is tests/docs/test_site.py's."""

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

SERVER_PAGE = Path(__file__).resolve().parents[2] / "docs" / "server.md"


def documented_command() -> str:
    """The command the server's page says prints every option."""
    text = " ".join(SERVER_PAGE.read_text().split())
    return re.search(r"`(jupyter vgpu [^`]+)` prints every option", text).group(1)


@pytest.fixture(scope="module")
def printed() -> str:
    """What the command the server's page names prints, run as written."""
    argv = shlex.split(documented_command())
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
