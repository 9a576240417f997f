"""A `jupyter vgpu` command imports only what it needs: the REST commands and every --help leave
jupyter_server (seconds of start-up: its event schemas), jupyter_client, tornado and the slice
machinery (holders, ledger, slice manager) unimported. Proved by the modules loaded, not by a
timing that a busy machine would make flaky."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = (
    "jupyter_server",
    "jupyter_client",
    "tornado",
    "zmq",
    "jupyter_vgpu.server",
    "jupyter_vgpu.provisioning",
    "jupyter_vgpu.manager",
    "jupyter_vgpu.ledger",
    "jupyter_vgpu.holders",
)

# Runs the CLI's entry point in this interpreter with ARGV, then prints the heavy modules loaded.
PROBE = """
import json, sys
argv, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["jupyter-vgpu", *argv]
from jupyter_vgpu.cli import main
try:
    main()
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps(loaded), file=sys.__stderr__)
"""


def loaded_heavy_modules(argv: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    """(the heavy modules `jupyter vgpu ARGV` imported, what it printed to stderr)."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    *said, last = result.stderr.strip().splitlines()
    return json.loads(last), "\n".join(said)


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--server", "http://127.0.0.1:1/"],
        ["resize", "1c2e", "--memory", "2GiB"],
        ["suspend", "1c2e"],
        ["resume", "1c2e"],
        ["--help"],
        ["status", "--help"],
        ["run", "--help"],
        ["kernelspec", "install", "--help"],
        ["pod-manifest", "--help"],
    ],
)
def test_rest_commands_and_help_import_neither_jupyter_server_nor_the_slice_machinery(cli_env, argv):
    loaded, said = loaded_heavy_modules(argv, cli_env)
    assert loaded == [], said
    if argv[-1] != "--help":  # it did run: no server here to ask
        assert "jupyter vgpu" in said and ("no running Jupyter server" in said or "cannot reach" in said), said


def test_running_servers_are_the_runtime_files_of_live_servers(tmp_path):
    """What `status` reads instead of jupyter_server's list_running_servers: a live server's file,
    not a dead one's, one being written, or another kind of file."""
    from jupyter_vgpu.client import running_servers

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    live = {"url": "http://127.0.0.1:8888/", "token": "t", "pid": os.getpid()}
    (tmp_path / "jpserver-1.json").write_text(json.dumps(live))
    (tmp_path / "jpserver-2.json").write_text(json.dumps({**live, "pid": int(dead.stdout)}))
    (tmp_path / "jpserver-3.json").write_text('{"url": "http://127.0.0.1:8890/", "pi')
    (tmp_path / "kernel-4.json").write_text(json.dumps(live))
    assert running_servers(str(tmp_path)) == [live]
    assert running_servers(str(tmp_path / "missing")) == []
