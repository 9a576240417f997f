"""The Jupyter server on a real API server with the real RBAC and Node authorizers: it needs no
verb beyond docs/kubernetes.md's Role (the API server's audit log of every request its account
made says so), a Role missing one gives the documented one-line error (the API server's 403 as
the start's 503), and the documented NetworkPolicy is accepted as written."""

from __future__ import annotations

import json

import pytest
import tornado.httpclient
from conftest import NODE_GPU_MIB
from fixtures import SERVER_ACCOUNT, documented
from test_lifecycle import occupy, slices, start, until


def allowed(rules: list[dict], resource: str, verb: str) -> bool:
    return any(resource in rule["resources"] and verb in rule["verbs"] and "" in rule["apiGroups"] for rule in rules)


def requests_beyond_the_documented_role(kube) -> tuple[list[str], set[tuple[str, str]]]:
    """What the server's account asked the API server that the documented Role and ClusterRole
    do not allow (or that was refused), and every (resource, verb) it used."""
    user = f"system:serviceaccount:{kube.namespace}:{SERVER_ACCOUNT}"
    role_rules = kube.role["rules"]
    (cluster_role,) = documented("RBAC", ("ClusterRole",))
    beyond, used = [], set()
    for event in kube.plane.audit_events(user):
        target = event.get("objectRef") or {}
        resource = target.get("resource", "") + (f"/{target['subresource']}" if target.get("subresource") else "")
        verb, code = event["verb"], event.get("responseStatus", {}).get("code", 0)
        used.add((resource, verb))
        rules = role_rules if target.get("namespace") == kube.namespace else cluster_role["rules"]
        if code == 403 or not allowed(rules, resource, verb):
            beyond.append(f"{verb} {resource} in {target.get('namespace') or 'the cluster'} -> {code}")
    return beyond, used


async def test_every_request_the_server_makes_is_within_the_documented_role(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node
):
    """A start, a run, a start that waits in line and starts by itself, a restart and shutdowns:
    every request the server's account made is allowed by the documented Role (and the optional
    ClusterRole), and none was refused."""
    kernel_id = json.loads((await start(jp_fetch, pod_kernelspec, memory="2GiB")).body)["kernel"]["id"]
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    occupy(kube, pod_node.name, NODE_GPU_MIB - 3072)  # 1 GiB left beside the first kernel's 2
    waiting = json.loads((await start(jp_fetch, pod_kernelspec, memory="2GiB")).body)["kernel"]["id"]

    async def queued():
        return any(item["kernel_id"] == waiting and item["state"] == "queued" for item in await slices(jp_fetch))

    await until(queued, "the second kernel queued")
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")  # its room goes to the one in line
    await jp_serverapp.kernel_manager.get_kernel(waiting).ready
    await jp_fetch("api", "kernels", waiting, method="DELETE")

    beyond, used = requests_beyond_the_documented_role(kube)
    assert beyond == []
    # The log saw the server at work: what it made, read and removed.
    assert {("pods", "create"), ("secrets", "create"), ("pods", "get"), ("pods", "delete"), ("nodes", "list")} <= used


def subject_may(kube, verb: str, resource: str) -> bool:
    """What the RBAC authorizer says now of the server's account (a SubjectAccessReview)."""
    from kubernetes import client

    review = client.AuthorizationV1Api(kube.admin).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{kube.namespace}:{SERVER_ACCOUNT}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{kube.namespace}"],
                "resourceAttributes": {"namespace": kube.namespace, "verb": verb, "resource": resource},
            },
        },
        _preload_content=False,
    )
    return bool(json.loads(review.data)["status"].get("allowed"))


@pytest.mark.parametrize(("resource", "verb"), [("pods", "create"), ("secrets", "create"), ("pods", "get")])
async def test_a_role_missing_a_verb_refuses_the_start_in_one_line_naming_it(
    jp_fetch, jp_serverapp, pod_kernelspec, kube, pod_node, resource, verb
):
    kube.apply_documented_role(drop=(resource, verb))
    await until(lambda: _async(not subject_may(kube, verb, resource)), "the narrower Role in force", 30)
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await start(jp_fetch, pod_kernelspec)
    assert refused.value.code == 503
    message = json.loads(refused.value.response.body)["message"]
    assert "\n" not in message and "Traceback" not in message
    assert (
        f"the Jupyter server's service account may not {verb} {resource} in namespace '{kube.namespace}' "
        "(Kubernetes said: "
    ) in message
    assert (
        f'is forbidden: User "system:serviceaccount:{kube.namespace}:{SERVER_ACCOUNT}" cannot {verb} resource '
        f'"{resource}" in API group "" in the namespace "{kube.namespace}"'
    ) in message
    assert message.endswith("grant it the Role in docs/kubernetes.md.")
    assert await slices(jp_fetch) == [] and jp_serverapp.kernel_manager.list_kernel_ids() == []
    # Nothing left behind: a pod made before the refusal is deleted again.
    await until(lambda: _async(kube.pods() == []), "no pod left", 30)


async def _async(value):
    return value


def test_the_documented_network_policy_is_accepted_by_the_api_server(kube):
    from kubernetes import client

    (policy,) = documented("NetworkPolicy", ("NetworkPolicy",))
    policy["metadata"]["namespace"] = kube.namespace
    networking = client.NetworkingV1Api(kube.admin)
    networking.create_namespaced_network_policy(kube.namespace, policy, _preload_content=False)
    stored = json.loads(
        networking.read_namespaced_network_policy(
            policy["metadata"]["name"], kube.namespace, _preload_content=False
        ).data
    )
    assert stored["spec"]["podSelector"] == policy["spec"]["podSelector"]
    assert stored["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert len(stored["spec"]["ingress"]) == 1 and len(stored["spec"]["egress"]) == 2
