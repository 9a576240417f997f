"""The REST API fuzzed from its description: schemathesis makes requests from api.yaml, valid
ones and ones the spec refuses, and sends them to a real `jupyter server` with the extension
(real kernels in slices on the simulated GPU). Whatever a request holds, the server answers no
500, and every answer (status, content type, body) is one api.yaml documents.

Bounded so it stays short on two cores: a fixed number of examples per operation, derandomized
(the same requests every run, so a failure reproduces), no example database."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_server_process import TOKEN, Server, user_env, vgpu_kernelspec_dir  # noqa: F401 (fixtures)

import jupyter_vgpu.server

API = schemathesis.openapi.from_path(str(next(iter(jupyter_vgpu.server.__path__)) + "/api.yaml"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Examples per operation and mode: enough to reach every field's edge cases (schemathesis favours
# them), few enough that the kernels some starts run keep the test within about a minute.
EXAMPLES = 25
# Values that broke servers like this one, put in place of fields of the generated bodies: an
# int no float holds, a size under any cap, a Unicode letter that lower() makes ASCII, digits
# int() reads but a regex should not, empty and blank text, wrong types.
HOSTILE = [10**400, -(10**400), 1e308, 0.0001, "1\u212aiB", "\u0661", "", " ", True, None, [], {"a": 1}]


@pytest.fixture
def server(user_env, tmp_path):  # noqa: F811 (user_env is the fixture imported above)
    running = Server(tmp_path, user_env)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_request_the_spec_describes_gets_a_500_or_an_undocumented_answer(server, mode):
    # A slice that exists, so that its paths are exercised past the 404 of an unknown id.
    kernel_id = server.api("POST", "api/vgpu/kernels", {"memory": "1GiB", "cores": 10})["kernel"]["id"]
    answered = {}
    for operation in API.get_all_operations():
        operation = operation.ok()
        if mode is GenerationMode.NEGATIVE and not operation.body and not operation.path_parameters:
            continue  # nothing of a GET without parameters can be made invalid
        answered[f"{operation.method.upper()} {operation.path}"] = fuzz(server, operation, mode, kernel_id)
    assert all(500 not in statuses for statuses in answered.values()), answered
    # The fuzzing reached more than the refusals: valid starts and resizes succeed.
    if mode is GenerationMode.POSITIVE:
        assert 201 in answered["POST /api/vgpu/kernels"], answered
        assert 200 in answered["PATCH /api/vgpu/slices/{kernel_id}"], answered


def fuzz(server: Server, operation, mode: GenerationMode, kernel_id: str) -> list[int]:
    """Send EXAMPLES requests made for `operation` and check each answer; the statuses."""
    auth = {"Authorization": f"token {TOKEN}"}
    statuses: list[int] = []

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=strategies.data())
    def exchange(case, data):
        # A made-up kernel credential is refused before anything else (tests/server/test_rest.py
        # covers it): the server's token, so that the requests reach the handlers.
        for name in list(case.headers or {}):
            if name.lower() in ("authorization", "x-vgpu-kernel-credential"):
                del case.headers[name]
        if isinstance(case.body, dict):
            for key in sorted(case.body):
                if data.draw(strategies.booleans()):
                    case.body[key] = data.draw(strategies.sampled_from(HOSTILE))
        if "kernel_id" in (case.path_parameters or {}) and len(statuses) % 2 == 0:
            case.path_parameters["kernel_id"] = kernel_id  # half of them on the live slice
        response = case.call(base_url=server.url.rstrip("/"), headers=auth, timeout=60)
        statuses.append(response.status_code)
        case.validate_response(response, checks=CHECKS, headers=auth)
        if case.method == "POST" and case.path == "/api/vgpu/kernels" and response.status_code == 201:
            server.api("DELETE", f"api/kernels/{response.json()['kernel']['id']}")  # keep room for the next

    exchange()
    return statuses
