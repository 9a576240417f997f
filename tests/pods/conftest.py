"""Pod kernels through a real Jupyter server against a real Kubernetes control plane
(tests/cluster: kube-apiserver, etcd, kube-controller-manager, kube-scheduler, KWOK).

Each test has a namespace of its own, where the server talks to the API as the ServiceAccount
``jupyter`` bound to exactly docs/kubernetes.md's Role, and a node of its own whose pods the
tests' node agent runs as local processes (tests/cluster/node_agent.py); the test's kernel pods
select that node, so that tests never see each other's pods or room.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from node_agent import GPU
from support import free_port, vgpu_server_config

POD_KERNEL = "vgpu-pod-test"
OWNER = "ada"
POD_SIM_DEVICES = "name=Sim Pod GPU,memory=8GiB,sms=100,context_memory=0"
NODE_GPU_MIB = 8192


async def until(condition, what: str, timeout: float = 60.0):
    """Await ``condition()`` (a coroutine function) until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await condition()):
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout} s"
        await asyncio.sleep(0.05)
    return value


@pytest.fixture
def pod_node(node_agent, kube, tmp_path, monkeypatch):
    """The test's node: one simulated 8 GiB GPU (as the pods' simulated driver sees it too)."""
    monkeypatch.setenv("VGPU_SIM_STATE", str(tmp_path / "pod-sim.state"))
    monkeypatch.setenv("VGPU_SIM_DEVICES", POD_SIM_DEVICES)
    return node_agent(gpus=[GPU("GPU-pod-node-0", NODE_GPU_MIB)])


@pytest.fixture
def pod_ports():
    return [free_port() for _ in range(5)]


@pytest.fixture
def pod_provisioner_config(pod_ports, kube, pod_node):
    """The pod provisioner's settings for these tests (a kernelspec's ``config`` may add more)."""
    return {
        "image": "registry.example.org/kernels/test:1",
        "python": sys.executable,  # the "image" is this machine, as the node agent runs pods here
        "kernel_ports": pod_ports,
        "simulate": True,
        "owner": OWNER,
        "namespace": kube.namespace,
        "node_selector": {"kubernetes.io/hostname": pod_node.name},
        "poll_interval": 0.05,
        "report_interval": 0.2,
        "start_timeout": 60.0,
    }


@pytest.fixture
def jp_server_config(kube, native_libs, tmp_path, pod_provisioner_config):
    # The server itself has no GPU (local_gpus is False): its kernels are pods.
    return vgpu_server_config(tmp_path, local_gpus=False, max_memory="16GiB") | {
        "VGPUPodProvisioner": pod_provisioner_config
    }


@pytest.fixture
def make_pod_kernelspec(jp_data_dir):
    """make_pod_kernelspec(name, **config) -> a pod kernelspec whose provisioner config adds ``config``."""

    def make(name: str, **config) -> str:
        folder = jp_data_dir / "kernels" / name
        folder.mkdir(parents=True)
        provisioner = {
            "provisioner_name": "vgpu-pod-provisioner",
            "config": {"memory": "1GiB", "cores": "30", **config},
        }
        (folder / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": f"Python 3 (GPU pod, {name})",
                    "language": "python",
                    "interrupt_mode": "message",
                    "metadata": {"kernel_provisioner": provisioner},
                }
            )
        )
        return name

    return make


@pytest.fixture
def pod_kernelspec(make_pod_kernelspec):
    return make_pod_kernelspec(POD_KERNEL)
