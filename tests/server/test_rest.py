"""The REST API of a real Jupyter server with real kernels in slices on the simulated GPU."""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import signal

import pytest
import tornado.httpclient
from jupyter_server.auth import Authorizer
from openapi_check import spec

GIB = 1 << 30


async def fetch_json(jp_fetch, *path, method="GET", body=None):
    response = await jp_fetch(*path, method=method, body=None if body is None else json.dumps(body))
    return json.loads(response.body)


async def error_of(jp_fetch, *path, method="GET", body=None, raw=None):
    with pytest.raises(tornado.httpclient.HTTPClientError) as caught:
        await jp_fetch(
            *path, method=method, body=raw if raw is not None else (None if body is None else json.dumps(body))
        )
    return caught.value.code, json.loads(caught.value.response.body)["message"]


async def start_sliced(jp_fetch, kernelspec, **fields):
    reply = await fetch_json(jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": kernelspec, **fields})
    return reply["kernel"]["id"], reply["slice"]


async def test_devices_report_capacity_and_what_slices_hold(jp_fetch, vgpu_kernelspec):
    devices = await fetch_json(jp_fetch, "api", "vgpu", "devices")
    assert [(d["index"], d["name"], d["memory_total_bytes"], d["sm_count"]) for d in devices] == [
        (0, "Sim Small", 8 * GIB, 50),
        (1, "Sim Large", 16 * GIB, 100),
    ]
    assert all(d["memory_free_bytes"] == d["memory_capacity_bytes"] == d["memory_total_bytes"] for d in devices)
    await start_sliced(jp_fetch, vgpu_kernelspec, memory="3GiB", cores=40, device=1)
    large = (await fetch_json(jp_fetch, "api", "vgpu", "devices"))[1]
    assert (large["memory_allocated_bytes"], large["memory_free_bytes"], large["sm_share_allocated"]) == (
        3 * GIB,
        13 * GIB,
        40,
    )


async def test_a_kernel_started_for_a_notebook_is_named_after_it_in_every_listing(jp_fetch, vgpu_kernelspec):
    """The path a start names is the notebook's (a session, as POST /api/sessions makes), not only
    in the reply; a folder is only where the kernel runs."""
    kernel_id, sliced = await start_sliced(jp_fetch, vgpu_kernelspec, path="work/analysis.ipynb")
    folder_kernel, in_folder = await start_sliced(jp_fetch, vgpu_kernelspec, path="work")
    assert (sliced["path"], in_folder["path"]) == ("work/analysis.ipynb", "")
    listed = {item["kernel_id"]: item["path"] for item in await fetch_json(jp_fetch, "api", "vgpu", "slices")}
    assert listed == {kernel_id: "work/analysis.ipynb", folder_kernel: ""}
    (session,) = await fetch_json(jp_fetch, "api", "sessions")
    assert (session["path"], session["type"], session["kernel"]["id"]) == ("work/analysis.ipynb", "notebook", kernel_id)


async def test_kernel_started_with_a_slice_runs_inside_it(jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude):
    kernel_id, sliced = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB", cores=30, policy="burst")
    assert sliced["limits"] == {"memory_bytes": 2 * GIB, "cores": 30, "policy": "burst"}
    out = await run_in_kernel(kernel_id, cuda_prelude + "print(memory()[1]); print(allocate(512 << 20))")
    assert out.split() == [str(2 * GIB), "0"]
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["kernel_id"] == kernel_id and listed["state"] == "running"
    assert listed["usage"]["memory_bytes"] == 512 << 20
    assert [p["memory_bytes"] for p in listed["usage"]["processes"]] == [512 << 20]


async def test_kernelspec_defaults_apply_to_a_plain_kernel_start(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    reply = await fetch_json(jp_fetch, "api", "kernels", method="POST", body={"name": vgpu_kernelspec})
    out = await run_in_kernel(reply["id"], cuda_prelude + "print(memory()[1])")
    assert out.strip() == str(1 * GIB)
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["limits"] == {"memory_bytes": GIB, "cores": 50, "policy": "hard"}


async def test_resize_reaches_the_running_kernel_on_its_next_cuda_call(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB")
    await run_in_kernel(kernel_id, cuda_prelude)
    resized = await fetch_json(
        jp_fetch, "api", "vgpu", "slices", kernel_id, method="PATCH", body={"memory": "3GiB", "cores": 20}
    )
    assert resized["limits"]["memory_bytes"] == 3 * GIB and resized["limits"]["cores"] == 20
    assert (await run_in_kernel(kernel_id, "print(memory()[1])")).strip() == str(3 * GIB)
    await fetch_json(jp_fetch, "api", "vgpu", "slices", kernel_id, method="PATCH", body={"memory": "512MiB"})
    assert (await run_in_kernel(kernel_id, "print(memory()[1])")).strip() == str(512 << 20)


async def test_resize_beyond_the_device_is_refused_with_the_reason(jp_fetch, vgpu_kernelspec):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="4GiB", device=0)
    await start_sliced(jp_fetch, vgpu_kernelspec, memory="3GiB", device=0)
    code, message = await error_of(
        jp_fetch, "api", "vgpu", "slices", kernel_id, method="PATCH", body={"memory": "9GiB"}
    )
    assert code == 409
    # Past the whole GPU: the start's one sentence (issue 34 item 3), no advice the line makes moot.
    assert message == "Its 9GiB GPU slice can never fit: GPU 0 has 8GiB in all. Ask for 8GiB or less."


async def test_a_resize_takes_the_room_of_a_kernel_that_has_not_used_the_gpu(jp_fetch, vgpu_kernelspec):
    # GPU 0 has 8 GiB: 4 + 3 are held, but the 3 GiB kernel has made no CUDA call, so its room is
    # lent (nothing to move) and the resize to 6 GiB goes ahead.
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="4GiB", device=0)
    other, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="3GiB", device=0)
    resized = await fetch_json(jp_fetch, "api", "vgpu", "slices", kernel_id, method="PATCH", body={"memory": "6GiB"})
    assert resized["limits"]["memory_bytes"] == 6 * GIB
    lent = await fetch_json(jp_fetch, "api", "vgpu", "slices", other)
    assert lent["state"] == "lent" and lent["host_memory_bytes"] == 0
    assert lent["notice"].startswith("lent to make room for a kernel that grows: it had not used the GPU")


async def test_a_kernel_that_can_never_fit_is_refused_at_once_saying_why(jp_fetch, vgpu_kernelspec):
    code, message = await error_of(
        jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": vgpu_kernelspec, "memory": "20GiB"}
    )
    assert code == 409
    # Short enough for JupyterLab's dialog: what the largest device has, and what to do.
    assert message == (
        "Kernel not started. Its 20GiB GPU slice can never fit: the largest GPU here, GPU 1, has 16GiB in all. "
        "Ask for 16GiB or less."
    )
    assert await fetch_json(jp_fetch, "api", "vgpu", "slices") == []


@pytest.mark.parametrize(
    "body, accepted",
    [
        ({"memory": "lots"}, "512MiB, 4GiB, 4G or a bare number of MiB"),
        ({"cores": 0}, "whole percentage from 1 to 100"),
        ({"cores": "half"}, "whole percentage from 1 to 100"),
        ({"policy": "soft"}, "'hard' (never above the share) or 'burst'"),
        ({"device": "9"}, "matches no single GPU"),
        ({"colour": "red"}, "unknown field(s) colour"),
        ({"cores": "\u00b2"}, "whole percentage from 1 to 100"),  # isdigit() but not an int
        ({"memory": "9" * 400}, "larger than any GPU"),
        ({"memory": 9e300}, "larger than any GPU"),
        ({"memory": True}, "must be a string or a number"),
        ({"memory": int("9" * 400)}, "larger than any GPU"),  # a JSON int of any length
        ({"memory": "0.0001"}, "less than the smallest slice, 1MiB"),  # 104 bytes
        ({"memory": 0.0001}, "a number of MiB with a fraction; give a whole number of MiB"),
        ({"policy": "HARD"}, "written exactly so (lower case, no spaces)"),
        ({"memory": "1\u212aiB"}, "is not a size like 512MiB"),  # the Kelvin sign, which lower() makes "k"
        ({"device": ""}, "is not a GPU index (0, 1, ...) or UUID (GPU-...)"),
        ({"device": " "}, "is not a GPU index (0, 1, ...) or UUID (GPU-...)"),
    ],
)
async def test_bad_kernel_start_fields_get_400_saying_what_is_accepted(jp_fetch, vgpu_kernelspec, body, accepted):
    code, message = await error_of(
        jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": vgpu_kernelspec, **body}
    )
    assert code == 400
    assert accepted in message
    assert await fetch_json(jp_fetch, "api", "vgpu", "slices") == []


@pytest.mark.parametrize(
    "raw, accepted",
    [
        ('{"memory": "1TiB-ish"}', "512MiB, 4GiB"),
        ('{"cores": 101}', "1 to 100"),
        ('{"policy": 3}', "must be a string"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "not JSON"),
        ("{}", "nothing to change"),
        ('{"cores": "\u00b2"}', "1 to 100"),
        ('{"memory": "' + "9" * 400 + '"}', "larger than any GPU"),
        ("[" * 50_000, "not JSON"),  # deep enough to exhaust the parser's recursion
        ("[" * 100_000, "larger than 64 KiB"),
        ('{"memory": 0.0}', "more than zero"),
        ('{"memory": ' + "9" * 400 + "}", "larger than any GPU"),
        ('{"memory": "0.0001"}', "less than the smallest slice, 1MiB"),
        ('{"memory": 1.9999}', "a number of MiB with a fraction"),
        ('{"policy": " hard"}', "written exactly so"),
        ('{"memory": "1\u212aiB"}', "is not a size like 512MiB"),
    ],
)
async def test_bad_resize_fields_get_400(jp_fetch, vgpu_kernelspec, raw, accepted):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec)
    code, message = await error_of(jp_fetch, "api", "vgpu", "slices", kernel_id, method="PATCH", raw=raw)
    assert code == 400
    assert accepted in message


@pytest.mark.parametrize(
    "memory, expected", [(2048, 2 << 30), (2048.0, 2 << 30), ("2048", 2 << 30), ("1.5GiB", 3 << 29)]
)
async def test_a_bare_number_for_memory_is_mib_on_every_path(jp_fetch, vgpu_kernelspec, memory, expected):
    started = await fetch_json(
        jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": vgpu_kernelspec, "memory": memory}
    )
    assert started["slice"]["limits"]["memory_bytes"] == expected
    resized = await fetch_json(
        jp_fetch, "api", "vgpu", "slices", started["kernel"]["id"], method="PATCH", body={"memory": memory}
    )
    assert resized["limits"]["memory_bytes"] == expected


@pytest.mark.parametrize("path", ["slices/..%2F..", "slices/a.b", "nothing-here", "slices/x/y"])
async def test_any_other_path_under_the_api_gets_a_json_404(jp_fetch, path):
    code, message = await error_of(jp_fetch, "api", "vgpu", *path.split("/"))
    assert code == 404 and "no such vGPU API path" in message


async def test_the_api_root_answers_a_json_index_of_its_paths(jp_fetch, jp_base_url):
    index = await fetch_json(jp_fetch, "api", "vgpu")
    assert index["api"] == "jupyter-vgpu"
    # Every path api.yaml documents under it, with the server's base_url.
    documented = {f"{jp_base_url}{path.lstrip('/')}" for path in spec()["paths"] if path != "/api/vgpu"}
    assert set(index["paths"]) == documented and f"{jp_base_url}api/vgpu/slices/{{kernel_id}}" in documented
    code, message = await error_of(jp_fetch, "api", "vgpu", "slice")
    assert code == 404 and "the paths are /api/vgpu/devices, /api/vgpu/slices" in message


async def test_a_start_without_a_name_starts_the_vgpu_kernelspec(jp_fetch, vgpu_kernelspec):
    # Jupyter's default kernelspec (python3) starts no slice; the only vGPU one is chosen.
    kernel_id, sliced = await start_sliced_unnamed(jp_fetch)
    assert sliced["kernelspec"] == "Python 3 (GPU slice, test)"
    assert (await fetch_json(jp_fetch, "api", "kernels", kernel_id))["name"] == vgpu_kernelspec


async def test_a_start_without_a_name_among_several_vgpu_kernelspecs_says_which_to_name(
    jp_fetch, vgpu_kernelspec, unsized_kernelspec
):
    code, message = await error_of(jp_fetch, "api", "vgpu", "kernels", method="POST", body={})
    assert code == 400
    assert message == f"name the kernelspec to start: a vGPU kernelspec, one of {vgpu_kernelspec}, {unsized_kernelspec}"


async def test_a_start_without_a_name_and_no_vgpu_kernelspec_says_so(jp_fetch):
    code, message = await error_of(jp_fetch, "api", "vgpu", "kernels", method="POST", body={"memory": "1GiB"})
    assert code == 400 and "none is installed (jupyter-vgpu installs python3-vgpu)" in message


async def start_sliced_unnamed(jp_fetch):
    reply = await fetch_json(jp_fetch, "api", "vgpu", "kernels", method="POST", body={"memory": "1GiB"})
    return reply["kernel"]["id"], reply["slice"]


async def test_a_busy_kernel_that_has_not_used_the_gpu_is_unused_not_idle(
    jp_fetch, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec)
    await run_in_kernel(kernel_id, "print(sum(range(10**6)))")
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["state"] == "unused"  # api.yaml: no process of the kernel uses the GPU yet
    await run_in_kernel(kernel_id, cuda_prelude + "print(allocate(1 << 20))")
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["state"] == "running"


async def test_unknown_kernels_get_404(jp_fetch):
    code, message = await error_of(
        jp_fetch, "api", "vgpu", "slices", "no-such-kernel", method="PATCH", body={"cores": 10}
    )
    assert code == 404 and "no-such-kernel" in message
    code, _ = await error_of(jp_fetch, "api", "vgpu", "slices", "no-such-kernel")
    assert code == 404


async def test_kernelspec_without_the_vgpu_provisioner_is_refused(jp_fetch, vgpu_kernelspec):
    code, message = await error_of(jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": "python3"})
    assert code == 400 and "does not start kernels in GPU slices" in message


async def test_twenty_concurrent_starts_against_room_for_ten_admit_ten_and_line_up_the_rest(jp_fetch, vgpu_kernelspec):
    # Room: 8 GiB + 16 GiB = 24 slices of 1 GiB by memory, but SM shares of 20 % allow 5 + 5.
    # Nobody is refused: the others wait in the line, first come, first served (a started kernel
    # that is idle and has not used the GPU lends its room to the next in line, so how many still
    # wait depends on how fast the first ones start).
    outcomes = await asyncio.gather(
        *(start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", cores=20) for _ in range(20))
    )
    queued = [slice_ for _, slice_ in outcomes if slice_["state"] == "queued"]
    assert all("percent more of the SMs (0 percent free)" in slice_["queue"]["waiting_for"] for slice_ in queued)
    listed = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert len(listed) == 20
    positions = sorted(item["queue"]["position"] for item in listed if item["state"] == "queued")
    assert positions == list(range(1, len(positions) + 1))  # 1 is next
    states = [item["state"] for item in listed]
    assert states.count("queued") + states.count("lent") == 10 and states.count("unused") == 10
    devices = await fetch_json(jp_fetch, "api", "vgpu", "devices")
    assert [d["sm_share_allocated"] for d in devices] == [100, 100]


async def test_killed_kernel_stops_counting_at_once_and_its_slice_goes_with_it(
    jp_fetch, jp_serverapp, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="2GiB")
    await run_in_kernel(kernel_id, cuda_prelude + "print(allocate(1 << 30))")
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["usage"]["memory_bytes"] == 1 << 30
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    kernel.autorestart = False
    os.kill(kernel.provisioner.pid, signal.SIGKILL)
    await kernel.provisioner.wait()
    (listed,) = await fetch_json(jp_fetch, "api", "vgpu", "slices")
    assert listed["usage"]["memory_bytes"] == 0 and listed["state"] == "unused"
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert await fetch_json(jp_fetch, "api", "vgpu", "slices") == []
    devices = await fetch_json(jp_fetch, "api", "vgpu", "devices")
    assert all(d["memory_free_bytes"] == d["memory_capacity_bytes"] for d in devices)


async def test_metrics_expose_devices_and_slices(jp_fetch, vgpu_kernelspec):
    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="1GiB", cores=25, device=0)
    response = await jp_fetch("api", "vgpu", "metrics")
    text = response.body.decode()
    assert response.headers["Content-Type"].startswith("text/plain")
    assert 'vgpu_device_memory_allocated_bytes{device="0",uuid=' in text
    assert f'vgpu_slice_memory_limit_bytes{{device="0",kernel_id="{kernel_id}",policy="hard"}} 1.073741824e+09' in text
    assert f'vgpu_slice_sm_share_percent{{device="0",kernel_id="{kernel_id}",policy="hard"}} 25.0' in text


class DenyVGPU(Authorizer):
    """Lets everything through but the vgpu resource, so each handler must check for itself."""

    def is_authorized(self, handler, user, action, resource):
        return resource != "vgpu"


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "devices", None),
        ("GET", "slices", None),
        ("GET", "slices/some-kernel", None),
        ("PATCH", "slices/some-kernel", '{"cores": 10}'),
        ("POST", "kernels", '{"name": "vgpu-test"}'),
        ("GET", "metrics", None),
    ],
)
async def test_every_handler_refuses_unauthorised_and_unauthenticated_requests(
    jp_serverapp, jp_fetch, http_server_client, jp_base_url, method, path, body
):
    url = f"{jp_base_url}api/vgpu/{path}"
    anonymous = await http_server_client.fetch(url, method=method, body=body, raise_error=False, follow_redirects=False)
    assert anonymous.code == 403
    jp_serverapp.web_app.settings["authorizer"] = DenyVGPU(
        parent=jp_serverapp, identity_provider=jp_serverapp.identity_provider
    )
    with pytest.raises(tornado.httpclient.HTTPClientError) as caught:
        await jp_fetch("api", "vgpu", *path.split("/"), method=method, body=body)
    assert caught.value.code == 403


async def test_limits_a_kernel_rewrites_in_its_region_are_restored_and_the_slice_flagged(
    jp_fetch, jp_serverapp, vgpu_kernelspec
):
    from jupyter_vgpu.holders.region import Region

    kernel_id, _ = await start_sliced(jp_fetch, vgpu_kernelspec, memory="3GiB", cores=30)
    holder = jp_serverapp.web_app.settings["vgpu_slice_manager"].holder("local")
    # What a process of the kernel can do: its region file is writable by its Unix user.
    with Region.open(holder.path(kernel_id)) as region:
        region.set_limits(memory_limit=16 * GIB, sm_share=100)
        listed = await fetch_json(jp_fetch, "api", "vgpu", "slices", kernel_id)
        assert region.limits.memory_limit == 3 * GIB and region.limits.sm_share == 30
    assert listed["limits"] == {"memory_bytes": 3 * GIB, "cores": 30, "policy": "hard"}
    (warning,) = listed["warnings"]
    assert "memory cap 16GiB, SM share 100%" in warning and "the server restored them" in warning
    # It stays flagged after the server put things right.
    assert (await fetch_json(jp_fetch, "api", "vgpu", "slices"))[0]["warnings"] == [warning]


async def test_a_slice_is_sized_by_the_request_then_the_kernelspec_then_the_server_defaults(
    jp_fetch, vgpu_kernelspec, unsized_kernelspec
):
    # The kernelspec sets none: the server's VGPUApp.default_memory / default_cores (2GiB, 40).
    _, default = await start_sliced(jp_fetch, unsized_kernelspec)
    assert default["limits"] == {"memory_bytes": 2 * GIB, "cores": 40, "policy": "hard"}
    # The kernelspec sets 1GiB and 50: it wins over the defaults, the request over both.
    _, from_spec = await start_sliced(jp_fetch, vgpu_kernelspec)
    assert from_spec["limits"] == {"memory_bytes": GIB, "cores": 50, "policy": "hard"}
    _, asked = await start_sliced(jp_fetch, vgpu_kernelspec, memory=512, policy="burst")
    assert asked["limits"] == {"memory_bytes": 512 << 20, "cores": 50, "policy": "burst"}
    # JupyterLab's own path (no sizes at all) gets the same rule.
    model = await fetch_json(jp_fetch, "api", "kernels", method="POST", body={"name": unsized_kernelspec})
    assert (await fetch_json(jp_fetch, "api", "vgpu", "slices", model["id"]))["limits"]["memory_bytes"] == 2 * GIB


async def test_a_refused_start_is_one_warning_line_in_the_log_not_two_error_tracebacks(
    jp_fetch, vgpu_kernelspec, caplog
):
    caplog.clear()
    code, message = await error_of(
        jp_fetch, "api", "vgpu", "kernels", method="POST", body={"name": vgpu_kernelspec, "memory": "17GiB"}
    )
    assert code == 409
    assert [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info] == []
    said = [record for record in caplog.records if record.getMessage() == message]
    assert len(said) == 1 and said[0].levelname == "WARNING", [record.getMessage() for record in caplog.records]


async def test_a_slices_owner_is_the_servers_user_whatever_the_start_path(jp_fetch, vgpu_kernelspec, monkeypatch):
    # Jupyter's own start (no owner) and ours (a token user with a random name) gave "" and
    # "Anonymous ..."; the one rule: the hub user whose server this is, else this Unix account.
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    await start_sliced(jp_fetch, vgpu_kernelspec)
    await fetch_json(jp_fetch, "api", "kernels", method="POST", body={"name": vgpu_kernelspec})
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    await start_sliced(jp_fetch, vgpu_kernelspec)
    owners = sorted(item["owner"] for item in await fetch_json(jp_fetch, "api", "vgpu", "slices"))
    assert owners == sorted([getpass.getuser(), getpass.getuser(), "ada"])
