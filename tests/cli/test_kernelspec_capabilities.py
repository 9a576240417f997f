"""The sliced kernelspecs (the one shipped in kernels/ and those `jupyter vgpu kernelspec install`
writes) declare what ipykernel's own kernelspec declares of the kernel (the debugger, CurveZMQ
transport encryption, the protocol version), so that a server or client with
transport_encryption="required" starts sliced kernels, and with "auto" encrypts them, as it does
plain ones (issue 27 #16)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ipykernel.kernelspec import get_kernel_dict

SHIPPED = Path(__file__).resolve().parents[2] / "kernels" / "python3-vgpu"
CAPABILITIES = ("debugger", "supported_encryption")

# Starts kernelspec argv[1] with jupyter_client's KernelManager under transport_encryption
# argv[2] (no server: a batch run's kernel, on the simulated GPU), runs a cell and prints what it
# printed and whether the connection was encrypted.
START = """
import json, sys
from jupyter_client.manager import KernelManager
from traitlets.config import Config

config = Config({"VGPUProvisioner": {"simulate": True}})
manager = KernelManager(kernel_name=sys.argv[1], transport_encryption=sys.argv[2], config=config)
manager.start_kernel()
try:
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    printed = []
    reply = client.execute_interactive(
        "import os; print(os.environ.get('VGPU_REGION', 'unsliced'))",
        timeout=120,
        output_hook=lambda message: printed.append(message["content"].get("text", "")),
    )
    with open(manager.connection_file) as file:
        written = json.load(file)
    print(json.dumps({
        "status": reply["content"]["status"],
        "printed": "".join(printed).strip(),
        # The kernel was given keys, and the client's sockets are CurveZMQ clients of that key:
        # a kernel that did not speak CurveZMQ would never have answered.
        "curve": "curve_publickey" in written and client.curve_publickey == written["curve_publickey"].encode(),
    }))
finally:
    manager.shutdown_kernel(now=True)
"""


def declared(spec: dict) -> dict:
    return {
        **{key: spec["metadata"].get(key) for key in CAPABILITIES},
        "kernel_protocol_version": spec.get("kernel_protocol_version"),
    }


def ipykernel_declares() -> dict:
    return declared(get_kernel_dict())


def test_ipykernel_declares_curve_and_the_debugger():
    """What the others are compared with: ipykernel's own kernelspec, as `python -m ipykernel
    install` writes it (a version without either would make the comparisons below empty)."""
    assert ipykernel_declares()["supported_encryption"] == ["curve"]
    assert ipykernel_declares()["debugger"] is True


def test_the_shipped_kernelspec_declares_what_ipykernel_declares():
    assert declared(json.loads((SHIPPED / "kernel.json").read_text())) == ipykernel_declares()


def test_an_installed_kernelspec_declares_what_ipykernel_declares(vgpu, cli_env):
    result = vgpu("kernelspec", "install", "--memory", "1GiB", "--name", "sliced", "--user")
    assert result.returncode == 0, result.stderr
    spec = json.loads((Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "sliced" / "kernel.json").read_text())
    assert declared(spec) == ipykernel_declares()
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "vgpu-provisioner"


@pytest.mark.parametrize("kernelspec", ["shipped", "installed"])
def test_a_sliced_kernel_starts_encrypted_where_encryption_is_required(vgpu, cli_env, kernelspec):
    folder = Path(cli_env["JUPYTER_DATA_DIR"]) / "kernels" / "sliced"
    if kernelspec == "shipped":
        shutil.copytree(SHIPPED, folder)
        spec = json.loads((folder / "kernel.json").read_text())
        spec["argv"][0] = sys.executable  # "python" on PATH, as installed; this test's interpreter here
        (folder / "kernel.json").write_text(json.dumps(spec))
    else:
        result = vgpu("kernelspec", "install", "--memory", "1GiB", "--name", "sliced", "--user")
        assert result.returncode == 0, result.stderr
    result = subprocess.run(
        [sys.executable, "-c", START, "sliced", "required"],
        check=False,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["status"] == "ok" and seen["curve"], seen
    assert seen["printed"] != "unsliced", seen  # the kernel ran in a slice (its region's path)
