"""Every `jupyter vgpu` command in README.md and in the site's pages (docs/**/*.md), in their fenced
blocks, runs as written: tests/cli/test_readme_commands.py runs README's first block in its order
and the site's nbconvert line; this module does the rest.

- Each command names a command the CLI has, and only options that command knows (traitlets only
  warns "Unrecognized alias" and goes on, so a page naming a missing option would mislead).
- Those that need no server run on the simulated GPU in a user's environment (`--simulate` as
  written); a `$ ` line's documented output is what it prints.
- Those that talk to a running server (`status`, `resize`, `suspend`, `resume`) run against a
  real Jupyter server on the simulated GPU with a kernel that has used the GPU, in the order the
  pages give them; the pages' kernel id, `1c2e`, stands for that kernel's id.
- The few that need a real GPU (no `--simulate`) are only parsed, here and in CI.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import JupyterProcess, write_vgpu_kernelspec

from jupyter_vgpu.cli import VGPUCommand

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(path for path in (ROOT / "docs").rglob("*.md") if "_build" not in path.parts)]
SERVER_COMMANDS = {"status", "resize", "suspend", "resume"}
GPU_COMMANDS = {"run", "devices", "doctor"}  # on a machine's real GPU unless --simulate
KERNEL_ID = "1c2e"  # the pages' kernel id (a prefix, as `jupyter vgpu status` shows it)
TOKEN = "docs-test-token"


@dataclass(frozen=True)
class Documented:
    page: str
    line: int
    command: str  # as written, comments cut, continuation lines joined
    output: tuple[str, ...]  # after a `$ ` command: the lines the page shows it printing

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)

    @property
    def words(self) -> tuple[str, ...]:
        """The command's words after `jupyter vgpu` up to its first option or argument."""
        app, words = VGPUCommand, []
        for word in self.argv[2:]:
            table = getattr(app, "subcommands", None)
            if not isinstance(table, dict) or word not in table:
                break
            words.append(word)
            app = table[word][0]
        return tuple(words)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.command}"


def documented_commands() -> list[Documented]:
    found = []
    for path in PAGES:
        lines, fenced = path.read_text().splitlines(), False
        index = 0
        while index < len(lines):
            line = lines[index].strip()
            index += 1
            if line.startswith("```"):
                fenced = not fenced
                continue
            prompt = line.startswith("$ jupyter vgpu ")
            if not fenced or not (line.startswith("jupyter vgpu ") or prompt):
                continue
            start, text = index, line.removeprefix("$ ")
            while text.endswith("\\"):
                text = text[:-1] + " " + lines[index].strip()
                index += 1
            output = []
            while prompt and index < len(lines) and not lines[index].strip().startswith(("```", "$ ")):
                output.append(lines[index].strip())
                index += 1
            command = shlex.join(shlex.split(text, comments=True))
            found.append(Documented(str(path.relative_to(ROOT)), start, command, tuple(output)))
    return found


COMMANDS = documented_commands()


def test_the_pages_have_the_commands_this_module_runs():
    """The collection itself: README's first example with its output, the site's server commands."""
    assert any(command.output and command.page == "README.md" for command in COMMANDS)
    assert SERVER_COMMANDS <= {command.words[0] for command in COMMANDS if command.words}
    assert all(command.argv[:2] == ["jupyter", "vgpu"] for command in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_each_command_names_a_command_and_options_it_has(command):
    assert command.words, f"{command}: `jupyter vgpu` has no command {command.argv[2]!r}"
    app_class = VGPUCommand
    for word in command.words:
        app_class = app_class.subcommands[word][0]
    app = app_class()
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    app.log.addHandler(handler)
    refused = io.StringIO()
    try:
        with contextlib.redirect_stderr(refused):
            app.parse_command_line(command.argv[2 + len(command.words) :])
    except SystemExit:  # an option the command does not have: refused in one line, exit 2
        messages.append(refused.getvalue().strip())
    finally:
        app.log.removeHandler(handler)
    assert not messages, f"{command}: {messages}"


@pytest.fixture
def user_env(sim_env, tmp_path) -> dict[str, str]:
    """A user's shell with the virtual environment active, on a private simulated machine, with
    Jupyter's folders of the test's own and a vGPU kernelspec installed there."""
    env = dict(sim_env)
    env.pop("LD_LIBRARY_PATH")
    env.pop("JUPYTER_TOKEN", None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
    )
    write_vgpu_kernelspec(tmp_path / "data" / "kernels" / "python3-vgpu", "Python 3 (GPU slice)")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "my_script.py").write_text("print('hello from a slice')\n")
    return env


def run(command: Documented, env: dict[str, str], cwd: Path, *replace: tuple[str, str]) -> str:
    argv = command.argv
    for old, new in replace:
        argv = [new if word == old else word for word in argv]
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_commands_that_need_no_server_run_as_written(user_env, tmp_path):
    ran = []
    for command in COMMANDS:
        if not command.words or command.words[0] in SERVER_COMMANDS:
            continue
        if command.words[0] in GPU_COMMANDS and "--simulate" not in command.argv:
            continue  # for a machine's real GPU: parsed above
        printed = run(command, user_env, tmp_path / "work")
        if command.output:
            assert printed.splitlines()[-len(command.output) :] == list(command.output), command
        ran.append(command.words)
    assert ("run",) in ran and ("kernelspec", "install") in ran


def test_the_commands_for_a_running_server_run_as_written_against_one(user_env, tmp_path, cuda_prelude):
    """In the pages' order (status, resize; suspend, resume), against a real server whose kernel
    has used the GPU."""
    from jupyter_client import BlockingKernelClient

    server = JupyterProcess(
        user_env,
        tmp_path / "server.log",
        TOKEN,
        "--VGPUApp.simulate=True",
        f"--ServerApp.root_dir={tmp_path / 'work'}",
    )
    try:
        kernel_id = server.api("POST", "api/vgpu/kernels", {"name": "python3-vgpu", "memory": "2GiB"})["kernel"]["id"]
        client = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{kernel_id}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(cuda_prelude + "\nassert allocate(64 << 20) == 0", timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            client.stop_channels()
        ran = []
        for command in COMMANDS:
            if command.words and command.words[0] in SERVER_COMMANDS:
                printed = run(command, user_env, tmp_path / "work", (KERNEL_ID, kernel_id[:8]))
                assert kernel_id[:8] in printed or command.words[0] == "status", f"{command}: {printed}"
                ran.append(command.words[0])
        assert set(ran) == SERVER_COMMANDS
        (listed,) = server.api("GET", "api/vgpu/slices")
        assert listed["state"] == "running"
        assert (listed["limits"]["memory_bytes"], listed["limits"]["cores"]) == (6 << 30, 40)
    finally:
        server.stop()


def test_a_documented_option_the_command_does_not_have_is_caught():
    """The check above, against a command line with an option `kernelspec install` lacks."""
    wrong = Documented("a page", 1, "jupyter vgpu kernelspec install --memory 8GiB --prefx /opt/x", ())
    with pytest.raises(AssertionError, match="unknown option --prefx"):
        test_each_command_names_a_command_and_options_it_has(wrong)
