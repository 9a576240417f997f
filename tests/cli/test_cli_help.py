"""`jupyter vgpu ... --help` as a newcomer reads it: every command in a whole sentence, no
command named that does not exist (jupyter-vgpu-kernelspec), no private class of the code
(_VGPUSubcommand), no issue numbers (issue 27 #18)."""

from __future__ import annotations

import re

import pytest

COMMANDS = [
    (),
    ("run",),
    ("devices",),
    ("doctor",),
    ("status",),
    ("resize",),
    ("suspend",),
    ("resume",),
    ("kernelspec",),
    ("kernelspec", "install"),
    ("config",),
    ("pod-manifest",),
    ("broker",),
    ("hub",),
    ("hub", "profiles"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command) or "vgpu")
def test_help_names_no_private_class_no_missing_command_and_no_issue(vgpu, command):
    for flag in ("--help", "--help-all"):
        result = vgpu(*command, flag)
        assert result.returncode == 0, result.stderr
        shown = result.stdout
        assert not re.findall(r"\b_[A-Z]\w*", shown), f"{flag}: a private class"
        assert not re.findall(r"jupyter-vgpu-\w+", shown), f"{flag}: a command that does not exist"
        assert not re.findall(r"\bissue \d", shown), f"{flag}: an issue number"


def test_the_command_table_says_each_command_in_a_whole_sentence(vgpu):
    shown = vgpu("--help").stdout
    table = shown.split("Subcommands\n===========\n", 1)[1].split("\nOptions\n", 1)[0]
    assert table.startswith("Run a command as `jupyter vgpu COMMAND [options]`")
    described: dict[str, str] = {}
    for line in table.splitlines():
        if re.fullmatch(r"[a-z-]+", line):
            name = line
            described[name] = ""
        elif line.startswith("    ") and described:
            described[name] += line.strip()
    assert set(described) == {command[0] for command in COMMANDS if command}
    for name, text in described.items():
        assert text[0].isupper() and text.endswith("."), f"{name}: {text!r} is cut"


@pytest.mark.parametrize("command", [("status",), ("resize", "x"), ("suspend", "x"), ("resume", "x")])
def test_commands_that_ask_the_server_take_no_simulate_flag(vgpu, command):
    """The server's GPU, simulated or not, is the server's: --simulate did nothing there."""
    result = vgpu(*command, "--simulate")
    assert result.returncode == 2 and "unknown option --simulate" in result.stderr, result.stderr


def test_config_cites_no_issue_numbers(vgpu):
    result = vgpu("config")
    assert result.returncode == 0, result.stderr
    assert not re.findall(r"\bissue \d", result.stdout)


@pytest.mark.parametrize(
    "args, said",
    [
        (("run", "--memory"), "jupyter vgpu run: --memory needs a value;"),
        (("devices", "--colour=red"), "jupyter vgpu devices: unknown option --colour;"),
    ],
)
def test_an_option_without_its_value_or_unknown_is_one_line_and_exit_2(vgpu, args, said):
    result = vgpu(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(said) and len(result.stderr.strip().splitlines()) == 1, result.stderr
