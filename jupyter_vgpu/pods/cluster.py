"""The Kubernetes API as the pod kernels need it, through the official ``kubernetes`` client.

Its calls block: the provisioner runs them in worker threads (``asyncio.to_thread``) so the
Jupyter server's event loop never waits on the cluster; the server's start-up, before its loop
runs, calls them directly.

Replies are plain JSON (dicts as the API server sends them), and every failure becomes a
:class:`ClusterError` whose message says what was tried and, for a 403, which permission the
server's service account lacks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT = 30.0  # seconds; an API server that does not answer must not hang a kernel start


class ClusterError(RuntimeError):
    """A Kubernetes request that failed; ``status`` is the HTTP status (0: none reached us)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class Forbidden(ClusterError):
    """RBAC said no: the message names the verb, resource and namespace to grant."""


def default_namespace() -> str:
    """The namespace of the server's own pod when it runs in a cluster, else ``default``."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def _has_labels(item: dict[str, Any], labels: dict[str, str]) -> bool:
    found = item.get("metadata", {}).get("labels") or {}
    return all(found.get(key) == value for key, value in labels.items())


class Cluster:
    """One Kubernetes API endpoint (in-cluster credentials, else the kubeconfig's current context)."""

    def __init__(self, api):
        """``api``: a ``kubernetes.client.CoreV1Api``."""
        self.api = api

    @classmethod
    def from_environment(cls) -> Cluster:
        """The cluster the server runs in (its service account), else ``$KUBECONFIG`` / ``~/.kube/config``."""
        # Imported here: the client takes most of a second to import, which a server that never
        # starts a pod kernel should not pay.
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        configuration = k8s.Configuration()
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                # Read $KUBECONFIG now: the client reads it once, when it is first imported.
                k8s_config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
                )
        except (k8s_config.ConfigException, OSError) as error:
            raise ClusterError(
                f"no Kubernetes cluster to start pod kernels in: {error}. In a pod, mount its service "
                "account token; elsewhere, set KUBECONFIG"
            ) from None
        # The callers poll and report; urllib3's own three retries would only hide an outage longer.
        configuration.retries = 1
        return cls(k8s.CoreV1Api(k8s.ApiClient(configuration)))

    @property
    def host(self) -> str:
        return str(self.api.api_client.configuration.host)

    # -- what the pod kernels use ------------------------------------------------------------

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._call("create", "pods", namespace, self.api.create_namespaced_pod, namespace, pod)
        return reply

    def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._call(
            "create", "secrets", namespace, self.api.create_namespaced_secret, namespace, secret
        )
        return reply

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when it does not exist."""
        reply: dict[str, Any] | None = self._call(
            "get", "pods", namespace, self.api.read_namespaced_pod, name, namespace, missing_ok=True
        )
        return reply

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Pods carrying all ``labels``; filtered here too, so a server that ignores the selector
        cannot make us act on someone else's pod."""
        reply = self._call(
            "list", "pods", namespace, self.api.list_namespaced_pod, namespace, label_selector=_selector(labels)
        )
        return [item for item in reply.get("items", []) if _has_labels(item, labels)]

    def pod_events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        reply = self._call(
            "list",
            "events",
            namespace,
            self.api.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}",
        )
        return [
            item
            for item in reply.get("items", [])
            if (item.get("involvedObject") or {}).get("name") == name
            and (item.get("involvedObject") or {}).get("kind", "Pod") == "Pod"
        ]

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node (cluster-scoped: the optional ClusterRole of docs/kubernetes.md)."""
        reply = self._call("list", "nodes", "", self.api.list_node)
        return list(reply.get("items", []))

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None when it does not exist."""
        reply: dict[str, Any] | None = self._call(
            "get", "secrets", namespace, self.api.read_namespaced_secret, name, namespace, missing_ok=True
        )
        return reply

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int | None = None) -> bool:
        """Delete a pod; False if it was already gone."""
        extra = {} if grace_seconds is None else {"grace_period_seconds": grace_seconds}
        reply = self._call(
            "delete", "pods", namespace, self.api.delete_namespaced_pod, name, namespace, missing_ok=True, **extra
        )
        return reply is not None

    def delete_secret(self, namespace: str, name: str) -> bool:
        reply = self._call(
            "delete", "secrets", namespace, self.api.delete_namespaced_secret, name, namespace, missing_ok=True
        )
        return reply is not None

    # -- one request ---------------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        resource: str,
        namespace: str,
        method: Callable[..., Any],
        *args: Any,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> Any:
        """One blocking request: its JSON reply (None for a missing object when ``missing_ok``),
        or its failure as a ClusterError."""
        from kubernetes.client import ApiException

        try:
            response = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            return json.loads(response.data or b"{}")
        except ApiException as error:
            if error.status == 404 and missing_ok:
                return None
            raise _api_error(error, verb, resource, namespace) from None
        except Exception as error:  # noqa: BLE001 -- urllib3's connection errors, timeouts, TLS failures
            raise ClusterError(
                f"cannot reach the Kubernetes API at {self.host} to {verb} {resource}: {error}"
            ) from None


def _api_error(error, verb: str, resource: str, namespace: str) -> ClusterError:
    try:
        message = json.loads(error.body or "{}").get("message", "")
    except ValueError:
        message = ""
    message = message or error.reason or "no reason given"
    where = f"in namespace {namespace!r}" if namespace else "in the cluster"
    if error.status == 403:
        return Forbidden(
            f"the Jupyter server's service account may not {verb} {resource} {where} "
            f"(Kubernetes said: {message}); grant it the Role in docs/kubernetes.md",
            status=403,
        )
    return ClusterError(f"Kubernetes refused to {verb} {resource} {where}: {message}", status=error.status or 0)
