"""Pod kernels outlive their server (a real server process, SIGKILLed, on the real control plane):
the restarted server adopts its live kernel pods with the same kernel ids (from their labels, the
ledger and their connection Secret), the notebook reaches the same kernel with its variables over
the server's websocket, the in-pod agent's usage reports resume; a pod whose kernel died while no
server ran is cleaned up and reported, one deleted meanwhile is reported; every request stays
within the documented Role."""

from __future__ import annotations

import os
import signal

from conftest import POD_SIM_DEVICES
from pod_server import KERNEL, PodServer, pod_server_env, write_pod_server_config
from support import free_port, wait_for
from test_rbac import requests_beyond_the_documented_role

from jupyter_vgpu.pods.manifest import KERNEL_LABEL


def kernel_pod(kube, kernel_id: str) -> dict:
    (pod,) = [pod for pod in kube.pods() if pod["metadata"].get("labels", {}).get(KERNEL_LABEL) == kernel_id]
    return pod


def test_a_restarted_server_adopts_its_live_kernel_pods_and_reports_the_ones_gone(
    kube, pod_node, tmp_path, monkeypatch, cuda_prelude
):
    monkeypatch.setenv("VGPU_SIM_STATE", str(tmp_path / "pod-sim.state"))
    monkeypatch.setenv("VGPU_SIM_DEVICES", POD_SIM_DEVICES)
    port = free_port()
    write_pod_server_config(
        tmp_path,
        namespace=kube.namespace,
        server_url=f"http://127.0.0.1:{port}/",
        ports=[free_port() for _ in range(5)],
        node_selector={"kubernetes.io/hostname": pod_node.name},
        poll_interval=0.1,
    )
    env = pod_server_env(tmp_path, kube.kubeconfig)
    server = PodServer(tmp_path, env, port)
    try:
        kept, died, deleted = (
            server.api("POST", "api/vgpu/kernels", {"name": KERNEL})["kernel"]["id"] for _ in range(3)
        )
        session = server.api("POST", "api/sessions", {"path": "work.ipynb", "type": "notebook", "kernel": {"id": kept}})
        assert server.run_over_websocket(kept, cuda_prelude + "x = allocate(256 << 20)\nprint('set', x)") == "set 0\n"
        pods = {kernel_id: kernel_pod(kube, kernel_id)["metadata"]["name"] for kernel_id in (kept, died, deleted)}
        server.kill()

        # While no server runs: one kernel dies in its pod, another pod is deleted from outside.
        (running,) = [r for r in pod_node.pods.values() if r.name == pods[died]]
        os.killpg(running.process.pid, signal.SIGKILL)
        wait_for(lambda: kernel_pod(kube, died)["status"]["phase"] == "Failed", 30, "the dead kernel's pod Failed")
        kube.delete_pod(pods[deleted], grace_seconds=0)

        with PodServer(tmp_path, env, port) as restarted:
            assert [kernel["id"] for kernel in restarted.api("GET", "api/kernels")] == [kept]
            (listed,) = restarted.api("GET", "api/vgpu/slices")
            assert (listed["kernel_id"], listed["holder"], listed["location"]["pod"]) == (kept, "pod", pods[kept])
            # The notebook's session is there, with the same kernel: it reconnects, no restart.
            (row,) = restarted.api("GET", "api/sessions")
            assert (row["id"], row["kernel"]["id"]) == (session["id"], kept)
            assert restarted.run_over_websocket(kept, "print(x, memory()[0] < memory()[1])") == "0 True\n"

            # The in-pod agent reports to the restarted server: usage and state come back.
            def reported() -> bool:
                (model,) = restarted.api("GET", "api/vgpu/slices")
                return model["state"] == "running" and model["usage"]["memory_bytes"] >= 256 << 20

            wait_for(reported, 30, "the in-pod agent's reports to the restarted server")

            # The pod whose kernel died is cleaned up; both lost kernels are reported in the log.
            wait_for(
                lambda: [p for p in kube.pods() if p["metadata"]["name"] == pods[died]] == [],
                30,
                "the dead pod removed",
            )
            log = (tmp_path / "server.log").read_text()
            assert (
                f"kernel {died} ended while no server ran (the kernel's container failed on node {pod_node.name}" in log
            )
            assert (
                f"kernel {deleted} ended while no server ran (the kernel's pod no longer exists (it was deleted))"
                in log
            )

            restarted.api("DELETE", f"api/kernels/{kept}")
            wait_for(lambda: kube.pods() == [], 30, "the kept kernel's pod deleted at shutdown")
            assert kube.secrets() == [s for s in kube.secrets() if not s["metadata"]["name"].startswith("jvgpu-")]
        assert requests_beyond_the_documented_role(kube)[0] == []
    finally:
        server.stop()
