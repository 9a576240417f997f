"""A real JupyterHub for the tests: `jupyterhub` from PyPI behind configurable-http-proxy (npm,
tests/hub/package.json), SimpleLocalProcessSpawner and DummyAuthenticator, configured by
``jupyter_vgpu.hub.configure`` from a classroom file, so the broker runs as the hub's managed
service. Every user's server runs under this one Unix account (as in CI): the tests prove what the
hub's scopes and the broker decide, not what Unix permissions would add.

A test drives the hub through its REST API with a service token of its own (``driver``), as an
admin script would, and each user through a token the hub issues for that user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

from support import folder_processes, free_port, kernel_client, wait_for

HUB_TESTS = Path(__file__).resolve().parent
PROXY = HUB_TESTS / "node_modules" / ".bin" / "configurable-http-proxy"
DRIVER_TOKEN = "driver-token-for-the-tests-0123456789abcdef"
# The proxy answers 404 before the hub registered its routes, the hub answers 503 while starting:
# a start is waited for on requests that must succeed, never on time.
START_TIMEOUT_S = 120


class HubError(AssertionError):
    pass


def request(url: str, method: str = "GET", token: str | None = None, body=None, timeout: float = 60):
    """(status, JSON reply or None) of one request; never raises for an HTTP status."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    data = None if body is None else json.dumps(body).encode()
    outgoing = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(outgoing, timeout=timeout) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class Hub:
    """A running hub: ``url`` (the proxy), ``broker_url`` (the broker's own address and prefix).

    ``classroom``: the classroom file's text without ``simulate`` and ``broker``, which the hub
    writes itself: its GPUs are simulated and its broker listens on a port it chose free."""

    def __init__(self, folder: Path, classroom: str, *, extra_config: str = "", spawner: str = "simple"):
        """``spawner``: "simple" (SimpleLocalProcessSpawner, with the classroom's broker) or
        "kubernetes" (KubeSpawner from PyPI, against the cluster of ``$KUBECONFIG``: no broker)."""
        self.folder = folder
        self.port, self.hub_port, self.proxy_api_port, self.broker_port = (free_port() for _ in range(4))
        self.url = f"http://127.0.0.1:{self.port}/"
        self.api = f"{self.url}hub/api/"
        self.classroom = folder / "classroom.yaml"
        own_gpu_and_broker = f"simulate: true\nbroker: {{port: {self.broker_port}, state_dir: broker-state}}\n"
        self.classroom.write_text(own_gpu_and_broker + classroom.lstrip("\n"))
        self.broker_url = f"http://127.0.0.1:{self.broker_port}/services/vgpu/"
        self.log = folder / "hub.log"
        singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
        allow_root = ["--allow-root"] if os.getuid() == 0 else []
        (folder / "jupyterhub_config.py").write_text(
            textwrap.dedent(
                f"""
                import jupyter_vgpu.hub
                c = get_config()  # noqa: F821
                c.JupyterHub.ip = "127.0.0.1"
                c.JupyterHub.port = {self.port}
                c.JupyterHub.hub_ip = "127.0.0.1"
                c.JupyterHub.hub_port = {self.hub_port}
                c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
                c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
                c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
                c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
                c.JupyterHub.pid_file = "{folder}/hub.pid"
                c.JupyterHub.authenticator_class = "dummy"
                c.JupyterHub.spawner_class = {"kubespawner.KubeSpawner" if spawner == "kubernetes" else "simple"!r}
                c.Spawner.cmd = [{str(singleuser)!r}]
                c.Spawner.args = {allow_root!r}
                c.Spawner.default_url = "/tree"
                c.Spawner.start_timeout = 120
                c.Spawner.http_timeout = 120
                # How soon the hub notices a server (or the broker) that exited.
                c.Spawner.poll_interval = 1
                c.SimpleLocalProcessSpawner.home_dir_template = "{folder}/home/{{username}}"
                c.JupyterHub.services = [{{"name": "driver", "api_token": {DRIVER_TOKEN!r}}}]
                c.JupyterHub.load_roles = [
                    {{
                        "name": "driver",
                        "scopes": ["admin:users", "admin:servers", "admin:server_state", "tokens", "list:users", "read:users"],
                        "services": ["driver"],
                    }}
                ]
                jupyter_vgpu.hub.configure(c, {str(self.classroom)!r})
                # The hub's simulated GPU (the broker's, the servers' and their kernels') is its
                # own: the hub passes only a few variables of its environment (PATH, PYTHONPATH,
                # LANG...) to what it starts, not the test session's XDG_RUNTIME_DIR
                # (tests/conftest.py), so they would share the default state file in /dev/shm with
                # whatever else runs on the machine.
                SIM_STATE = {{"VGPU_SIM_STATE": "{folder}/simulated-gpu.state"}}
                for service in c.JupyterHub.services:
                    if service["name"] == "vgpu":
                        service["environment"] = {{**service.get("environment", {{}}), **SIM_STATE}}
                c.Spawner.environment.update(SIM_STATE)
                """
            )
            + textwrap.dedent(extra_config)
        )
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(folder / "jupyterhub_config.py")],
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own, for the SIGKILL of teardown (see stop)
            )
        try:
            wait_for(lambda: self._answers(self.api, 200), START_TIMEOUT_S, "the hub's API to answer")
            if spawner != "kubernetes":
                wait_for(self.broker_answers, START_TIMEOUT_S, "the broker to answer")
        except BaseException:
            self.stop()
            raise

    def _answers(self, url: str, status: int) -> bool:
        if self.process.poll() is not None:
            raise HubError(f"jupyterhub exited ({self.process.returncode}):\n{self.log_tail()}")
        try:
            return request(url, timeout=5)[0] == status
        except OSError:
            return False

    def broker_answers(self) -> bool:
        return self._answers(self.broker_url, 200)

    def log_tail(self, characters: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-characters:]

    # -- the hub's API, as the driver service -------------------------------------------------

    def hub(self, method: str, path: str, body=None, expect: tuple[int, ...] = (200, 201, 202, 204)):
        status, reply = request(self.api + path, method, DRIVER_TOKEN, body)
        if status not in expect:
            raise HubError(f"{method} hub/api/{path}: {status} {reply}\n{self.log_tail()}")
        return reply

    def user_token(self, name: str) -> str:
        """A token of ``name``'s own, with every scope the user holds (the user role's)."""
        self.hub("POST", "users", {"usernames": [name]}, expect=(201, 409))
        return self.hub("POST", f"users/{name}/tokens", {"note": "tests"})["token"]

    def start_server(self, name: str, user_options: dict) -> None:
        """Start ``name``'s server with ``user_options`` (what the options form would post) and
        wait until the hub reports it ready."""
        self.hub("POST", f"users/{name}/server", user_options)
        wait_for(
            lambda: self._server(name).get("ready") or self._spawn_failed(name),
            START_TIMEOUT_S,
            f"{name}'s server to be ready",
            interval=0.2,
        )

    def _server(self, name: str) -> dict:
        return (self.hub("GET", f"users/{name}").get("servers") or {}).get("", {})

    def _spawn_failed(self, name: str) -> bool:
        if not self._server(name):
            raise HubError(f"{name}'s server did not start:\n{self.log_tail()}")
        return False

    def server_gone(self, name: str) -> bool:
        return not self._server(name)

    def server_pid(self, name: str) -> int:
        """The process of ``name``'s single-user server (SimpleLocalProcessSpawner keeps its pid in its state)."""
        return int(self.hub("GET", f"users/{name}?include_stopped_servers").get("servers", {})[""]["state"]["pid"])

    # -- the user's own server, through the proxy ------------------------------------------------

    def server(self, name: str, token: str, method: str, path: str, body=None):
        return request(f"{self.url}user/{name}/{path}", method, token, body)

    def start_kernel(self, name: str, token: str, kernelspec: str = "python3-vgpu"):
        return self.server(name, token, "POST", "api/kernels", {"name": kernelspec})

    # -- the broker, directly --------------------------------------------------------------------

    def broker(self, method: str, path: str, token: str, body=None):
        return request(self.broker_url + path, method, token, body, timeout=30)

    def broker_pid(self) -> int:
        """The broker's process, found by its command line (the hub keeps no record an API shows)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"broker" in argv and str(self.classroom).encode() in argv:
                return int(entry.name)
        raise HubError("no broker process runs")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        # Whatever of its session is left (servers, the proxy, the broker).
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        # Kernels run in sessions of their own, and a suspended one outlives its server by design:
        # each process still at work in the hub's folder (a kernel's cwd is its user's home there)
        # goes too, so that no test leaves one behind.
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not self.processes(), 30, "every process of the hub's folder to end", interval=0.05)

    def processes(self) -> list[int]:
        return list(folder_processes(self.folder))


def kernel_process(hub: Hub, user: str, kernel_id: str) -> int:
    """The pid of a kernel of ``user``'s server (the process started with its connection file)."""
    connection_file = str(kernel_connection_file(hub, user, kernel_id))
    pids = [pid for pid, argv in folder_processes(hub.folder).items() if connection_file in argv]
    if len(pids) != 1:
        raise HubError(f"{len(pids)} processes run with {connection_file}")
    return pids[0]


def kernel_connection_file(hub: Hub, user: str, kernel_id: str) -> Path:
    """The connection file of a kernel of ``user``'s server (its home's Jupyter runtime folder)."""
    found = list((hub.folder / "home" / user).glob(f"**/kernel-{kernel_id}.json"))
    if not found:
        raise HubError(f"no connection file for kernel {kernel_id} under {user}'s home")
    return found[0]


def run_in_hub_kernel(hub: Hub, user: str, kernel_id: str, code: str, timeout: float = 60) -> str:
    """The stdout of ``code`` run in a kernel of ``user``'s server, over the kernel's own channels
    (stderr, where libvgpu.so writes its out-of-memory line, is left out)."""
    client = kernel_client(kernel_connection_file(hub, user, kernel_id), timeout)
    try:
        client.wait_for_ready(timeout=timeout)
        chunks: list[str] = []

        def collect(message):
            if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                chunks.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                chunks.append("\n".join(message["content"]["traceback"]))

        started = time.monotonic()
        reply = client.execute_interactive(code, output_hook=collect, timeout=timeout)
        assert reply["content"]["status"] == "ok", "".join(chunks)
        assert time.monotonic() - started < timeout
        return "".join(chunks)
    finally:
        client.stop_channels()
