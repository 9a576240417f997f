"""A real `jupyter server` process whose kernels are pods on the tests' control plane, as a user
runs it, and a notebook's way to run a cell on one of its kernels (the server's websocket).

Used by the adoption test (tests/pods/test_adoption.py) and by benchmarks/pod_start.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import threading
import uuid
from pathlib import Path

from support import JupyterProcess

TOKEN = "pod-server-token"
KERNEL = "vgpu-pod"


def write_pod_server_config(
    folder: Path,
    *,
    namespace: str,
    server_url: str,
    ports: list[int],
    node_selector: dict[str, str] | None = None,
    memory: str = "1GiB",
    cores: int = 20,
    **provisioner,
) -> None:
    """The server's config (only pod kernels, its ledger in ``folder``) and a pod kernelspec
    ``KERNEL`` of ``memory`` and ``cores`` (percent of a GPU's SMs: the scheduler counts them
    too, 100 per GPU); ``provisioner`` adds VGPUPodProvisioner settings."""
    config = folder / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "VGPUApp": {
                    "local_gpus": False,
                    "ledger_path": str(folder / "ledger.sqlite"),
                    "region_dir": str(folder / "regions"),
                    "max_memory": "64GiB",
                },
                "VGPUPodProvisioner": {
                    "image": "registry.example.org/kernels/test:1",
                    "python": sys.executable,  # the "image" is this machine: the node agent runs pods here
                    "kernel_ports": ports,
                    "simulate": True,
                    "owner": "ada",
                    "namespace": namespace,
                    "node_selector": node_selector or {},
                    "report_interval": 0.2,
                    "server_url": server_url,
                    **provisioner,
                },
            }
        )
    )
    spec = folder / "data" / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (GPU pod)",
                "language": "python",
                "interrupt_mode": "message",
                "metadata": {
                    "kernel_provisioner": {
                        "provisioner_name": "vgpu-pod-provisioner",
                        "config": {"memory": memory, "cores": str(cores)},
                    }
                },
            }
        )
    )


def pod_server_env(folder: Path, kubeconfig: Path) -> dict[str, str]:
    """A user's environment for the server: this one's, less what belongs to the tests."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VGPU_", "JUPYTER_", "LD_PRELOAD", "PYTEST", "KUBERNETES_SERVICE"))
    }
    env.update(
        KUBECONFIG=str(kubeconfig),
        JUPYTER_CONFIG_DIR=str(folder / "config"),
        JUPYTER_DATA_DIR=str(folder / "data"),
        JUPYTER_RUNTIME_DIR=str(folder / "runtime"),
    )
    return env


@functools.cache
def _client_loop() -> asyncio.AbstractEventLoop:
    """One event loop, in a thread of its own, for every websocket of this process: tornado keeps
    its connections' state per loop, and a loop made and closed per cell (asyncio.run) left the
    connections of earlier loops counted, until new ones timed out before reaching the server."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True, name="websocket-clients").start()
    return loop


class PodServer(JupyterProcess):
    """`jupyter server` on a port kept across its restarts (kernel pods report to the URL they
    were given, as to a Service's name in a cluster)."""

    def __init__(self, folder: Path, env: dict[str, str], port: int, timeout: float = 120):
        super().__init__(
            env, folder / "server.log", TOKEN, f"--ServerApp.root_dir={folder}", port=port, timeout=timeout
        )

    def slice_of(self, kernel_id: str) -> dict:
        """The kernel's item of GET /api/vgpu/slices."""
        (model,) = [item for item in self.api("GET", "api/vgpu/slices") if item["kernel_id"] == kernel_id]
        return model

    def run_over_websocket(self, kernel_id: str, code: str, timeout: float = 60) -> str:
        """Run ``code`` as a cell through the server's websocket for the kernel, as JupyterLab
        does; what it printed."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        async def run() -> str:
            # A server busy adopting or starting kernels may take a while to answer: as long as the cell.
            socket = await websocket_connect(
                HTTPRequest(
                    f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?token={TOKEN}",
                    connect_timeout=timeout,
                    request_timeout=timeout,
                )
            )
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "session": uuid.uuid4().hex,
                "username": "user",
                "version": "5.3",
            }
            content = {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
            }
            message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
            await socket.write_message(json.dumps(message))
            printed: list[str] = []
            replied = idle = False
            try:
                # Done once the shell's reply and the iopub's idle status both came: the output
                # (iopub) may come after the reply (shell), as each channel goes its own way.
                while not (replied and idle):
                    raw = await asyncio.wait_for(socket.read_message(), timeout)
                    if raw is None:
                        raise AssertionError("the kernel's websocket closed")
                    reply = json.loads(raw)
                    if reply.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    if reply["msg_type"] == "stream":
                        printed.append(reply["content"]["text"])
                    if reply["msg_type"] == "execute_reply":
                        if reply["content"]["status"] != "ok":
                            raise AssertionError(reply["content"])
                        replied = True
                    if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                        idle = True
            finally:
                socket.close()
            return "".join(printed)

        return asyncio.run_coroutine_threadsafe(run(), _client_loop()).result()
