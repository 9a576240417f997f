"""Helpers of the CLI tests: `jupyter vgpu` run as a user types it, in a user's environment on
the simulated GPU, and a scripted stand-in for a running Jupyter server's /api/vgpu/ that
`status` and `resize` find the way they find a real one (Jupyter's runtime files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import json_stand_in, listed_slice

from jupyter_vgpu.model.sizes import parse_size

JUPYTER = str(Path(sys.executable).with_name("jupyter"))
TOKEN = "cli-test-token"


@pytest.fixture
def cli_env(sim_env, tmp_path):
    """A user's environment: the simulated machine named, nothing preloaded or on the library
    path, and Jupyter's runtime and data folders of the test's own."""
    env = dict(sim_env)
    env.pop("LD_LIBRARY_PATH")
    env.pop("JUPYTER_TOKEN", None)
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "data")
    return env


@pytest.fixture
def vgpu(cli_env):
    """vgpu(*args, env=cli_env, prefix=()) -> the finished `[*prefix] jupyter vgpu ARGS...`
    (prefix: a command it runs under, such as unshare), output captured."""

    def run(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (), timeout: float = 120):
        command = [*prefix, JUPYTER, "vgpu", *args]
        return subprocess.run(command, check=False, env=env or cli_env, capture_output=True, text=True, timeout=timeout)

    return run


class StandInServer:
    """Answers GET slices and PATCH slices/<id> as server/handlers.py does, to requests with the
    token only (403 JSON otherwise, as Jupyter's authentication does); records every request as
    (method, path, body, Authorization header). ``refusal`` answers every PATCH with it."""

    token = TOKEN

    def __init__(self):
        self.url = ""
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.refusal: tuple[int, str] | None = None
        self.devices: list[dict] = []  # GET devices; status prints only what they hold beyond the slices
        self.slices = [
            listed_slice(
                "1c2e3f4a-0000-4000-8000-000000000001",
                "work/train.ipynb",
                memory=2 << 30,
                used=512 << 20,
                cores=30,
                util=12.4,
            ),
            listed_slice(
                "1c2e9999-0000-4000-8000-000000000002", memory=1 << 30, used=0, cores=50, util=0.0, policy="burst"
            ),
            listed_slice(
                "abcdef01-0000-4000-8000-000000000003", "eval.ipynb", memory=4 << 30, used=3 << 30, cores=20, util=19.6
            ),
        ]

    def answer(self, method: str, path: str, body: dict | None, authorization: str | None) -> tuple[int, object]:
        if authorization != f"token {TOKEN}":
            return 403, {"message": "Forbidden"}
        if method == "GET" and path == "/api/vgpu/slices":
            return 200, self.slices
        if method == "GET" and path == "/api/vgpu/devices":
            return 200, self.devices
        for model in self.slices:
            if method == "PATCH" and path == f"/api/vgpu/slices/{model['kernel_id']}":
                if self.refusal:
                    return self.refusal[0], {"message": self.refusal[1]}
                limits = model["limits"]
                if "memory" in body:
                    limits["memory_bytes"] = parse_size(str(body["memory"]))
                limits["cores"] = int(body.get("cores", limits["cores"]))
                limits["policy"] = body.get("policy", limits["policy"])
                return 200, model
        return 404, {"message": f"no route {method} {path}"}


@pytest.fixture
def stand_in_server():
    """A StandInServer on 127.0.0.1; ``.url`` ends in '/' like a Jupyter server's."""
    server = StandInServer()

    def respond(method, path, body, headers):
        authorization = headers.get("Authorization")
        server.requests.append((method, path, body, authorization))
        return server.answer(method, path, body, authorization)

    with json_stand_in(respond) as url:
        server.url = url
        yield server


@pytest.fixture
def running_server(stand_in_server, cli_env):
    """The stand-in listed in Jupyter's runtime folder as jupyter_server lists itself. The pid is
    this test process's, so the CLI (client.running_servers) takes the server for alive."""
    runtime = Path(cli_env["JUPYTER_RUNTIME_DIR"])
    runtime.mkdir(parents=True, exist_ok=True)
    port = int(stand_in_server.url.rsplit(":", 1)[1].strip("/"))
    info = {
        "url": stand_in_server.url,
        "hostname": "127.0.0.1",
        "port": port,
        "base_url": "/",
        "token": TOKEN,
        "pid": os.getpid(),
        "secure": False,
        "sock": "",
        "root_dir": str(runtime),
        "password": False,
    }
    (runtime / f"jpserver-{os.getpid()}.json").write_text(json.dumps(info))
    return stand_in_server
