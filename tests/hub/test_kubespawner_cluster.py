"""The classroom's profiles on a real cluster: a real JupyterHub with KubeSpawner (PyPI), configured
by ``jupyter_vgpu.hub.configure``, spawns each student's single-user pod on the tests' real
kube-apiserver; Kubernetes' own scheduler places the pods by the profile's GPU resources on GPU
nodes KWOK plays, never promising a node's GPU memory twice, and a profile that does not fit now
shows the scheduler's reason in the spawn's progress. KWOK's pods run no process, so no
single-user server answers: the tests stop at what the cluster decides."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from hub_process import DRIVER_TOKEN, Hub
from support import wait_for

CLASSROOM = """
gpus: {count: 3, memory: 16GiB}
groups: {students: [s1, s2, s3]}
sizes:
  - {name: big, memory: 12GiB, cores: 50, groups: [students], default: true}
  - {name: small, memory: 2GiB, cores: 10, groups: [students]}
"""


@pytest.fixture
def hub_on_cluster(tmp_path, control_plane, kube, kwok_nodes, monkeypatch):
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    nodes = kwok_nodes(2, gpus=1, memory_mib=16384, labels={"jupyter-vgpu.io/pool": pool})
    # The hub is the cluster's admin here, as Zero to JupyterHub's hub has a role for its pods.
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    extra = f"""
    c.KubeSpawner.namespace = {kube.namespace!r}
    c.KubeSpawner.node_selector = {{"jupyter-vgpu.io/pool": {pool!r}}}
    c.KubeSpawner.tolerations = [{{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}}]
    c.KubeSpawner.image = "quay.io/jupyterhub/k8s-singleuser-sample:4.0.0"
    c.KubeSpawner.start_timeout = 600
    c.KubeSpawner.events_enabled = True
    """
    hub = Hub(tmp_path, CLASSROOM, extra_config=extra, spawner="kubernetes")
    try:
        yield hub, nodes
    finally:
        for name in ("s1", "s2", "s3"):
            hub.hub("DELETE", f"users/{name}/server", expect=(202, 204, 400, 404))
        hub.stop()


def spawn(hub: Hub, name: str, profile: str) -> None:
    hub.hub("POST", "users", {"usernames": [name]}, expect=(201, 409))
    hub.hub("POST", f"users/{name}/server", {"profile": profile}, expect=(201, 202))


def student_pod(kube, name: str) -> dict | None:
    return kube.pod(f"jupyter-{name}")


def progress_until(hub: Hub, name: str, words: str, timeout: float = 60) -> list[str]:
    """The spawn's progress messages (the hub's event stream, as the spawn page reads it) up to the
    first that holds ``words``."""
    request = urllib.request.Request(
        f"{hub.api}users/{name}/server/progress", headers={"Authorization": f"token {DRIVER_TOKEN}"}
    )
    seen = []
    with urllib.request.urlopen(request, timeout=timeout) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            message = json.loads(line[5:]).get("message", "")
            seen.append(message)
            if words in message:
                return seen
    raise AssertionError(f"no progress message with {words!r}: {seen}")


def test_students_are_placed_by_their_profiles_gpu_memory_and_one_that_does_not_fit_sees_why(hub_on_cluster, kube):
    hub, nodes = hub_on_cluster
    spawn(hub, "s1", "big")
    spawn(hub, "s2", "big")
    for name in ("s1", "s2"):
        wait_for(
            lambda name=name: (student_pod(kube, name) or {}).get("spec", {}).get("nodeName"), 60, f"{name} placed"
        )
    pods = {name: student_pod(kube, name) for name in ("s1", "s2")}
    (container,) = pods["s1"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpumem"] == "12288"
    assert container["resources"]["limits"]["nvidia.com/gpucores"] == "50"
    # 12 GiB each on nodes of 16: the scheduler never puts both on one node.
    assert {pod["spec"]["nodeName"] for pod in pods.values()} == set(nodes)

    spawn(hub, "s3", "big")
    seen = progress_until(hub, "s3", "Insufficient nvidia.com/gpumem")
    assert any("0/" in message and "nodes are available" in message for message in seen), seen
    assert not (student_pod(kube, "s3") or {}).get("spec", {}).get("nodeName")

    # The small profile still fits beside a big one: 12 + 2 of 16 GiB.
    hub.hub("DELETE", "users/s3/server", expect=(202, 204))
    wait_for(lambda: student_pod(kube, "s3") is None, 60, "s3's pod gone")
    spawn(hub, "s3", "small")
    wait_for(lambda: (student_pod(kube, "s3") or {}).get("spec", {}).get("nodeName"), 60, "s3 placed with small")
