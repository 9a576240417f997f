"""`jupyter vgpu status | resize` against a running server (the stand-in of tests/cli/conftest.py):
how they find it and authenticate, what they show, and what they say when a request fails."""

from __future__ import annotations

import pytest


def test_status_finds_the_running_server_and_shows_every_slice_with_its_token(vgpu, running_server):
    running_server.slices[0]["warnings"] = ["limits changed from inside the kernel were restored"]
    result = vgpu("status")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == [
        "KERNEL",
        "NOTEBOOK",
        "GPU",
        "MEMORY",
        "USED",
        "/",
        "CAP",
        "SM",
        "%",
        "/",
        "SHARE",
        "POLICY",
        "STATE",
    ]
    assert rows[0].split() == [
        "1c2e3f4a",
        "work/train.ipynb",
        "0",
        "512MiB",
        "/",
        "2GiB",
        "12",
        "/",
        "30",
        "hard",
        "running",
    ]
    assert rows[1].strip() == "warning: limits changed from inside the kernel were restored"
    assert rows[2].split() == ["1c2e9999", "-", "0", "0", "/", "1GiB", "0", "/", "50", "burst", "running"]
    assert rows[3].split()[:6] == ["abcdef01", "eval.ipynb", "0", "3GiB", "/", "4GiB"]
    # GET slices, then GET devices (for memory they hold beyond the slices: none here, no line).
    assert [request[3] for request in running_server.requests] == [f"token {running_server.token}"] * 2
    assert len(rows) == 4


def test_status_says_what_a_gpu_holds_outside_any_slice_and_over_caps(vgpu, running_server):
    running_server.devices = [
        {"index": 0, "memory_outside_bytes": 2 << 30, "memory_over_cap_bytes": 9 << 30, "memory_free_bytes": 1 << 30}
    ]
    status = vgpu("status")
    assert status.returncode == 0, status.stderr
    last = status.stdout.splitlines()[-1]
    assert last == "GPU 0: 2GiB in use outside any slice, 9GiB over its slice's cap; 1GiB free for slices"


def test_status_says_once_under_the_table_what_unused_means(vgpu, running_server):
    running_server.slices[0]["state"] = running_server.slices[1]["state"] = "unused"
    status = vgpu("status")
    assert status.returncode == 0, status.stderr
    explained = [line for line in status.stdout.splitlines() if line.startswith("unused: ")]
    assert explained == [
        (
            "unused: the slice is held, but no process of the kernel uses the GPU in it: none has made a CUDA call "
            "yet, or those that did have ended"
        )
    ]


def test_a_server_named_by_url_is_asked_with_jupyter_token(vgpu, cli_env, stand_in_server):
    without = vgpu("status", "--server", stand_in_server.url)
    assert (without.returncode, without.stderr.strip()) == (1, "jupyter vgpu status: Forbidden (HTTP 403)")
    cli_env["JUPYTER_TOKEN"] = stand_in_server.token
    result = vgpu("status", "--server", stand_in_server.url)
    assert result.returncode == 0, result.stderr
    # Refused at its first request; then GET slices and GET devices with the token.
    assert [request[3] for request in stand_in_server.requests] == [None] + [f"token {stand_in_server.token}"] * 2


def test_no_running_server_is_said_plainly(vgpu):
    result = vgpu("status")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "jupyter vgpu status: no running Jupyter server found; start one (jupyter lab) or pass --server URL"
    )


def test_resize_sends_the_change_to_the_one_kernel_the_prefix_names(vgpu, running_server):
    result = vgpu("resize", "abc", "--memory", "6144", "--cores", "40%", "--policy", "BURST")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "resized abcdef01: memory 6GiB, cores 40 %, policy burst"
    method, path, body, _ = running_server.requests[-1]
    assert (method, path, body) == (
        "PATCH",
        "/api/vgpu/slices/abcdef01-0000-4000-8000-000000000003",
        {"memory": "6144", "cores": 40, "policy": "burst"},
    )


def test_resize_of_an_id_nothing_matches_lists_the_sliced_kernels(vgpu, running_server):
    result = vgpu("resize", "zzz", "--cores", "20")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "jupyter vgpu resize: no sliced kernel's id starts with 'zzz'; the sliced kernels are "
        "1c2e3f4a (work/train.ipynb), 1c2e9999 (no notebook), abcdef01 (eval.ipynb)"
    )
    assert [request[0] for request in running_server.requests] == ["GET"]


def test_resize_of_an_ambiguous_prefix_lists_the_kernels_it_matches(vgpu, running_server):
    result = vgpu("resize", "1c2e", "--cores", "20")
    assert result.returncode == 2
    assert (
        "'1c2e' matches 2 sliced kernels: 1c2e3f4a (work/train.ipynb), 1c2e9999 (no notebook); give more"
        in result.stderr
    )
    assert "abcdef01" not in result.stderr


def test_resize_on_a_server_without_slices_says_so(vgpu, running_server):
    running_server.slices.clear()
    result = vgpu("resize", "zzz", "--cores", "20")
    assert result.returncode == 2
    assert "this server has no sliced kernels" in result.stderr


@pytest.mark.parametrize("status", [400, 409])
def test_a_refused_resize_prints_the_servers_message_and_exits_1(vgpu, running_server, status):
    running_server.refusal = (status, "device 0 has 3GiB of memory free; the slice asks for 4GiB more")
    result = vgpu("resize", "abc", "--memory", "8GiB")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"jupyter vgpu resize: device 0 has 3GiB of memory free; the slice asks for 4GiB more (HTTP {status})"
    )
