"""One pod kernel end to end on the real control plane, the test's node agent running the pod's
command as a local process (tests/cluster/node_agent.py): a real Jupyter server starts it over
REST, the real scheduler places it, code runs in it on the simulated GPU under the interposer,
``%vgpu`` in it shows the pod slice and the usage its agent reports, a resize within the pod's
grant reaches the kernel's next CUDA call, and shutdown deletes the pod. Every reply is checked
against api.yaml."""

from __future__ import annotations

import json
import re

from conftest import until
from openapi_check import check_reply
from support import folder_processes, wait_for

GIB, MIB = 1 << 30, 1 << 20
CUDA_ERROR_OUT_OF_MEMORY = 2


async def test_a_pod_kernel_runs_code_reports_usage_and_obeys_a_live_resize(
    jp_fetch, pod_kernelspec, pod_node, kube, run_in_kernel, cuda_prelude
):
    started = await jp_fetch(
        "api",
        "vgpu",
        "kernels",
        method="POST",
        body=json.dumps({"name": pod_kernelspec, "memory": "2GiB", "cores": 30}),
    )
    kernel_id = check_reply("POST", "/api/vgpu/kernels", started)["kernel"]["id"]
    pod = json.loads(started.body)["slice"]["location"]["pod"]

    # The kernel runs in the pod's slice: its CUDA driver sees the slice's cap, not the GPU.
    assert (await run_in_kernel(kernel_id, cuda_prelude + "print(memory()[1])")).strip() == str(2 * GIB)
    assert (await run_in_kernel(kernel_id, "print(allocate(512 << 20))")).strip() == "0"

    async def reported():
        response = await jp_fetch("api", "vgpu", "slices", kernel_id)
        model = check_reply("GET", f"/api/vgpu/slices/{kernel_id}", response)
        return model if model["usage"]["memory_bytes"] >= 512 * MIB else None

    model = await until(reported, "the agent's report of 512MiB in use")
    assert (model["holder"], model["state"], model["device"]) == ("pod", "running", None)

    shown = (await run_in_kernel(kernel_id, "%vgpu")).splitlines()
    assert shown[0] == f"GPU slice of kernel {kernel_id[:8]} ({kernel_id}), running"
    assert shown[1] == f"  device  pod {pod} on {pod_node.name}"
    assert re.fullmatch(r"  memory  5\d\dMiB used of 2GiB cap", shown[2]), shown[2]

    resized = await jp_fetch("api", "vgpu", "slices", kernel_id, method="PATCH", body=json.dumps({"memory": "1GiB"}))
    assert check_reply("PATCH", f"/api/vgpu/slices/{kernel_id}", resized)["limits"]["memory_bytes"] == GIB
    # The agent applies it at its next report; the kernel's next CUDA call after that obeys it.
    code = "import time\ndeadline = time.monotonic() + 30\nwhile memory()[1] != 1 << 30 and time.monotonic() < deadline:\n    time.sleep(0.02)\nprint(memory()[1], allocate(768 << 20))"
    assert (await run_in_kernel(kernel_id, code)).split() == [str(GIB), str(CUDA_ERROR_OUT_OF_MEMORY)]

    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert kube.pod(pod) is None and kube.secret(pod) is None
    assert json.loads((await jp_fetch("api", "vgpu", "slices")).body) == []
    # The node ended the pod's processes (its agent and the kernel) with the pod.
    wait_for(lambda: not folder_processes(pod_node.folder), 30, "the pod's processes to end")


async def test_a_pod_kernel_is_interrupted_by_message(jp_fetch, jp_serverapp, pod_kernelspec, pod_node):
    """No signal reaches a pod: Jupyter's interrupt goes as a message on the control channel."""
    kernel_id = json.loads(
        (await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": pod_kernelspec}))).body
    )["kernel"]["id"]
    manager = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    assert manager.kernel_spec.interrupt_mode == "message"
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        msg_id = client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")
        while True:  # interrupt once the cell runs, not before
            message = await client.get_iopub_msg(timeout=60)
            if message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "stream":
                break
        await jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="{}")
        reply = await client.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = await client.get_shell_msg(timeout=30)
        assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "KeyboardInterrupt")
    finally:
        client.stop_channels()
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")


async def test_usage_reports_are_checked_at_the_edge(jp_fetch, pod_kernelspec, pod_node):
    kernel_id = json.loads(
        (await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": pod_kernelspec}))).body
    )["kernel"]["id"]
    for body, wanted in [
        ({"processes": "all"}, "field 'processes' must be a list"),
        ({"processes": [1] * 1025}, "processes must be a list of at most 1024"),
        ({"processes": [{"pid": -1}]}, "process field 'pid' must be a whole number"),
        ({"processes": [{"pid": 1, "cpu": 3}]}, "each process report is an object with the fields"),
        ({"sm_util": 250}, "sm_util must be a number from 0 to 100"),
        ({"limits": {"memory_bytes": 1}}, "limits must be an object with memory_bytes, cores and policy"),
        (
            {"limits": {"memory_bytes": 1, "cores": 0, "policy": "hard"}},
            "limits.cores must be a whole number from 1 to 100",
        ),
        ({"battery": 1}, "unknown field(s) battery"),
    ]:
        response = await jp_fetch(
            "api", "vgpu", "slices", kernel_id, "usage", method="POST", body=json.dumps(body), raise_error=False
        )
        assert response.code == 400, body
        assert wanted in check_reply("POST", f"/api/vgpu/slices/{kernel_id}/usage", response)["message"]
    missing = await jp_fetch(
        "api", "vgpu", "slices", "no-such-kernel", "usage", method="POST", body="{}", raise_error=False
    )
    assert missing.code == 404
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
