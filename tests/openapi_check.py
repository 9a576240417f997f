"""Checking the REST API against its description, jupyter_vgpu/server/api.yaml: the spec as an
installed wheel holds it, and whether a reply (status, content type, body, headers) or a request
body matches it. Used by tests/server/test_openapi.py and by every test folder whose server
replies should match too (tests/pods)."""

from __future__ import annotations

import importlib.resources
import json
import re
from functools import cache

import pytest
import yaml
from openapi_schema_validator import OAS31Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_URI = "urn:jupyter-vgpu:api.yaml"
HTTP_METHODS = ("get", "head", "post", "put", "patch", "delete", "options")
# A client may get these; 503 is a pod kernel the cluster did not run. Never a 500.
ERROR_STATUSES = {"400", "403", "404", "409", "503"}


@cache
def spec() -> dict:
    # Read as package data, the way an installed wheel holds it.
    return yaml.safe_load((importlib.resources.files("jupyter_vgpu.server") / "api.yaml").read_text())


def pointer(*parts: str) -> str:
    return "/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


def resolve(node: dict) -> tuple[dict, str]:
    """A node of the spec with its $ref followed (local refs only), and the JSON pointer to it."""
    location = ""
    while "$ref" in node:
        location = node["$ref"].removeprefix("#")
        node = spec()
        for part in location.strip("/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node, location


def schema_validator(location: str) -> OAS31Validator:
    """A validator for the schema at `location` (a JSON pointer into the spec), whose own $refs
    ("#/components/schemas/...") resolve within the spec."""
    registry = Registry().with_resource(SPEC_URI, Resource(contents=spec(), specification=DRAFT202012))
    return OAS31Validator({"$ref": f"{SPEC_URI}#{location}"}, registry=registry)


def template_of(path: str) -> str:
    """The documented path a concrete request path falls under (a path parameter is one segment)."""
    for template in spec()["paths"]:
        if re.fullmatch(re.sub(r"\\{\w+\\}", "[^/]+", re.escape(template)), path):
            return template
    raise AssertionError(f"{path} is under no documented path")


def check_reply(method: str, path: str, response) -> object:
    """The reply's body, after checking that its status is documented for the operation and its
    content type and body are as documented for that status."""
    template = template_of(path)
    operation = spec()["paths"][template][method.lower()]
    status = str(response.code)
    assert status in operation["responses"], (
        f"{method} {path} answered {status}, which {template} does not document: {response.body[:500]!r}"
    )
    reply, location = resolve(operation["responses"][status])
    location = location or pointer("paths", template, method.lower(), "responses", status)
    content_type = response.headers.get("Content-Type", "").split(";")[0].strip()
    assert content_type in reply["content"], (
        f"{method} {path} {status} came as {content_type!r}, documented as {list(reply['content'])}: {response.body[:500]!r}"
    )
    if content_type == "application/json":
        body = json.loads(response.body)
    else:
        body = response.body.decode()
    errors = sorted(schema_validator(location + pointer("content", content_type, "schema")).iter_errors(body), key=str)
    if errors:
        pytest.fail(
            f"{method} {path} {status} does not match the spec:\n"
            + "\n".join(
                f"- at {'/'.join(map(str, error.absolute_path)) or 'the top'}: {error.message}" for error in errors
            )
        )
    for name, header in reply.get("headers", {}).items():
        if header.get("required"):
            assert name in response.headers, f"{method} {path} {status} lacks its documented {name} header"
    return body


def request_problems(method: str, path: str, body: object) -> list[str]:
    """Why `body` is not a valid request body of the operation by the spec ([] when it is)."""
    template = template_of(path)
    request_body = spec()["paths"][template][method.lower()]["requestBody"]
    location = pointer("paths", template, method.lower(), "requestBody", "content", "application/json", "schema")
    assert "application/json" in request_body["content"]
    return [error.message for error in schema_validator(location).iter_errors(body)]
