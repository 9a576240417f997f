"""GET /api/vgpu/defaults: the slice a start gets for each field neither its request nor its
kernelspec sets, as the server is configured (issue 27 #4: JupyterLab's start dialog shows them),
matching api.yaml, and what a start of a kernelspec without a size really gets."""

from __future__ import annotations

import json

import pytest
from openapi_check import check_reply

GIB = 1 << 30


@pytest.fixture
def jp_server_config(jp_server_config):
    settings = {"default_memory": "3GiB", "default_cores": 30, "default_policy": "burst"}
    return {**jp_server_config, "VGPUApp": {**jp_server_config["VGPUApp"], **settings}}


async def test_the_defaults_are_the_server_s_and_a_start_without_a_size_gets_them(jp_fetch, unsized_kernelspec):
    response = await jp_fetch("api", "vgpu", "defaults")
    defaults = check_reply("GET", "/api/vgpu/defaults", response)

    assert defaults == {"memory_bytes": 3 * GIB, "cores": 30, "policy": "burst"}
    started = await jp_fetch("api", "vgpu", "kernels", method="POST", body=json.dumps({"name": unsized_kernelspec}))
    assert json.loads(started.body)["slice"]["limits"] == defaults


async def test_the_defaults_need_the_user_s_credentials(jp_fetch):
    response = await jp_fetch("api", "vgpu", "defaults", headers={"Authorization": ""}, raise_error=False)
    assert response.code == 403
    check_reply("GET", "/api/vgpu/defaults", response)
