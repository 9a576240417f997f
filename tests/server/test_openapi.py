"""jupyter_vgpu/server/api.yaml is the REST API: a valid OpenAPI document, naming exactly the
routes and methods the extension registers, and every reply a real server gives (successes and
the errors a client can provoke) matches its schema there."""

from __future__ import annotations

import json
import re

import pytest
from jupyter_server.base.handlers import APIHandler
from openapi_check import ERROR_STATUSES, HTTP_METHODS, check_reply, request_problems, resolve, spec
from openapi_spec_validator import validate as validate_openapi

GIB, MIB = 1 << 30, 1 << 20


@pytest.fixture
def api(jp_fetch):
    """api(method, "slices/<id>", body=..., raw=..., headers=..., status=...) sends a request to
    /api/vgpu/..., checks that it was answered with `status` and that the reply matches the
    spec, and returns the reply's body. A JSON body the server accepts (2xx) must be a valid
    request by the spec, so that the spec promises no less than the server takes."""

    async def call(method, path, body=None, *, raw=None, headers=None, status):
        full_path = f"/api/vgpu/{path}"
        if raw is None and body is not None:
            raw = json.dumps(body)
        response = await jp_fetch(
            "api",
            "vgpu",
            *path.split("/"),
            method=method,
            body=raw,
            headers=headers,
            raise_error=False,
            allow_nonstandard_methods=True,
        )
        assert response.code == status, (
            f"{method} {full_path} {raw or ''} answered {response.code}, expected {status}: {response.body[:1000]!r}"
        )
        reply = check_reply(method, full_path, response)
        if 200 <= status < 300 and body is not None:
            assert not request_problems(method, full_path, body), (
                f"the server accepted {body!r}, which the spec refuses: {request_problems(method, full_path, body)}"
            )
        return reply

    return call


def test_the_spec_is_a_valid_openapi_document():
    validate_openapi(spec())


def route_template(regex: str) -> tuple[str, dict[str, str]]:
    """A tornado route's regex as an OpenAPI path template, and the pattern of each parameter."""
    patterns = dict(re.findall(r"\(\?P<(\w+)>([^()]*)\)", regex))
    template = re.sub(r"\(\?P<(\w+)>[^()]*\)", r"{\1}", regex)
    assert not set(template) & set("()[]*+?\\$^"), f"route {regex} is more than fixed text and named parameters"
    return template, patterns


def implemented_methods(handler: type) -> set[str]:
    """The HTTP methods a handler class answers itself (not tornado's 405 or APIHandler's own)."""
    return {method for method in HTTP_METHODS if getattr(handler, method) is not getattr(APIHandler, method)}


def test_the_registered_routes_and_methods_are_exactly_the_documented_ones():
    from jupyter_vgpu.server.handlers import HANDLERS

    registered, parameter_patterns = set(), {}
    routes = list(HANDLERS)
    if routes and routes[-1][0].endswith(".*"):
        # A last catch-all (JSON 404s for paths under /api/vgpu/ that match no route) is no
        # operation; the 404 tests below check what it answers.
        routes.pop()
    for regex, handler in routes:
        template, patterns = route_template(regex)
        parameter_patterns[template] = patterns
        registered |= {(template, method) for method in implemented_methods(handler)}
    documented = {
        (template, method) for template, item in spec()["paths"].items() for method in item if method in HTTP_METHODS
    }
    assert registered == documented, (
        f"registered, not documented: {sorted(registered - documented)}; documented, not registered: {sorted(documented - registered)}"
    )
    for template, item in spec()["paths"].items():
        parameters = [resolve(parameter)[0] for parameter in item.get("parameters", [])]
        documented_patterns = {p["name"]: p["schema"]["pattern"] for p in parameters if p["in"] == "path"}
        assert documented_patterns == {name: f"^{pattern}$" for name, pattern in parameter_patterns[template].items()}


def test_every_documented_error_is_a_json_message_with_a_client_status():
    for template, item in spec()["paths"].items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            statuses = set(operation["responses"])
            errors = {status for status in statuses if not status.startswith("2")}
            assert errors <= ERROR_STATUSES, f"{method} {template} documents {sorted(errors - ERROR_STATUSES)}"
            assert "403" in errors, f"{method} {template} does not document 403"
            for status in errors:
                reply, _ = resolve(operation["responses"][status])
                assert reply["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


async def test_lists_a_kernel_start_a_slice_and_a_resize_match_the_spec(
    api, vgpu_kernelspec, run_in_kernel, cuda_prelude
):
    assert await api("GET", "slices", status=200) == []
    devices = await api("GET", "devices", status=200)
    assert [(d["memory_total_bytes"], d["memory_free_bytes"], d["slices"]) for d in devices] == [
        (8 * GIB, 8 * GIB, 0),
        (16 * GIB, 16 * GIB, 0),
    ]

    started = await api(
        "POST",
        "kernels",
        {"name": vgpu_kernelspec, "path": "", "memory": "1GiB", "cores": 20, "policy": "burst", "device": 1},
        status=201,
    )
    kernel_id = started["kernel"]["id"]
    assert started["slice"]["kernel_id"] == kernel_id
    assert started["slice"]["limits"] == {"memory_bytes": GIB, "cores": 20, "policy": "burst"}
    assert started["slice"]["device"]["index"] == 1

    await run_in_kernel(kernel_id, cuda_prelude + "print(allocate(256 << 20))")
    (listed,) = await api("GET", "slices", status=200)
    assert listed["state"] == "running" and listed["holder"] == "local" and listed["warnings"] == []
    assert listed["usage"]["memory_bytes"] == 256 * MIB
    assert [process["memory_bytes"] for process in listed["usage"]["processes"]] == [256 * MIB]
    alone = await api("GET", f"slices/{kernel_id}", status=200)
    assert {key: value for key, value in alone.items() if key != "usage"} == {
        key: value for key, value in listed.items() if key != "usage"
    }
    large = (await api("GET", "devices", status=200))[1]
    assert (large["memory_allocated_bytes"], large["memory_free_bytes"], large["slices"]) == (GIB, 15 * GIB, 1)

    resized = await api("PATCH", f"slices/{kernel_id}", {"memory": 1536, "cores": "40%"}, status=200)
    assert resized["limits"] == {"memory_bytes": 1536 * MIB, "cores": 40, "policy": "burst"}  # a bare number is MiB
    resized = await api("PATCH", f"slices/{kernel_id}", {"memory": "2GiB", "policy": "hard"}, status=200)
    assert resized["limits"] == {"memory_bytes": 2 * GIB, "cores": 40, "policy": "hard"}

    started = await api(
        "POST", "kernels", {"name": vgpu_kernelspec, "memory": 512, "cores": "10", "device": "0"}, status=201
    )
    assert started["slice"]["limits"]["memory_bytes"] == 512 * MIB and started["slice"]["device"]["index"] == 0
    assert len(await api("GET", "slices", status=200)) == 2

    metrics = await api("GET", "metrics", status=200)
    assert f'vgpu_slice_memory_limit_bytes{{device="1",kernel_id="{kernel_id}",policy="hard"}}' in metrics


async def test_the_location_of_a_started_kernel_is_its_jupyter_url(jp_fetch, vgpu_kernelspec, jp_base_url):
    response = await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": vgpu_kernelspec}))
    assert response.code == 201
    kernel_id = json.loads(response.body)["kernel"]["id"]
    assert response.headers["Location"] == f"{jp_base_url}api/kernels/{kernel_id}"


@pytest.mark.parametrize(
    "body",
    [
        {"memory": "lots"},
        {"memory": 0},
        {"memory": True},
        {"cores": 0},
        {"cores": "half"},
        {"cores": 12.5},
        {"policy": "soft"},
        {"device": "9"},
        {"colour": "red"},
    ],
)
async def test_bad_kernel_starts_get_400_bodies_that_match_the_spec(api, vgpu_kernelspec, body):
    await api("POST", "kernels", {"name": vgpu_kernelspec, **body}, status=400)
    assert await api("GET", "slices", status=200) == []


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"memory"'])
async def test_kernel_starts_that_are_not_json_objects_get_400_bodies_that_match_the_spec(api, raw):
    await api("POST", "kernels", raw=raw, status=400)


async def test_a_kernelspec_without_slices_gets_400_and_an_unknown_one_404(api, vgpu_kernelspec):
    await api("POST", "kernels", {"name": "python3"}, status=400)
    await api("POST", "kernels", {"name": "no-such-kernelspec"}, status=404)


@pytest.mark.parametrize(
    "raw",
    [
        "{}",
        '{"memory": "1TiB-ish"}',
        '{"memory": -1}',
        '{"cores": 101}',
        '{"cores": "40%%"}',
        '{"policy": 3}',
        '{"device": 1}',
        '{"colour": "red"}',
        "[1, 2]",
        "{not json",
    ],
)
async def test_bad_resizes_get_400_bodies_that_match_the_spec(api, vgpu_kernelspec, raw):
    started = await api("POST", "kernels", {"name": vgpu_kernelspec}, status=201)
    kernel_id = started["kernel"]["id"]
    await api("PATCH", f"slices/{kernel_id}", raw=raw, status=400)
    assert (await api("GET", f"slices/{kernel_id}", status=200))["limits"] == started["slice"]["limits"]


@pytest.mark.parametrize("kernel_id", ["no-such-kernel", "..", ".", "a.b", "ünïcode", "a b", "50%"])
async def test_unknown_slices_get_404_json_bodies_that_match_the_spec(api, kernel_id):
    # Ids outside [\w-]+ (sent percent-encoded) match no route: still a JSON 404, never
    # Jupyter's HTML page.
    await api("GET", f"slices/{kernel_id}", status=404)
    await api("PATCH", f"slices/{kernel_id}", {"cores": 10}, status=404)


async def test_no_room_gets_409_bodies_that_match_the_spec(api, vgpu_kernelspec):
    refused = await api("POST", "kernels", {"name": vgpu_kernelspec, "memory": "20GiB"}, status=409)
    assert "%%" not in refused["message"]
    started = await api("POST", "kernels", {"name": vgpu_kernelspec, "memory": "4GiB", "device": 0}, status=201)
    refused = await api("PATCH", f"slices/{started['kernel']['id']}", {"memory": "9GiB"}, status=409)
    assert "%%" not in refused["message"]


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "devices", None),
        ("GET", "slices", None),
        ("GET", "slices/some-kernel", None),
        ("PATCH", "slices/some-kernel", {"cores": 10}),
        ("POST", "kernels", {"name": "vgpu-test"}),
        ("GET", "metrics", None),
    ],
)
async def test_requests_without_credentials_get_403_bodies_that_match_the_spec(api, method, path, body):
    anonymous = {"Authorization": ""}  # jp_fetch adds the server's token unless told otherwise
    await api(method, path, body, headers=anonymous, status=403)
    forged = {"Authorization": "", "X-VGPU-Kernel-Credential": "not-a-credential"}
    await api(method, path, body, headers=forged, status=403)


# Bodies at the edges of api.yaml's MemorySize, SmShare and Policy: (body, whether the spec takes
# it). The server must agree with the spec on each, both ways (issue 27 #9).
RESIZE_EDGES = [
    ({"memory": 1.9999}, False),  # was a cap of 2,097,047 bytes
    ({"memory": 0.5}, False),
    ({"memory": 1536.0}, True),  # an integer to JSON Schema
    ({"memory": "1536.5"}, True),  # text may have a fraction: rounded down to whole bytes
    ({"cores": 10.0}, True),  # was refused: "must be a string or a number, not 10.0"
    ({"cores": 12.5}, False),
    ({"cores": "0"}, False),
    ({"cores": "101%"}, False),
    ({"cores": "007"}, True),
    ({"policy": "HARD"}, False),  # was accepted though the enum is exact
    ({"policy": " hard"}, False),
    ({"policy": "burst"}, True),
]


@pytest.mark.parametrize("body, valid", RESIZE_EDGES)
async def test_a_resize_is_taken_exactly_when_the_spec_takes_it(api, vgpu_kernelspec, body, valid):
    assert (not request_problems("PATCH", "/api/vgpu/slices/some-kernel", body)) == valid, "the table is wrong"
    started = await api("POST", "kernels", {"name": vgpu_kernelspec, "device": 1}, status=201)
    kernel_id = started["kernel"]["id"]
    reply = await api("PATCH", f"slices/{kernel_id}", body, status=200 if valid else 400)
    if not valid:
        assert any(word in reply["message"] for word in ("whole", "1 to 100", "exactly")), reply["message"]
    elif "memory" in body:
        assert reply["limits"]["memory_bytes"] == int(float(body["memory"]) * MIB)
    elif "cores" in body:
        assert reply["limits"]["cores"] == int(body["cores"])


@pytest.mark.parametrize(
    "body, valid",
    [
        *[edge for edge in RESIZE_EDGES if "memory" not in edge[0]],
        ({"device": 1.0}, True),  # an integer to JSON Schema, as cores 10.0
        ({"device": 1.5}, False),
    ],
)
async def test_a_kernel_start_is_taken_exactly_when_the_spec_takes_it(api, vgpu_kernelspec, body, valid):
    assert (not request_problems("POST", "/api/vgpu/kernels", {"name": vgpu_kernelspec, **body})) == valid
    await api("POST", "kernels", {"name": vgpu_kernelspec, **body}, status=201 if valid else 400)


@pytest.mark.parametrize(
    "body, valid",
    [
        ({"processes": [{"pid": 7, "allocated": 3.2e19}]}, False),  # beyond the documented 2^62
        ({"processes": [{"pid": 7, "allocated": 3.2e18}]}, True),  # a whole number, as JSON Schema's integer
        ({"processes": [{"pid": 7, "allocated": 1.5}]}, False),
        ({"limits": {"memory_bytes": 3.2e19, "cores": 10, "policy": "hard"}}, False),
        ({"limits": {"memory_bytes": 1 << 30, "cores": 10.0, "policy": "hard"}}, True),
        ({"limits": {"memory_bytes": 1 << 30, "cores": 10, "policy": "HARD"}}, False),
        ({"sm_util": 100.0}, True),
    ],
)
async def test_a_usage_report_is_checked_exactly_as_the_spec_says(api, body, valid):
    """A report for a kernel the server does not have: a valid one gets as far as the 404."""
    assert (not request_problems("POST", "/api/vgpu/slices/some-kernel/usage", body)) == valid, "the table is wrong"
    await api("POST", "slices/no-such-kernel/usage", body, status=404 if valid else 400)
