"""The %vgpu magic in IPython's own shell, talking to a scripted stand-in for the server's REST API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_vgpu.client import CREDENTIAL_HEADER, KERNEL_VARIABLES, NOT_IN_A_SERVER, kernel_environment

GIB = 1 << 30
KERNEL_ID = "1c2e3f4a-0000-4000-8000-000000000001"
CREDENTIAL = "kernel-secret"
DEVICES = [{"index": 1, "uuid": "GPU-large", "name": "Sim Large"}]


def slice_model(memory=2 * GIB, cores=30, policy="burst"):
    return {
        "kernel_id": KERNEL_ID,
        "path": "work/train.ipynb",
        "device": {"index": 1, "uuid": "GPU-large"},
        "limits": {"memory": memory, "cores": cores, "policy": policy},
        "usage": {"memory": 512 << 20, "sm_util": 12.5, "processes": []},
        "state": "running",
    }


class FakeServer:
    """Answers GET devices / slices/<id> and PATCH slices/<id> like handlers.py; records requests."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.refusal: tuple[int, str] | None = None
        self.slice = slice_model()

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        if self.refusal:
            return self.refusal[0], {"message": self.refusal[1]}
        if method == "GET" and path == "/base/api/vgpu/devices":
            return 200, DEVICES
        if path == f"/base/api/vgpu/slices/{KERNEL_ID}":
            if method == "PATCH":
                self.slice["limits"] = {
                    "memory": int(body["memory"].removesuffix("GiB")) * GIB if "memory" in body else self.slice["limits"]["memory"],
                    "cores": int(body.get("cores", self.slice["limits"]["cores"])),
                    "policy": body.get("policy", self.slice["limits"]["policy"]),
                }
            return 200, self.slice
        return 404, {"message": f"no route {method} {path}"}


@pytest.fixture
def fake_server():
    server = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            server.requests.append((self.command, self.path, body, self.headers.get(CREDENTIAL_HEADER)))
            status, reply = server.answer(self.command, self.path, body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = _serve

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{http.server_address[1]}/base/"
    yield server
    http.shutdown()
    thread.join()


@pytest.fixture
def shell(monkeypatch):
    for name in KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("jupyter_vgpu")
    return ip


@pytest.fixture
def sliced_shell(shell, fake_server, monkeypatch):
    for name, value in kernel_environment(fake_server.url, KERNEL_ID, CREDENTIAL).items():
        monkeypatch.setenv(name, value)
    return shell


def test_load_ext_registers_the_vgpu_line_magic(shell):
    assert shell.find_line_magic("vgpu") is not None


def test_vgpu_prints_the_kernels_slice(sliced_shell, fake_server, capsys):
    sliced_shell.run_line_magic("vgpu", "")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"GPU slice of train.ipynb ({KERNEL_ID}), running",
        "  device  1 · Sim Large",
        "  memory  512MiB used of 2GiB cap",
        "  SM      12.5% measured of 30% share",
        "  policy  burst",
    ]
    assert {request[3] for request in fake_server.requests} == {CREDENTIAL}


def test_resize_sends_the_changes_and_prints_what_was_granted(sliced_shell, fake_server, capsys):
    sliced_shell.run_line_magic("vgpu", "resize --memory 6GiB --cores 40% --policy BURST")
    assert fake_server.requests[-1][:3] == ("PATCH", f"/base/api/vgpu/slices/{KERNEL_ID}", {"memory": "6GiB", "cores": "40", "policy": "burst"})
    assert capsys.readouterr().out.strip() == "resize granted: memory cap 6GiB, SM share 40%, policy burst"


def test_resize_the_server_refuses_prints_its_reason(sliced_shell, fake_server, capsys):
    fake_server.refusal = (409, "device 1 has 3GiB of memory free; the slice asks for 4GiB more")
    sliced_shell.run_line_magic("vgpu", "resize --memory 6GiB")
    assert capsys.readouterr().out.strip() == "resize refused: device 1 has 3GiB of memory free; the slice asks for 4GiB more"


@pytest.mark.parametrize(
    "line, message",
    [
        ("resize --memory 6parsecs", "memory size '6parsecs' has an unknown unit 'parsecs'; use a size like 512MiB"),
        ("resize --memory=0", "memory size '0' must be more than zero"),
        ("resize --cores 140", "SM share '140' is not a whole percentage from 1 to 100"),
        ("resize --policy soft", "policy 'soft' is not 'hard'"),
        ("resize", "nothing to resize; give --memory, --cores and/or --policy"),
        ("--memory 6GiB", "belong to '%vgpu resize', not '%vgpu show'"),
        ("grow", "invalid choice: 'grow'"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_sent(sliced_shell, fake_server, line, message):
    with pytest.raises(UsageError) as refused:
        sliced_shell.run_line_magic("vgpu", line)
    assert message in str(refused.value)
    assert fake_server.requests == []


def test_a_kernel_outside_a_vgpu_server_says_so(shell):
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("vgpu", "")
    assert str(refused.value) == NOT_IN_A_SERVER


def test_an_unreachable_server_is_named(shell, monkeypatch):
    for name, value in kernel_environment("http://127.0.0.1:9/", KERNEL_ID, CREDENTIAL).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=r"cannot reach the vGPU server at http://127.0.0.1:9/"):
        shell.run_line_magic("vgpu", "resize --cores 20")


def test_a_server_on_a_unix_socket_is_refused_plainly(shell, monkeypatch):
    for name, value in kernel_environment("http+unix://%2Ftmp%2Fjupyter.sock/", KERNEL_ID, CREDENTIAL).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match="not Unix sockets"):
        shell.run_line_magic("vgpu", "")


def test_vgpu_help_documents_every_action_and_option(shell):
    help_text = " ".join(shell.object_inspect_text("%vgpu").split())
    for documented in ("%vgpu resize --memory 6GiB --cores 40 --policy burst", "%vgpu panel", "{show,resize,panel}",
                       "--memory MEMORY", "512MiB, 4GiB", "1 to 100", "'hard'", "credential"):
        assert documented in help_text


def test_sliced_ipykernels_load_the_magic_and_other_kernels_are_left_alone():
    from jupyter_vgpu.provisioning.local import LOAD_MAGIC_ARGUMENT, with_vgpu_magic

    ipykernel = ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "kernel.json"]
    assert with_vgpu_magic(ipykernel) == [*ipykernel, LOAD_MAGIC_ARGUMENT]
    assert with_vgpu_magic(with_vgpu_magic(ipykernel)) == [*ipykernel, LOAD_MAGIC_ARGUMENT]  # restarts add it once
    assert with_vgpu_magic(["R", "--slave", "-e", "IRkernel::main()", "kernel.json"]) == ["R", "--slave", "-e", "IRkernel::main()", "kernel.json"]
