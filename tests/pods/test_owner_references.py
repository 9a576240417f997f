"""A kernel pod's Secret (its connection file and credential) is owned by the pod: the real
garbage collector of kube-controller-manager removes it with the pod, also when the pod is deleted
from outside and no Jupyter server is there to clean up."""

from __future__ import annotations

from support import wait_for

from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.pods.manifest import KernelPod, PodSettings, pod_manifest, secret_manifest


def test_the_secret_goes_with_its_pod_through_the_garbage_collector(kube, pod_node):
    settings = PodSettings(
        namespace=kube.namespace,
        image="registry.example.org/kernels/test:1",
        node_selector={"kubernetes.io/hostname": pod_node.name},
    )
    kernel = KernelPod("0f4c-gc", "ada", "server-1")
    limits = SliceLimits(1 << 30, 30, "burst")
    created = kube.core.create_namespaced_pod(kube.namespace, pod_manifest(settings, kernel, limits))
    secret = secret_manifest(settings, kernel, {"key": "k"}, {"kernel_id": kernel.kernel_id}, created.metadata.uid)
    kube.core.create_namespaced_secret(kube.namespace, secret)
    assert kube.secret(kernel.name)["metadata"]["ownerReferences"][0]["name"] == kernel.name

    kube.delete_pod(kernel.name, grace_seconds=0)  # from outside: kubectl delete --force
    wait_for(lambda: kube.pod(kernel.name) is None, 30, "the pod deleted")
    wait_for(lambda: kube.secret(kernel.name) is None, 60, "the garbage collector to remove the pod's Secret")


def test_a_secret_whose_owner_is_already_gone_is_removed_too(kube):
    """A server that died between creating the pod and its Secret, with the pod deleted since:
    the Secret names an owner that no longer exists, and the collector removes it."""
    settings = PodSettings(namespace=kube.namespace, image="registry.example.org/kernels/test:1")
    kernel = KernelPod("0f4c-orphan", "ada", "server-1")
    created = kube.core.create_namespaced_pod(
        kube.namespace, pod_manifest(settings, kernel, SliceLimits(1 << 30, 30, "burst"))
    )
    kube.delete_pod(kernel.name, grace_seconds=0)
    wait_for(lambda: kube.pod(kernel.name) is None, 30, "the pod deleted")
    kube.core.create_namespaced_secret(
        kube.namespace,
        secret_manifest(settings, kernel, {"key": "k"}, {"kernel_id": kernel.kernel_id}, created.metadata.uid),
    )
    wait_for(lambda: kube.secret(kernel.name) is None, 60, "the garbage collector to remove the orphaned Secret")
