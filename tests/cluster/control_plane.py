"""A real Kubernetes control plane on loopback, for the tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK, built from Kubernetes' own Go modules by
``tests/cluster/build.py``.

- etcd keeps the cluster's state (in the control plane's folder; no fsync: a test cluster).
- kube-apiserver serves TLS with a certificate of this control plane's own CA, authenticates
  client certificates and ServiceAccount tokens (signed with the control plane's key pair),
  authorises with the Node and RBAC authorizers, and runs its default admission plugins plus
  NodeRestriction, as a cluster made with kubeadm does.
- kube-controller-manager runs its default controllers: the garbage collector (a Secret goes with
  the pod that owns it), namespaces, ServiceAccounts and their tokens, node lifecycle.
- kube-scheduler is Kubernetes' default scheduler: it counts extended resources
  (``nvidia.com/gpu``, ``nvidia.com/gpumem``, ``nvidia.com/gpucores``) per node, as advertised in
  a node's status. It does not place per GPU as HAMi's scheduler extender does (docs/kubernetes.md).
- KWOK plays the nodes annotated ``kwok.x-k8s.io/node=fake``: they turn Ready and keep their
  Lease, and pods bound to them "run" without a process (KWOK's own published stages).

Pods that must really run go to a node of a test agent (tests/cluster/node_agent.py). Everything
listens on 127.0.0.1 only, on ports free when it starts.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from certs import CertificateAuthority, KeyPair, service_account_keys

HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_kubeconfig(path: Path, server: str, ca: Path, *, pair: KeyPair | None = None, token: str = "") -> Path:
    user: dict[str, str] = (
        {"token": token} if token else {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    )  # type: ignore[union-attr]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
                "users": [{"name": "user", "user": user}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
                "current-context": "test",
            }
        )
    )
    path.chmod(0o600)
    return path


@dataclass
class Component:
    name: str
    process: subprocess.Popen
    log: Path

    def check(self) -> None:
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; the end of its log:\n{tail}")


class ControlPlane:
    """Start with :meth:`start`, stop with :meth:`stop`; ``kubeconfig`` is the cluster admin's."""

    def __init__(self, folder: Path, binaries: Path):
        self.folder, self.binaries = folder, binaries
        folder.mkdir(parents=True, exist_ok=True)
        self.components: list[Component] = []
        self.ca = CertificateAuthority(folder / "pki")
        self.sa_keys = service_account_keys(folder / "pki")
        self.port = free_port()
        self.url = f"https://{HOST}:{self.port}"
        self.kubeconfig = self.kubeconfig_for("admin", "kubernetes-admin", ("system:masters",))
        # Every request of a ServiceAccount, as the API server saw and answered it (tests read it
        # to check that an account needed no more than its Role).
        self.audit_log = folder / "audit.log"

    # -- identities ----------------------------------------------------------------------------

    def kubeconfig_for(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for a client certificate of ``user`` in ``groups``."""
        pair = self.ca.issue(name, user, organizations=groups)
        return write_kubeconfig(self.folder / f"{name}.kubeconfig", self.url, self.ca.cert, pair=pair)

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that presents a bearer token (a ServiceAccount's)."""
        return write_kubeconfig(self.folder / f"{name}.kubeconfig", self.url, self.ca.cert, token=token)

    def api_client(self, kubeconfig: Path | None = None):
        """An official ``kubernetes`` ApiClient for ``kubeconfig`` (the admin's by default)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig or self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)

    # -- processes -----------------------------------------------------------------------------

    def _run(self, name: str, *args: str) -> Component:
        log = self.folder / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [str(self.binaries / name), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        component = Component(name, process, log)
        self.components.append(component)
        return component

    def start(self, timeout: float = 120.0) -> ControlPlane:
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        pki = self.folder / "pki"
        etcd_port, peer_port = free_port(), free_port()
        etcd = self._run(
            "etcd",
            "--name=test",
            f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls=http://{HOST}:{etcd_port}",
            f"--advertise-client-urls=http://{HOST}:{etcd_port}",
            f"--listen-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-advertise-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-cluster=test=http://{HOST}:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            server_ips=(HOST, "10.96.0.1"),
        )
        policy = self.folder / "audit-policy.yaml"
        policy.write_text(
            json.dumps(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
                }
            )
        )
        apiserver = self._run(
            "kube-apiserver",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            f"--etcd-servers=http://{HOST}:{etcd_port}",
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--cert-dir={pki}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
        )
        self._wait_ready(apiserver, etcd, deadline)
        controllers = self.kubeconfig_for("controller-manager", "system:kube-controller-manager")
        self._run(
            "kube-controller-manager",
            f"--kubeconfig={controllers}",
            f"--authentication-kubeconfig={controllers}",
            f"--authorization-kubeconfig={controllers}",
            f"--bind-address={HOST}",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_keys.key}",
            f"--root-ca-file={self.ca.cert}",
            f"--cert-dir={pki / 'controller-manager'}",
            "--profiling=false",
        )
        scheduler = self.kubeconfig_for("scheduler", "system:kube-scheduler")
        self._run(
            "kube-scheduler",
            f"--kubeconfig={scheduler}",
            f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            f"--bind-address={HOST}",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            f"--cert-dir={pki / 'scheduler'}",
            "--profiling=false",
        )
        kwok = self.kubeconfig_for("kwok", "kwok-controller", ("system:masters",))
        self._run(
            "kwok",
            f"--kubeconfig={kwok}",
            f"--config={self.binaries / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
            "--cidr=10.244.0.1/16",
            "--node-ip=10.0.0.1",
            f"--server-address={HOST}:{free_port()}",
        )
        self._wait_for_default_service_account(deadline)

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        admin = self.folder / "pki"
        context.load_cert_chain(admin / "admin.crt", admin / "admin.key")
        return context

    def _wait_ready(self, apiserver: Component, etcd: Component, deadline: float) -> None:
        context = self._ssl_context()
        last = ""
        while time.monotonic() < deadline:
            etcd.check()
            apiserver.check()
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError) as error:
                last = str(error)
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready at {self.url}/readyz: {last}")

    def _wait_for_default_service_account(self, deadline: float) -> None:
        """Pods are admitted only once their namespace's ServiceAccount exists (the ServiceAccount
        admission plugin), which the controller-manager makes: a started cluster has it."""
        from kubernetes import client

        core = client.CoreV1Api(self.api_client())
        while time.monotonic() < deadline:
            for component in self.components:
                component.check()
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except client.ApiException as error:
                if error.status != 404:
                    raise
            time.sleep(0.2)
        raise TimeoutError("the controller-manager made no ServiceAccount 'default' in time")

    def audit_events(self, user: str) -> list[dict]:
        """The audit log's events of ``user`` (a ServiceAccount's full name), oldest first."""
        if not self.audit_log.is_file():
            return []
        events = (json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip())
        return [event for event in events if event.get("user", {}).get("username") == user]

    def check(self) -> None:
        """Raise where a component has exited (with the end of its log)."""
        for component in self.components:
            component.check()

    def stop(self) -> None:
        for component in reversed(self.components):
            if component.process.poll() is None:
                os.killpg(component.process.pid, signal.SIGTERM)
        for component in reversed(self.components):
            try:
                component.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(component.process.pid, signal.SIGKILL)
                component.process.wait()
        self.components.clear()
