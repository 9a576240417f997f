"""pytest fixtures for the real control plane (a plugin: tests/conftest.py lists it).

- ``control_plane``: one per test session (and per xdist worker): etcd, kube-apiserver,
  kube-controller-manager, kube-scheduler and KWOK on loopback (tests/cluster/control_plane.py).
  The binaries come from ``python tests/cluster/build.py`` (README's install block); without
  them the tests that need a cluster fail, saying so.
- ``kube``: one test's corner of it: a namespace of its own, the Jupyter server's ServiceAccount
  there bound to exactly the Role docs/kubernetes.md gives (the server talks to the API with
  that account's token, through ``$KUBECONFIG``), and helpers to read what is there.
- ``node_agent``: ``node_agent(name, gpus=..., **kw)`` starts a test agent's node
  (tests/cluster/node_agent.py) whose pods run as local processes; stopped after the test.
- ``kwok_nodes``: ``kwok_nodes(count, gpus=...)`` adds GPU nodes KWOK plays (placement only).
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build
from control_plane import KWOK_ANNOTATION, ControlPlane
from node_agent import GPU, NodeAgent, gpu_node

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
SERVER_ACCOUNT = "jupyter"


def binaries() -> Path:
    folder = build.cache_folder()
    gone = build.missing(folder)
    if gone:
        pytest.fail(
            f"the tests' Kubernetes control plane is not built ({', '.join(gone)} missing in {folder}): "
            "run `python tests/cluster/build.py` (README's install block does)",
            pytrace=False,
        )
    return folder


def documented(section: str, kinds: tuple[str, ...]) -> list[dict]:
    """The YAML documents of ``kinds`` in docs/kubernetes.md's section ``section`` (its ``## `` heading)."""
    import yaml

    text = DOCS.read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```yaml\n(.*?)```", text[start : end if end > 0 else None], re.DOTALL)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc and doc.get("kind") in kinds]


class Kube:
    """One test's namespace on the control plane, and the server's identity there."""

    def __init__(self, plane: ControlPlane, namespace: str, folder: Path):
        from kubernetes import client

        self.plane, self.namespace = plane, namespace
        self.admin = plane.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.rbac = client.RbacAuthorizationV1Api(self.admin)
        self.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
        self.core.create_namespaced_service_account(
            namespace, {"metadata": {"name": SERVER_ACCOUNT}}, _preload_content=False
        )
        self.role = self.apply_documented_role()
        self.node_reader = self.apply_documented_cluster_role()
        self.kubeconfig = plane.token_kubeconfig(f"server-{namespace}", self.token(SERVER_ACCOUNT))

    def apply_documented_role(self, drop: tuple[str, str] | None = None) -> dict:
        """docs/kubernetes.md's Role and RoleBinding, in this namespace for this namespace's
        ``jupyter`` account; ``drop=(resource, verb)`` leaves one verb out. The Role as applied."""
        for document in documented("RBAC", ("Role", "RoleBinding")):
            document["metadata"]["namespace"] = self.namespace
            if document["kind"] == "Role":
                for rule in document["rules"]:
                    if drop and drop[0] in rule["resources"]:
                        rule["verbs"] = [verb for verb in rule["verbs"] if verb != drop[1]]
                self._replace(self.rbac.create_namespaced_role, self.rbac.replace_namespaced_role, document)
                role = document
            else:
                document["subjects"] = [dict(subject) for subject in document["subjects"]]
                for subject in document["subjects"]:
                    subject["namespace"] = self.namespace
                self._replace(
                    self.rbac.create_namespaced_role_binding, self.rbac.replace_namespaced_role_binding, document
                )
        return role

    def apply_documented_cluster_role(self) -> str:
        """docs/kubernetes.md's optional ClusterRole (reading nodes), bound to this namespace's
        ``jupyter`` account by a binding named for the namespace; the binding's name."""
        from kubernetes import client

        binding = ""
        for document in documented("RBAC", ("ClusterRole", "ClusterRoleBinding")):
            if document["kind"] == "ClusterRole":
                try:
                    self.rbac.create_cluster_role(document, _preload_content=False)
                except client.ApiException as error:
                    if error.status != 409:
                        raise
            else:
                binding = document["metadata"]["name"] = f"{document['metadata']['name']}-{self.namespace}"
                for subject in document["subjects"]:
                    subject["namespace"] = self.namespace
                self.rbac.create_cluster_role_binding(document, _preload_content=False)
        return binding

    def _replace(self, create, replace, document: dict) -> None:
        from kubernetes import client

        try:
            create(self.namespace, document, _preload_content=False)
        except client.ApiException as error:
            if error.status != 409:
                raise
            replace(document["metadata"]["name"], self.namespace, document, _preload_content=False)

    def token(self, account: str) -> str:
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        }
        reply = self.core.create_namespaced_service_account_token(
            account, self.namespace, request, _preload_content=False
        )
        return str(json.loads(reply.data)["status"]["token"])

    # -- reading what is there, as the cluster admin -----------------------------------------------

    def pods(self) -> list[dict]:
        return list(json.loads(self.core.list_namespaced_pod(self.namespace, _preload_content=False).data)["items"])

    def pod(self, name: str) -> dict | None:
        return self._read_or_none(self.core.read_namespaced_pod, name)

    def secret(self, name: str) -> dict | None:
        return self._read_or_none(self.core.read_namespaced_secret, name)

    def secrets(self) -> list[dict]:
        return list(json.loads(self.core.list_namespaced_secret(self.namespace, _preload_content=False).data)["items"])

    def _read_or_none(self, read, name: str) -> dict | None:
        from kubernetes.client import ApiException

        try:
            return json.loads(read(name, self.namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def delete_pod(self, name: str, grace_seconds: int | None = None) -> None:
        extra = {} if grace_seconds is None else {"grace_period_seconds": grace_seconds}
        self.core.delete_namespaced_pod(name, self.namespace, _preload_content=False, **extra)

    def close(self) -> None:
        from kubernetes.client import ApiException

        try:
            self.rbac.delete_cluster_role_binding(self.node_reader, _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                raise
        try:
            self.core.delete_namespace(self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), binaries()).start()
    yield plane
    plane.stop()


@pytest.fixture
def kube(control_plane, tmp_path, monkeypatch):
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    corner = Kube(control_plane, namespace, tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(corner.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield corner
    corner.close()
    control_plane.check()


@pytest.fixture
def node_agent(control_plane, tmp_path):
    started: list[NodeAgent] = []

    def start(name: str = "", *, gpus: list[GPU] | None = None, **kwargs) -> NodeAgent:
        name = name or f"agent-{uuid.uuid4().hex[:8]}"
        agent = NodeAgent(
            control_plane,
            name,
            tmp_path / "nodes" / name,
            gpus=gpus or [GPU(f"GPU-{name}-0", 8192)],
            address_base=2 + 40 * len(started),
            **kwargs,
        )
        agent.start()
        started.append(agent)
        return agent

    yield start
    errors = []
    for agent in started:
        agent.stop()
        errors += agent.errors
    assert not errors, errors


@pytest.fixture
def kwok_nodes(control_plane):
    from kubernetes import client

    core = client.CoreV1Api(control_plane.api_client())
    made: list[str] = []

    def add(count: int, *, gpus: int = 2, memory_mib: int = 81920, prefix: str = "", labels=None) -> list[str]:
        prefix = prefix or f"kwok-{uuid.uuid4().hex[:6]}"
        names = []
        for index in range(count):
            name = f"{prefix}-{index}"
            node = gpu_node([GPU(f"GPU-{name}-{gpu}", memory_mib) for gpu in range(gpus)])
            core.create_node(
                {
                    "metadata": {
                        "name": name,
                        "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
                        "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1], **node["annotations"]},
                    },
                    "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
                    "status": {"capacity": node["capacity"], "allocatable": node["capacity"]},
                },
                _preload_content=False,
            )
            names.append(name)
        made.extend(names)
        return names

    yield add
    for name in made:
        try:
            core.delete_node(name, _preload_content=False)
        except client.ApiException:
            pass
