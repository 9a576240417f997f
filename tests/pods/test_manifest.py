"""The Pod and Secret a start creates: valid for Kubernetes (its own OpenAPI schema, through
kubernetes-validate), the slice as the scheduler's extended resources, every knob where it belongs,
and settings Kubernetes would refuse refused first with a message naming them."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from jupyter_vgpu.model import SliceLimits
from jupyter_vgpu.pods.manifest import (
    KERNEL_LABEL,
    OWNER_LABEL,
    REDACTED,
    KernelPod,
    ManifestError,
    PodSettings,
    label_value,
    merge,
    pod_manifest,
    redacted,
    secret_manifest,
)

GIB, MIB = 1 << 30, 1 << 20
KUBERNETES_VERSION = "1.31"
KERNEL = KernelPod("0f8c3a52-1b7e-4c1e-9a3f-2d5e6f7a8b9c", "ada@example.org", "a1b2c3d4e5f6")
CONNECTION = {
    "shell_port": 52101,
    "iopub_port": 52102,
    "stdin_port": 52103,
    "control_port": 52104,
    "hb_port": 52105,
    "ip": "0.0.0.0",
    "key": "secret-hmac-key",
    "transport": "tcp",
    "signature_scheme": "hmac-sha256",
    "kernel_name": "gpu",
}
SLICE_FILE = {
    "kernel_id": KERNEL.kernel_id,
    "server_url": "http://jupyter:8888/",
    "credential": "kernel-credential",
    "limits": {"memory_bytes": 4 * GIB, "cores": 30, "policy": "hard"},
    "report_interval": 1.0,
    "simulate": False,
}

EVERY_KNOB = PodSettings(
    namespace="gpu-kernels",
    image="registry.example.org/kernels/torch:2.5",
    image_pull_policy="Always",
    image_pull_secrets=("registry-login",),
    service_account="kernel-runner",
    scheduler_name="hami-scheduler",
    node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    labels={"team": "vision"},
    annotations={"example.org/cost-centre": "42"},
    env={"OMP_NUM_THREADS": "4"},
    cpu_request="500m",
    cpu_limit="4",
    memory_request="4Gi",
    memory_limit="16Gi",
    gpu_resource="nvidia.com/gpu",
    memory_resource="aliyun.com/gpu-mem",
    memory_resource_unit="GiB",
    cores_resource="",
    pod_template={"spec": {"priorityClassName": "interactive", "securityContext": {"runAsNonRoot": True}}},
)


def valid(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("settings", [PodSettings(), EVERY_KNOB], ids=["defaults", "every-knob"])
def test_generated_pod_and_secret_validate_against_the_kubernetes_schema(settings):
    pod = pod_manifest(settings, KERNEL, SliceLimits(4 * GIB, 30))
    valid(pod)
    valid(secret_manifest(settings, KERNEL, CONNECTION, SLICE_FILE, pod_uid="6c5d2f4e-0000-4000-8000-000000000001"))


def test_the_slice_is_asked_for_as_hami_extended_resources():
    container = pod_manifest(PodSettings(), KERNEL, SliceLimits(4 * GIB + 1, 30, "hard"))["spec"]["containers"][0]
    # HAMi's gpumem is in MiB: a part of a MiB asks for the whole MiB.
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "4097",
        "nvidia.com/gpucores": "30",
    }
    assert {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"} in container["env"]
    burst = pod_manifest(PodSettings(), KERNEL, SliceLimits(GIB, 50, "burst"))["spec"]["containers"][0]
    assert all(item["name"] != "GPU_CORE_UTILIZATION_POLICY" for item in burst["env"])


def test_every_knob_lands_in_the_pod():
    pod = pod_manifest(EVERY_KNOB, KERNEL, SliceLimits(5 * GIB, 30))
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert pod["metadata"]["namespace"] == "gpu-kernels"
    assert container["image"] == "registry.example.org/kernels/torch:2.5" and container["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "registry-login"}]
    assert spec["serviceAccountName"] == "kernel-runner" and spec["schedulerName"] == "hami-scheduler"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["annotations"] == {"example.org/cost-centre": "42"}
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in container["env"]
    # gpushare-style memory in GiB, rounded up; no cores resource asked for.
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1", "aliyun.com/gpu-mem": "5", "cpu": "4", "memory": "16Gi"},
        "requests": {"cpu": "500m", "memory": "4Gi"},
    }
    assert spec["priorityClassName"] == "interactive" and spec["securityContext"] == {"runAsNonRoot": True}
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False


def test_the_secret_is_owned_by_the_pod_mounted_read_only_and_labelled():
    pod = pod_manifest(PodSettings(), KERNEL, SliceLimits(GIB))
    secret = secret_manifest(PodSettings(), KERNEL, CONNECTION, SLICE_FILE, pod_uid="uid-1")
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": KERNEL.name, "uid": "uid-1", "blockOwnerDeletion": False}
    ]
    assert pod["spec"]["volumes"] == [
        {"name": "kernel-connection", "secret": {"secretName": KERNEL.name, "defaultMode": 0o400}}
    ]
    assert pod["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] is True
    assert json.loads(secret["stringData"]["connection.json"])["key"] == "secret-hmac-key"
    for manifest in (pod, secret):
        labels = manifest["metadata"]["labels"]
        assert labels[KERNEL_LABEL] == KERNEL.kernel_id and labels[OWNER_LABEL] == "ada-example.org"


def test_redacted_secret_hides_the_key_and_the_credential():
    shown = redacted(secret_manifest(PodSettings(), KERNEL, CONNECTION, SLICE_FILE))
    text = json.dumps(shown)
    assert "secret-hmac-key" not in text and "kernel-credential" not in text and text.count(REDACTED) == 2


def test_labels_are_dns_safe_whatever_the_owner_is_called():
    assert label_value("Ada Lovelace <ada@example.org>") == "Ada-Lovelace--ada-example.org"
    assert label_value("x" * 80) == "x" * 63
    assert label_value("@@@") == "unknown"


def test_a_restart_is_a_new_pod_name():
    assert KernelPod("k", "o", "s", start=1).name != KernelPod("k", "o", "s", start=2).name


def test_pod_template_merges_mappings_replaces_lists_and_removes_nulls():
    base = {"spec": {"a": 1, "list": [1, 2], "keep": {"x": 1}}}
    assert merge(base, {"spec": {"a": None, "list": [3], "keep": {"y": 2}}}) == {
        "spec": {"list": [3], "keep": {"x": 1, "y": 2}}
    }


@pytest.mark.parametrize(
    "change, named",
    [
        ({"namespace": "Not_A_Label"}, "namespace"),
        ({"image": " "}, "image"),
        ({"image_pull_policy": "Sometimes"}, "image_pull_policy"),
        ({"memory_resource_unit": "MB"}, "memory_resource_unit"),
        ({"memory_resource": "gpu mem"}, "memory_resource"),
        ({"gpu_resource": ""}, "gpu_resource"),
        ({"cpu_request": "lots"}, "cpu_request"),
        ({"labels": {"team": "a b"}}, "labels"),
        ({"node_selector": {"bad key!": "x"}}, "node_selector"),
        ({"env": {"1BAD": "x"}}, "env name"),
        ({"ports": (1, 2, 3, 4, 5)}, "ports"),
        ({"ports": (52101, 52101, 52103, 52104, 52105)}, "ports"),
        ({"tolerations": ["NoSchedule"]}, "tolerations"),
    ],
)
def test_settings_kubernetes_would_refuse_are_refused_naming_the_setting(change, named):
    settings = PodSettings(**change)
    with pytest.raises(ManifestError, match=named):
        settings.check()
