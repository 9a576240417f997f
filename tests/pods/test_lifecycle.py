"""Pod kernels through a real Jupyter server, against the stand-in Kubernetes API (see conftest):
start, wait with the scheduler's reason, image-pull failure, timeout, shutdown, restart, cleanup
after a server restart, a pod deleted from outside, and RBAC's 403 said plainly."""

from __future__ import annotations

import json

import pytest
import tornado.httpclient
from kube_standin import OWNER, kernel_status, running_status
from support import folder_processes, wait_for

from jupyter_vgpu.pods.manifest import KERNEL_LABEL, MANAGED_BY, OWNER_LABEL, SERVER_LABEL

GIB, MIB = 1 << 30, 1 << 20
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem."


async def start(jp_fetch, kernelspec, **fields):
    return await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": kernelspec, **fields}))


async def refused_start(jp_fetch, kernelspec, **fields) -> tuple[int, str]:
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await start(jp_fetch, kernelspec, **fields)
    return refused.value.code, json.loads(refused.value.response.body)["message"]


async def slices(jp_fetch) -> list[dict]:
    return json.loads((await jp_fetch("api", "vgpu", "slices")).body)


def unschedulable(standin, name):
    standin.set_status(
        name,
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
            ],
        },
    )


async def test_a_pod_kernel_starts_runs_and_shuts_down_against_standin(
    jp_fetch, jp_serverapp, pod_kernelspec, kubelet, standin, pod_ports
):
    response = await start(jp_fetch, pod_kernelspec, memory="2GiB", cores=30)
    assert response.code == 201
    reply = json.loads(response.body)
    kernel_id = reply["kernel"]["id"]
    model = reply["slice"]
    assert (model["holder"], model["state"]) == ("pod", "running")
    assert model["limits"] == {"memory_bytes": 2 * GIB, "cores": 30, "policy": "hard"}
    assert model["location"]["node"] == "node-a" and model["location"]["gpu"] == "GPU-standin-0 (4096 MiB, 30%)"
    name = model["location"]["pod"]
    pod, secret = standin.pod(name), standin.secret(name)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "2048",
        "nvidia.com/gpucores": "30",
    }
    labels = pod["metadata"]["labels"]
    assert labels[KERNEL_LABEL] == kernel_id and labels[OWNER_LABEL] == OWNER and labels[MANAGED_BY[0]] == MANAGED_BY[1]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    # The server connects to the pod with the key it wrote into the Secret; the pod got nothing else of it.
    connection = json.loads(secret["stringData"]["connection.json"])
    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    assert connection["key"].encode() == manager.session.key and connection["shell_port"] == pod_ports[0]
    assert manager.ip == "127.0.0.1"
    # Nothing of the server's environment is copied: the pod's only variable is the hard policy's.
    assert [item["name"] for item in container["env"]] == ["GPU_CORE_UTILIZATION_POLICY"]

    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert standin.pod(name) is None and standin.secret(name) is None
    assert await slices(jp_fetch) == []


async def test_a_waiting_pod_shows_the_schedulers_reason_then_times_out_against_standin(
    jp_fetch, jp_serverapp, make_pod_kernelspec, standin, scheduler
):
    kernelspec = make_pod_kernelspec("vgpu-pod-impatient", start_timeout=1.5)
    scheduler(unschedulable)
    status, message = await refused_start(jp_fetch, kernelspec)
    assert status == 503
    assert message.startswith("Kernel not started. The kernel's pod jvgpu-")
    assert "was not running after 1.5 seconds and was deleted. It was waiting for the scheduler" in message
    assert UNSCHEDULABLE in message
    assert standin.pods() == [] and await slices(jp_fetch) == []
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []


async def test_slices_list_shows_a_starting_pods_state_against_standin(jp_fetch, pod_kernelspec, standin, scheduler):
    import asyncio

    scheduler(unschedulable)
    starting = asyncio.ensure_future(start(jp_fetch, pod_kernelspec))
    try:

        async def waiting():
            found = await slices(jp_fetch)
            return found and found[0]["state"] == "scheduling" and UNSCHEDULABLE in found[0]["message"]

        for _ in range(200):
            if await waiting():
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"no scheduling state with the scheduler's reason in {await slices(jp_fetch)}")
    finally:
        # End the start: the image cannot be pulled.
        name = standin.pods()[0]["metadata"]["name"]
        pulling = 'Back-off pulling image "registry.example.org/kernels/standin:1"'
        standin.set_status(
            name, kernel_status("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": pulling}})
        )
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            await starting
    assert refused.value.code == 503
    message = json.loads(refused.value.response.body)["message"]
    assert "cannot start (ImagePullBackOff): Back-off pulling image" in message
    assert standin.pods() == [] and await slices(jp_fetch) == []


async def test_rbac_denial_names_the_missing_permission_against_standin(
    jp_fetch, jp_serverapp, pod_kernelspec, standin
):
    standin.forbid("create", "pods")
    status, message = await refused_start(jp_fetch, pod_kernelspec)
    assert status == 503
    assert "the Jupyter server's service account may not create pods in namespace 'default'" in message
    assert "grant it the Role in docs/kubernetes.md" in message
    assert await slices(jp_fetch) == [] and jp_serverapp.kernel_manager.list_kernel_ids() == []


async def test_a_restart_is_a_new_pod_against_standin(jp_fetch, jp_serverapp, pod_kernelspec, kubelet, standin):
    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]
    first = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    second = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    assert first != second and second.endswith("-2")
    assert standin.pod(first) is None and standin.secret(first) is None
    assert standin.pod(second) is not None
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert standin.pods() == []


async def test_a_pod_deleted_from_outside_ends_its_kernel_which_comes_back_on_a_new_pod_against_standin(
    jp_fetch, jp_serverapp, pod_kernelspec, kubelet, standin, caplog
):
    """The kernel ends with a message saying why, as a local kernel whose process was killed does,
    and Jupyter's restarter brings it back the only way a pod kernel restarts: on a new pod."""
    import asyncio

    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]
    name = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    standin.api.delete_namespaced_pod(name, "default", _preload_content=False)

    def ended() -> bool:
        return any(
            record.getMessage() == f"kernel {kernel_id} ended: the kernel's pod no longer exists (it was deleted)"
            for record in caplog.records
        )

    async def back_on_a_new_pod() -> bool:
        model = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)
        return model["location"]["pod"] == name[:-1] + "2" and model["state"] == "running"

    for _ in range(600):  # the restarter looks every few seconds
        if ended() and await back_on_a_new_pod():
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(
            f"no end message and new pod: {[r.getMessage() for r in caplog.records if kernel_id in r.getMessage()]}"
        )
    # The slice says "running" once the new pod runs; the restarter's restart ends later, when the
    # kernel answers. Shutting it down before that meets an upstream race (jupyter_client's
    # MultiKernelManager reads the pending `ready` future's exception: InvalidStateError, a 500).
    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
    finally:
        client.stop_channels()
    await manager.ready
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert standin.pods() == []


async def test_a_resize_beyond_the_pods_grant_is_refused_against_standin(jp_fetch, pod_kernelspec, kubelet):
    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec, memory="2GiB", cores=30)).body)["kernel"]["id"]
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await jp_fetch("api", "vgpu", "slices", kernel_id, method="PATCH", body=json.dumps({"memory": "3GiB"}))
    assert refused.value.code == 409
    message = json.loads(refused.value.response.body)["message"]
    assert "granted 2GiB of GPU memory" in message and "restart the kernel with the new size" in message
    shrunk = await jp_fetch(
        "api", "vgpu", "slices", kernel_id, method="PATCH", body=json.dumps({"memory": 1024, "cores": 20})
    )
    assert json.loads(shrunk.body)["limits"] == {"memory_bytes": GIB, "cores": 20, "policy": "hard"}
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")


@pytest.fixture
def pods_of_a_crashed_server(standin):
    """Pods and Secrets an earlier server of the same owner left (it was SIGKILLed), and one of
    another owner, made before the server under test starts."""

    def leave(name, owner):
        labels = {MANAGED_BY[0]: MANAGED_BY[1], OWNER_LABEL: owner, KERNEL_LABEL: name, SERVER_LABEL: "earlier"}
        standin.api.create_namespaced_pod(
            "default",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": "kernel", "image": "i"}]},
            },
            _preload_content=False,
        )
        standin.api.create_namespaced_secret(
            "default",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels}},
            _preload_content=False,
        )
        standin.set_status(name, running_status())

    leave("jvgpu-left-1", OWNER)
    leave("jvgpu-left-2", OWNER)
    leave("jvgpu-someone-else-1", "grace")


async def test_a_restarted_server_deletes_the_pods_its_predecessor_left_against_standin(
    pods_of_a_crashed_server, pod_kernelspec, jp_serverapp, standin
):
    assert [pod["metadata"]["name"] for pod in standin.pods()] == ["jvgpu-someone-else-1"]
    assert standin.secret("jvgpu-left-1") is None and standin.secret("jvgpu-left-2") is None
    assert standin.secret("jvgpu-someone-else-1") is not None


async def test_a_stopped_kubelet_leaves_no_process_of_its_pods_behind_against_standin(
    jp_fetch, pod_kernelspec, kubelet
):
    """As a node ends every process of a container it stops, the stand-in's Kubelet ends the
    kernel each pod's agent started, not only the agent (the kernel outlived its agent's SIGKILL:
    runs of these tests on the shared machine left such kernels behind)."""
    await start(jp_fetch, pod_kernelspec, memory="1GiB", cores=10)
    # The start is answered once the pod runs; its agent starts the kernel then.
    wait_for(
        lambda: any("ipykernel_launcher" in argv for argv in folder_processes(kubelet.folder).values()),
        60,
        "the pod's kernel to start",
    )
    kubelet.stop()
    assert folder_processes(kubelet.folder) == {}
