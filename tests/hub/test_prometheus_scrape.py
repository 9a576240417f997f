"""The Grafana boards (docs/grafana) against a real Prometheus (Debian's package) scraping what each
board is for, as docs/monitoring.md configures it: the server board a real Jupyter server with
jupyter-vgpu, the classroom board a classroom's real broker behind a real JupyterHub and its proxy.
Every panel's query, run through Prometheus' HTTP API, returns at least one series, and the
labels its legend shows are on them: a board that names a metric its source does not export, or
shows a label it does not carry, fails.

Each source has a kernel that used the GPU and was suspended and resumed, so that every series
the sources can export is there (the suspend and resume seconds exist only after one).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from hub_process import Hub, run_in_hub_kernel
from support import CUDA_PRELUDE, VGPUServer, free_port, wait_for

pytestmark = pytest.mark.timeout(600)

BOARDS = Path(__file__).resolve().parents[2] / "docs" / "grafana"
# What Grafana puts in for its built-in variables; fixed values long enough for the samples a
# query over a range needs at the scrape interval below.
BUILT_IN_VARIABLES = {
    "__interval": "15s",
    "__interval_ms": "15000",
    "__rate_interval": "1m",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
# $name, ${name}, ${name:format} and [[name]], [[name:format]]: Grafana's ways of naming a variable.
GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)")
SCRAPE_INTERVAL = "1s"
HOLD_256_MIB = CUDA_PRELUDE + "\nprint(allocate(256 << 20))\n"
CUDA_SUCCESS = "0"

CLASSROOM = """
gpus: {count: 1, memory: 16GiB}
groups:
  students: [alice]
admins: [teacher]
sizes:
  - {name: small, memory: 2GiB, cores: 20, policy: burst, default: true, kernel: {memory: 1GiB, cores: 10}}
oversubscribe: true
idle: {suspend_after: 1h, suspend_host_memory: 8GiB}
"""


def expanded(expr: str, board: dict) -> str:
    """``expr`` with every Grafana variable replaced: the built-in ones by fixed values, the
    board's own by their current value (several: Grafana's regex for them, ``(a|b)``)."""
    values = dict(BUILT_IN_VARIABLES)
    for variable in board.get("templating", {}).get("list", []):
        current = variable.get("current", {}).get("value")
        if isinstance(current, list):
            current = "(" + "|".join(re.escape(value) for value in current) + ")"
        if current is not None:
            values[variable["name"]] = ".*" if current == "$__all" else str(current)

    def value(match: re.Match) -> str:
        name = next(group for group in match.groups() if group)
        if name not in values:
            raise AssertionError(f"{expr!r} names the variable ${name}, which the board does not define with a value")
        return values[name]

    return GRAFANA_VARIABLE.sub(value, expr)


def panel_targets(panels: list[dict]) -> list[tuple[str, dict]]:
    """(panel title, target) of every shown target, rows' panels included."""
    targets = []
    for panel in panels:
        targets += panel_targets(panel.get("panels", []))
        targets += [(panel["title"], target) for target in panel.get("targets", []) if not target.get("hide")]
    return targets


class Prometheus:
    """The `prometheus` binary on a free port of 127.0.0.1, scraping one job every second into a
    folder of its own: ``metrics_path`` of ``target`` (host:port) with the bearer ``token``, read
    from a file as docs/monitoring.md configures it."""

    def __init__(self, folder: Path, job_name: str, target: str, metrics_path: str, token: str):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(
                "prometheus not found: this test needs Debian's prometheus package "
                "(README.md's install block installs it as root)"
            )
        folder.mkdir()
        token_file = folder / "token"
        token_file.write_text(token)
        job = {
            "job_name": job_name,
            "metrics_path": metrics_path,
            "authorization": {"type": "token", "credentials_file": str(token_file)},
            "static_configs": [{"targets": [target]}],
        }
        config = folder / "prometheus.yml"
        # JSON is YAML: no YAML writer needed.
        interval = {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL}
        config.write_text(json.dumps({"global": interval, "scrape_configs": [job]}))
        self.url = f"http://127.0.0.1:{free_port()}/"
        self.targets_seen: list[tuple[str, str, str]] = []  # (job, health, last error) of each
        self.log = folder / "prometheus.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address={self.url[len('http://') : -1]}",
                ],
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(self.scraped_twice, 120, "Prometheus to scrape every target twice", interval=0.2)
        except BaseException:
            print(f"Prometheus' targets: {self.targets_seen}\n{self.log.read_text()[-4000:]}")
            self.stop()
            raise

    def api(self, path: str, **parameters: str):
        """The ``data`` of a GET api/v1/``path``. A refusal raises AssertionError with Prometheus'
        message, except 503 (an OSError), which it answers while it opens its storage."""
        url = f"{self.url}api/v1/{path}?{urllib.parse.urlencode(parameters)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                return json.loads(reply.read())["data"]
        except urllib.error.HTTPError as error:
            if error.code == 503:
                raise
            raise AssertionError(f"{path} {parameters}: {error.code} {error.read().decode()}") from None

    def scraped_twice(self) -> bool:
        """Whether every target is up and scraped twice (a query over a range needs two samples)."""
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.process.returncode}):\n{self.log.read_text()[-4000:]}")
        try:
            targets = self.api("targets")["activeTargets"]
            self.targets_seen = [(target["labels"]["job"], target["health"], target["lastError"]) for target in targets]
            if not targets or any(target["health"] != "up" for target in targets):
                return False
            scrapes = self.query("count_over_time(up[5m])")
        except OSError:
            return False
        return len(scrapes) == len(targets) and all(float(series["value"][1]) >= 2 for series in scrapes)

    def query(self, expr: str) -> list[dict]:
        """The series an instant query answers (``/api/v1/query``, as Grafana asks)."""
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def misread(board_file: str, prometheus: Prometheus) -> list[str]:
    """What the board's panels would not show, each with its panel's title: a query that returns
    no series, and a label its legend names that none of the query's series carries."""
    board = json.loads((BOARDS / board_file).read_text())
    targets = panel_targets(board["panels"])
    assert targets, f"{board_file} has no panel query"
    problems = []
    for title, target in targets:
        series = prometheus.query(expanded(target["expr"], board))
        shown = set(re.findall(r"{{\s*(\w+)\s*}}", target.get("legendFormat", "")))
        carried = {label for one in series for label, value in one["metric"].items() if value}
        if not series:
            problems.append(f"{title}: {target['expr']} returns no series")
        elif shown - carried:
            problems.append(f"{title}: no series of {target['expr']} carries {sorted(shown - carried)}")
    return problems


def test_every_board_is_checked_here():
    """A new board must say here which source it is for."""
    assert sorted(path.name for path in BOARDS.glob("*.json")) == sorted(
        ["jupyter-vgpu-server.json", "jupyter-vgpu-classroom.json"]
    )


def test_every_query_of_the_server_board_returns_series_from_a_real_servers_metrics(tmp_path, sim_env):
    server = VGPUServer(tmp_path / "server", sim_env)
    prometheus = None
    try:
        kernel = server.api("POST", "api/kernels", {"name": server.kernel_name})["id"]
        client = server.kernel_client(kernel)
        try:
            # Its iopub connected first, or the cell's idle status can be missed (CI timed out so).
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(HOLD_256_MIB, timeout=60, output_hook=lambda message: None)
            assert reply["content"]["status"] == "ok", reply
        finally:
            client.stop_channels()
        for action in ("suspend", "resume"):
            server.api("POST", f"api/vgpu/slices/{kernel}/{action}", {})
        prometheus = Prometheus(
            tmp_path / "prometheus", "jupyter-vgpu", f"127.0.0.1:{server.port}", "/api/vgpu/metrics", server.token
        )
        assert not misread("jupyter-vgpu-server.json", prometheus)
    finally:
        if prometheus:
            prometheus.stop()
        server.stop()


def test_every_query_of_the_classroom_board_returns_series_from_a_real_brokers_metrics(tmp_path):
    hub = Hub(tmp_path, CLASSROOM)
    prometheus = None
    try:
        alice, teacher = hub.user_token("alice"), hub.user_token("teacher")
        hub.start_server("alice", {})
        status, reply = hub.start_kernel("alice", alice)
        assert status == 201, reply
        kernel = reply["id"]
        assert run_in_hub_kernel(hub, "alice", kernel, HOLD_256_MIB).strip() == CUDA_SUCCESS
        for action in ("suspend", "resume"):
            status, reply = hub.server("alice", alice, "POST", f"api/vgpu/slices/{kernel}/{action}", {})
            assert status == 200, reply
        prometheus = Prometheus(
            tmp_path / "prometheus", "jupyter-vgpu-broker", f"127.0.0.1:{hub.port}", "/services/vgpu/metrics", teacher
        )
        assert not misread("jupyter-vgpu-classroom.json", prometheus)
    finally:
        if prometheus:
            prometheus.stop()
        hub.stop()
