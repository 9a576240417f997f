"""Pod kernels through a real Jupyter server against the real control plane (see conftest): start,
run and shutdown on the test's node; the cluster's line (a pod the scheduler has no room for is
queued with its place and the scheduler's own reason, starts by itself when room frees, leaves the
line when shut down, gives up only after ``line_timeout``); a start no node could hold refused at
once; restart; a pod deleted from outside; a resize past the grant."""

from __future__ import annotations

import json
import sys

import pytest
import tornado.httpclient
from conftest import NODE_GPU_MIB, OWNER, until
from support import folder_processes, wait_for

from jupyter_vgpu.pods.manifest import KERNEL_LABEL, MANAGED_BY, OWNER_LABEL

GIB, MIB = 1 << 30, 1 << 20


async def start(jp_fetch, kernelspec, **fields):
    return await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": kernelspec, **fields}))


async def refused_start(jp_fetch, kernelspec, **fields) -> tuple[int, str]:
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await start(jp_fetch, kernelspec, **fields)
    return refused.value.code, json.loads(refused.value.response.body)["message"]


async def slices(jp_fetch) -> list[dict]:
    return json.loads((await jp_fetch("api", "vgpu", "slices")).body)


def occupy(kube, node: str, mib: int, name: str = "occupant") -> str:
    """A pod of someone else's on ``node`` holding ``mib`` of its GPU memory (as the scheduler
    counts it), running a process that sleeps; its name."""
    kube.core.create_namespaced_pod(
        kube.namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "sleeper",
                        "image": "registry.example.org/sleeper:1",
                        "command": [sys.executable, "-c", "import time; time.sleep(3600)"],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}},
                    }
                ],
            },
        },
        _preload_content=False,
    )
    wait_for(lambda: (kube.pod(name) or {}).get("status", {}).get("phase") == "Running", 60, f"{name} to run")
    return name


async def test_a_pod_kernel_starts_runs_and_shuts_down(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node, pod_ports
):
    response = await start(jp_fetch, pod_kernelspec, memory="2GiB", cores=30)
    assert response.code == 201
    reply = json.loads(response.body)
    kernel_id = reply["kernel"]["id"]
    model = reply["slice"]
    assert (model["holder"], model["state"]) == ("pod", "running")
    assert model["limits"] == {"memory_bytes": 2 * GIB, "cores": 30, "policy": "hard"}
    # The real scheduler placed it on the only node its selector allows.
    assert model["location"]["node"] == pod_node.name
    name = model["location"]["pod"]
    pod, secret = kube.pod(name), kube.secret(name)
    assert pod["spec"]["nodeName"] == pod_node.name
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "2048",
        "nvidia.com/gpucores": "30",
    }
    labels = pod["metadata"]["labels"]
    assert labels[KERNEL_LABEL] == kernel_id and labels[OWNER_LABEL] == OWNER and labels[MANAGED_BY[0]] == MANAGED_BY[1]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    # Kernel pods get no token: the ServiceAccount admission plugin mounted none.
    assert not any("kube-api-access" in volume["name"] for volume in pod["spec"]["volumes"])
    assert not any("serviceaccount" in mount["mountPath"] for mount in container.get("volumeMounts", []))
    # The server connects to the pod's address with the key it wrote into the Secret.
    import base64

    connection = json.loads(base64.b64decode(secret["data"]["connection.json"]))
    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    assert connection["key"].encode() == manager.session.key and connection["shell_port"] == pod_ports[0]
    assert manager.ip == pod["status"]["podIP"]
    # Nothing of the server's environment is copied: the pod's only variable is the hard policy's.
    assert [item["name"] for item in container["env"]] == ["GPU_CORE_UTILIZATION_POLICY"]

    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert kube.pod(name) is None and kube.secret(name) is None
    assert await slices(jp_fetch) == []


async def test_a_pod_the_cluster_has_no_room_for_waits_in_line_and_starts_by_itself_when_room_frees(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node
):
    """The notebook opens at once; the slice is ``queued`` with its place and the scheduler's
    own reason; nobody retries: the kernel starts once the other pod is gone."""
    occupant = occupy(kube, pod_node.name, NODE_GPU_MIB - 1024)
    response = await start(jp_fetch, pod_kernelspec, memory="2GiB")
    reply = json.loads(response.body)
    assert (response.code, reply["slice"]["state"]) == (201, "queued"), reply
    kernel_id = reply["kernel"]["id"]

    async def queued():
        found = [item for item in await slices(jp_fetch) if item["kernel_id"] == kernel_id]
        return found and found[0]["state"] == "queued" and found[0]["queue"] and found[0]

    model = await until(queued, "the kernel queued with its place")
    assert model["queue"]["position"] == 1
    assert "Insufficient nvidia.com/gpumem" in model["queue"]["waiting_for"], model
    assert model["queue"]["waiting_for"].startswith("0/")  # the scheduler's own sentence
    (pod,) = [item for item in kube.pods() if item["metadata"]["name"] != occupant]
    assert pod["status"]["conditions"][0]["reason"] == "Unschedulable"

    kube.delete_pod(occupant)

    async def running():
        found = [item for item in await slices(jp_fetch) if item["kernel_id"] == kernel_id]
        return found and found[0]["state"] == "running"

    await until(running, "the queued kernel to start by itself")
    await jp_serverapp.kernel_manager.get_kernel(kernel_id).ready
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert await slices(jp_fetch) == []


async def test_pods_in_line_are_in_the_order_they_came_and_shutting_one_down_leaves_the_line(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node
):
    occupy(kube, pod_node.name, NODE_GPU_MIB)
    first = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]
    second = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]

    async def places():
        found = {item["kernel_id"]: item["queue"] for item in await slices(jp_fetch) if item["state"] == "queued"}
        return found if len(found) == 2 and all(found.values()) else None

    found = await until(places, "both kernels queued")
    assert (found[first]["position"], found[second]["position"]) == (1, 2)

    await jp_fetch("api", "kernels", first, method="DELETE")
    found = {item["kernel_id"]: item for item in await slices(jp_fetch)}
    assert first not in found and found[second]["queue"]["position"] == 1
    assert first not in jp_serverapp.kernel_manager.list_kernel_ids()
    assert [pod for pod in kube.pods() if pod["metadata"].get("labels", {}).get(KERNEL_LABEL) == first] == []
    await jp_fetch("api", "kernels", second, method="DELETE")
    assert await slices(jp_fetch) == []


async def test_a_pod_in_line_gives_up_only_after_line_timeout_saying_what_it_waited_for(
    jp_fetch, jp_serverapp, make_pod_kernelspec, kube, pod_node
):
    occupy(kube, pod_node.name, NODE_GPU_MIB)
    kernelspec = make_pod_kernelspec("vgpu-pod-impatient", line_timeout=1.5)
    response = await start(jp_fetch, kernelspec)
    kernel_id = json.loads(response.body)["kernel"]["id"]
    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    with pytest.raises(Exception) as failed:
        await manager.ready
    message = str(failed.value)
    assert "waited in line 1.5 seconds (VGPUPodProvisioner.line_timeout) and was deleted" in message, message
    assert "Insufficient nvidia.com/gpumem" in message
    wait_for(
        lambda: not [p for p in kube.pods() if KERNEL_LABEL in p["metadata"].get("labels", {})], 30, "its pod deleted"
    )
    assert await slices(jp_fetch) == []


async def test_a_start_larger_than_every_node_is_refused_at_once_with_the_sizes(
    jp_fetch, make_pod_kernelspec, kube, pod_node
):
    kernelspec = make_pod_kernelspec("vgpu-pod-huge", memory="12GiB")  # the server allows it (conftest)
    status, message = await refused_start(jp_fetch, kernelspec)
    assert status == 409, message
    assert (
        f"Its 12GiB GPU slice can never fit: the largest GPU in the cluster (on node {pod_node.name}) has 8GiB of "
        "nvidia.com/gpumem. Ask for 8GiB or less." in message
    )
    assert kube.pods() == [] and await slices(jp_fetch) == []


async def test_a_restart_is_a_new_pod(jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node):
    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]
    first = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    second = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    assert first != second and second.endswith("-2")
    assert kube.pod(first) is None and kube.secret(first) is None
    assert kube.pod(second) is not None
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert kube.pods() == []


async def test_a_pod_deleted_from_outside_ends_its_kernel_which_comes_back_on_a_new_pod(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node, caplog
):
    """The kernel ends with a message saying why, as a local kernel whose process was killed does,
    and Jupyter's restarter brings it back the only way a pod kernel restarts: on a new pod."""
    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec)).body)["kernel"]["id"]
    name = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)["location"]["pod"]
    kube.delete_pod(name, grace_seconds=0)

    def ended() -> bool:
        return any(
            record.getMessage() == f"kernel {kernel_id} ended: the kernel's pod no longer exists (it was deleted)"
            for record in caplog.records
        )

    async def back_on_a_new_pod() -> bool:
        model = json.loads((await jp_fetch("api", "vgpu", "slices", kernel_id)).body)
        return ended() and model["location"]["pod"] == name[:-1] + "2" and model["state"] == "running"

    await until(back_on_a_new_pod, "the end message and the kernel on a new pod")
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
    assert kube.pods() == []


async def test_a_resize_beyond_the_pods_grant_is_refused(jp_fetch, pod_kernelspec, pod_node):
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


async def test_a_stopped_node_agent_leaves_no_process_of_its_pods_behind(jp_fetch, pod_kernelspec, pod_node):
    """As a node ends every process of a container it stops, the agent ends the kernel each pod's
    in-pod agent started, not only the in-pod agent."""
    await start(jp_fetch, pod_kernelspec, memory="1GiB", cores=10)
    # The start is answered once the pod runs; its agent starts the kernel then.
    wait_for(
        lambda: any("ipykernel_launcher" in argv for argv in folder_processes(pod_node.folder).values()),
        60,
        "the pod's kernel to start",
    )
    pod_node.stop(remove_node=False)
    assert folder_processes(pod_node.folder) == {}
