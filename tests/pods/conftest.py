"""Pod kernels through a real Jupyter server against a stand-in Kubernetes API (tests/kube_standin.py
says what the stand-in is and where it falls short of a cluster); tests say so in their names
(``..._against_standin``)."""

from __future__ import annotations

import json
import sys

import pytest
from kube_standin import OWNER, POD_KERNEL, POD_SIM_DEVICES, Kubelet, Scheduler, StandIn
from support import vgpu_server_config


@pytest.fixture
def standin(tmp_path, monkeypatch):
    cluster = StandIn(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield cluster
    cluster.close()


# -- a real Jupyter server whose GPU kernels are pods ---------------------------------------------


@pytest.fixture
def pod_ports():
    from support import free_port

    return [free_port() for _ in range(5)]


@pytest.fixture
def pod_provisioner_config(pod_ports):
    """The pod provisioner's settings for these tests (a kernelspec's ``config`` may add more)."""
    return {
        "image": "registry.example.org/kernels/standin:1",
        "python": sys.executable,  # the "image" is this machine, as the Kubelet runs pods here
        "kernel_ports": pod_ports,
        "simulate": True,
        "owner": OWNER,
        "poll_interval": 0.05,
        "report_interval": 0.2,
        "start_timeout": 60.0,
    }


@pytest.fixture
def jp_server_config(standin, native_libs, tmp_path, monkeypatch, pod_provisioner_config):
    # The pods' simulated GPU (the server itself has none: local_gpus is False).
    monkeypatch.setenv("VGPU_SIM_STATE", str(tmp_path / "pod-sim.state"))
    monkeypatch.setenv("VGPU_SIM_DEVICES", POD_SIM_DEVICES)
    return vgpu_server_config(tmp_path, local_gpus=False, max_memory="6GiB") | {
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


@pytest.fixture
def kubelet(standin, tmp_path):
    node = Kubelet(standin, tmp_path / "node", {})
    node.folder.mkdir()
    node.start()
    yield node
    node.stop()
    assert not node.errors, node.errors


@pytest.fixture
def scheduler(standin):
    started = []

    def start(act):
        thread = Scheduler(standin, act)
        thread.start()
        started.append(thread)
        return thread

    yield start
    for thread in started:
        thread.stopped.set()
        thread.join(10)
        assert not thread.errors, thread.errors
