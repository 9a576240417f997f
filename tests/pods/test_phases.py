"""A pod's state in words, read from its status and events alone: the scheduler's reason while it
waits, pulling, running with HAMi's node and GPU, and each way it fails."""

from __future__ import annotations

from jupyter_vgpu.pods.phases import hami_gpu, pod_state

UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem. preemption: 0/3 nodes are available."


def pod(phase="Pending", *, node="", conditions=(), containers=(), ip="", annotations=None, **status):
    return {
        "metadata": {"name": "jvgpu-k-1", "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [{"name": "kernel", "image": "registry.example.org/torch:2.5"}]},
        "status": {
            "phase": phase,
            "conditions": list(conditions),
            "containerStatuses": list(containers),
            "podIP": ip,
            **status,
        },
    }


def waiting(reason, message=""):
    return {"name": "kernel", "state": {"waiting": {"reason": reason, "message": message}}}


def event(reason, message="", at="2026-11-23T10:00:00Z"):
    return {
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "involvedObject": {"kind": "Pod", "name": "jvgpu-k-1"},
    }


def test_a_pod_the_scheduler_found_no_room_for_is_queued_with_its_reason():
    state = pod_state(
        pod(
            conditions=[
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
            ]
        )
    )
    assert state.state == "queued" and not state.ready and not state.over
    assert state.message == f"waiting in line for room in the cluster: {UNSCHEDULABLE}"
    assert state.reason == UNSCHEDULABLE


def test_the_reason_comes_from_the_failed_scheduling_event_when_the_condition_has_none():
    state = pod_state(pod(), [event("FailedScheduling", UNSCHEDULABLE)])
    assert state.state == "queued" and state.reason == UNSCHEDULABLE


def test_a_pod_the_scheduler_has_not_looked_at_yet_is_scheduling():
    state = pod_state(pod())
    assert state.state == "scheduling" and state.message == "waiting for the scheduler to place the kernel's pod"


def test_pulling_is_seen_in_events_until_the_image_is_pulled():
    scheduled = pod(
        node="gpu-node-1",
        conditions=[{"type": "PodScheduled", "status": "True"}],
        containers=[waiting("ContainerCreating")],
    )
    assert (
        pod_state(scheduled, [event("Pulling", "Pulling image")]).message
        == "pulling the kernel image registry.example.org/torch:2.5 on node gpu-node-1"
    )
    pulled = [event("Pulling", at="2026-11-23T10:00:00Z"), event("Pulled", at="2026-11-23T10:00:05Z")]
    assert pod_state(scheduled, pulled).state == "starting"


def test_a_running_pod_names_hamis_node_and_gpu():
    annotations = {"hami.io/vgpu-node": "gpu-node-1", "hami.io/vgpu-devices-allocated": "GPU-8f2c1d,NVIDIA,4096,30:;"}
    running = {"name": "kernel", "state": {"running": {"startedAt": "2026-11-23T10:00:00Z"}}}
    state = pod_state(pod("Running", containers=[running], ip="10.1.2.3", annotations=annotations))
    assert state.ready and (state.node, state.gpu, state.ip) == ("gpu-node-1", "GPU-8f2c1d (4GiB, 30%)", "10.1.2.3")
    assert state.message == "the kernel runs on node gpu-node-1, GPU GPU-8f2c1d (4GiB, 30%)"


def test_a_running_pod_without_an_ip_is_still_starting():
    running = {"name": "kernel", "state": {"running": {}}}
    assert pod_state(pod("Running", node="n", containers=[running])).state == "starting"


def test_image_pull_failures_and_crash_loops_fail_with_the_containers_reason():
    for reason in ("ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff"):
        state = pod_state(pod(node="n", containers=[waiting(reason, 'Back-off pulling image "nope"')]))
        assert state.state == "failed" and state.over
        assert f"({reason}): Back-off pulling image" in state.message


def test_an_oom_killed_container_fails_with_oomkilled():
    terminated = {"name": "kernel", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    state = pod_state(pod("Failed", node="n", containers=[terminated]))
    assert state.state == "failed" and "(OOMKilled)" in state.message


def test_an_evicted_pod_fails_with_the_pods_reason():
    state = pod_state(pod("Failed", node="n", reason="Evicted", message="The node was low on resource: memory."))
    assert (
        state.state == "failed"
        and state.message == "the kernel's pod failed on node n (Evicted): The node was low on resource: memory."
    )


def test_a_deleted_pod_is_gone_and_a_deleting_one_is_stopping():
    assert pod_state(None).state == "gone"
    deleting = pod("Running")
    deleting["metadata"]["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    assert pod_state(deleting).state == "stopping"


def test_hami_gpu_reads_uuid_memory_and_cores_and_tolerates_other_shapes():
    assert hami_gpu({"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1024,25:;"}) == "GPU-a (1GiB, 25%)"
    assert hami_gpu({"hami.io/vgpu-devices-allocated": "GPU-b"}) == "GPU-b"
    assert hami_gpu({}) == ""
