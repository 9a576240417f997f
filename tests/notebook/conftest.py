"""Helpers of the notebook tests (the %vgpu magic and the panel): slice models as the REST API
writes them, a scripted stand-in for the server's /api/vgpu/ over HTTP (for the magic, which
builds its own client), a scripted client (for the panel, which is handed one), and the
environment of a kernel that no server started (a batch run), in a slice of a real region."""

from __future__ import annotations

import copy

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support import json_stand_in, listed_slice

from jupyter_vgpu.client import (
    CREDENTIAL_HEADER,
    KERNEL_VARIABLES,
    RequestRefused,
    ServerUnavailable,
    kernel_environment,
)
from jupyter_vgpu.model.sizes import parse_size

GIB = 1 << 30
KERNEL_ID = "1c2e3f4a-0000-4000-8000-000000000001"  # the kernel the magic runs in
CREDENTIAL = "kernel-secret"
DEVICES = [
    {"index": 0, "uuid": "GPU-small", "name": "Sim Small"},
    {"index": 1, "uuid": "GPU-large", "name": "Sim Large"},
]


def make_model(kernel_id, device=0, **fields):
    """A slice on DEVICES[device] as GET slices answers it (the other fields: support.listed_slice's)."""
    return listed_slice(kernel_id, device={"index": device, "uuid": DEVICES[device]["uuid"]}, **fields)


@pytest.fixture
def slice_model():
    """slice_model(kernel_id, path=, device=, memory=, cores=, policy=, used=, util=, warnings=)."""
    return make_model


def resized(limits: dict, changes: dict) -> dict:
    """``limits`` after a PATCH body as the server reads it (memory: a size, or a number of MiB)."""
    memory = changes.get("memory")
    return {
        "memory_bytes": limits["memory_bytes"] if memory is None else parse_size(str(memory)),
        "cores": int(changes.get("cores", limits["cores"])),
        "policy": changes.get("policy", limits["policy"]),
    }


class FakeServer:
    """Answers GET devices, GET and PATCH slices/<id> like server/handlers.py under /base/;
    records (method, path, body, kernel credential) of every request."""

    def __init__(self):
        self.kernel_id, self.credential = KERNEL_ID, CREDENTIAL
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.refusal: tuple[int, str] | None = None
        self.slice = make_model(
            KERNEL_ID, path="work/train.ipynb", device=1, memory=2 * GIB, used=512 << 20, util=12.5, policy="burst"
        )
        self.url = ""

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        if self.refusal:
            return self.refusal[0], {"message": self.refusal[1]}
        if method == "GET" and path == "/base/api/vgpu/devices":
            return 200, DEVICES
        if path == f"/base/api/vgpu/slices/{KERNEL_ID}":
            if method == "PATCH":
                self.slice["limits"] = resized(self.slice["limits"], body)
            return 200, self.slice
        return 404, {"message": f"no route {method} {path}"}


@pytest.fixture
def fake_server():
    server = FakeServer()

    def respond(method, path, body, headers):
        server.requests.append((method, path, body, headers.get(CREDENTIAL_HEADER)))
        return server.answer(method, path, body)

    with json_stand_in(respond) as url:
        server.url = url + "base/"
        yield server


@pytest.fixture
def shell(monkeypatch):
    """IPython's shell with the extension loaded, outside any vGPU server."""
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("jupyter_vgpu")
    return ip


@pytest.fixture
def sliced_shell(shell, fake_server, monkeypatch):
    """The shell of a kernel the fake server started: the provisioner's variables set."""
    for name, value in kernel_environment(fake_server.url, KERNEL_ID, CREDENTIAL).items():
        monkeypatch.setenv(name, value)
    return shell


class ScriptedClient:
    """Answers like client.ServerClient from ``listed``, which the test edits; records resizes.
    ``refusal`` makes every resize fail with it; ``unreachable`` makes listing fail."""

    kernel_id = "own-kernel"

    def __init__(self, slices):
        self.listed = slices
        self.resizes: list[tuple[str, dict]] = []
        self.refusal: RequestRefused | None = None
        self.unreachable = False

    def slices(self):
        if self.unreachable:
            raise ServerUnavailable("cannot reach the vGPU server at http://localhost:8888/: Connection refused")
        return copy.deepcopy(self.listed)

    def devices(self):
        return DEVICES

    def resize(self, kernel_id, **changes):
        self.resizes.append((kernel_id, changes))
        if self.refusal:
            raise self.refusal
        (model,) = [m for m in self.listed if m["kernel_id"] == kernel_id]
        model["limits"] = resized(model["limits"], changes)
        return copy.deepcopy(model)


@pytest.fixture
def scripted_client():
    """scripted_client(slices) -> a ScriptedClient listing ``slices``."""
    return ScriptedClient


BATCH_KERNEL_ID = "7a0b1c2d-0000-4000-8000-000000000007"
BATCH_DEVICE = {"device_uuid": "GPU-0000test-0000-4000-8000-000000000000", "device_index": 0}


@pytest.fixture
def batch_shell(shell, native_libs, tmp_path, monkeypatch, region_files):
    """batch_shell(memory=, cores=, policy=) -> (the shell of a kernel a batch run started, its
    region): the variables the provisioner sets without a server (the region, the kernel's own
    id, no server link), a real region file of those limits."""

    def make(memory: int = 3 * GIB, cores: int = 40, policy: str = "burst"):
        path = tmp_path / f"{BATCH_KERNEL_ID}.region"
        region = region_files(path, memory_limit=memory, sm_share=cores, policy=policy, **BATCH_DEVICE)
        monkeypatch.setenv("VGPU_REGION", str(path))
        monkeypatch.setenv("JUPYTER_VGPU_KERNEL_ID", BATCH_KERNEL_ID)
        monkeypatch.delenv("JUPYTER_VGPU_LEDGER", raising=False)
        return shell, region

    return make
