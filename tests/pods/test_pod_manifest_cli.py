"""``jupyter vgpu pod-manifest``: what a start would create with the configuration a server would
use (its config files, then the kernelspec, then the command's own options), valid for
Kubernetes, with the key and credential redacted; wrong input stops it with what is accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

JUPYTER = str(Path(sys.executable).with_name("jupyter"))


@pytest.fixture
def jupyter_env(tmp_path, monkeypatch):
    """A private Jupyter environment: server config naming a namespace and a scheduler, and a
    pod kernelspec that sets the image and a size."""
    config, data = tmp_path / "config", tmp_path / "data"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "VGPUApp": {"default_memory": "2GiB", "default_cores": 40},
                "VGPUPodProvisioner": {
                    "namespace": "gpu-kernels",
                    "scheduler_name": "hami-scheduler",
                    "owner": "ada",
                    "image": "registry.example.org/kernels/base:1",
                },
            }
        )
    )
    for name, provisioner in (("gpu-pod", "vgpu-pod-provisioner"), ("gpu-local", "vgpu-provisioner")):
        folder = data / "kernels" / name
        folder.mkdir(parents=True)
        (folder / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": name,
                    "language": "python",
                    "metadata": {
                        "kernel_provisioner": {
                            "provisioner_name": provisioner,
                            "config": {"memory": "6GiB", "image": "registry.example.org/torch:2.5"},
                        }
                    },
                }
            )
        )
    env = {
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_PATH": str(data),
        "JUPYTER_CONFIG_PATH": str(config),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def pod_manifest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [JUPYTER, "vgpu", "pod-manifest", *args], check=False, capture_output=True, text=True, timeout=120
    )


def test_pod_manifest_prints_what_a_start_would_create_valid_and_redacted(jupyter_env):
    result = pod_manifest("--kernel", "gpu-pod", "--cores", "25")
    assert result.returncode == 0, result.stderr
    pod, secret = yaml.safe_load_all(result.stdout)
    for manifest in (pod, secret):
        kubernetes_validate.validate(manifest, "1.31", strict=True)
    # The server's config, the kernelspec's, then the command's own option.
    assert pod["metadata"]["namespace"] == secret["metadata"]["namespace"] == "gpu-kernels"
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "registry.example.org/torch:2.5"
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "6144",
        "nvidia.com/gpucores": "25",
    }
    assert json.loads(secret["stringData"]["connection.json"])["key"] == "<redacted>"
    assert json.loads(secret["stringData"]["slice.json"])["credential"] == "<redacted>"
    assert "no cluster was contacted" in result.stdout.splitlines()[0]


def test_without_a_kernelspec_the_servers_defaults_size_the_pod(jupyter_env):
    result = pod_manifest()
    assert result.returncode == 0, result.stderr
    pod, _ = yaml.safe_load_all(result.stdout)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "2048"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kernel", "nope"], "no kernelspec named 'nope'"),
        (
            ["--kernel", "gpu-local"],
            "kernelspec 'gpu-local' does not start pod kernels (its provisioner is vgpu-provisioner)",
        ),
        (["--memory", "lots"], "memory size 'lots' is not a size like"),
        (["--cores", "250"], "SM share"),
        (["--policy", "soft"], "policy"),
        (
            ["--VGPUPodProvisioner.image_pull_policy=Sometimes"],
            "image_pull_policy 'Sometimes' is not one of Always, IfNotPresent, Never",
        ),
    ],
)
def test_bad_input_stops_with_what_is_accepted(jupyter_env, args, message):
    result = pod_manifest(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_pod_manifest_refuses_a_slice_above_the_servers_largest_as_the_server_would(jupyter_env):
    config = Path(jupyter_env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    settings = json.loads(config.read_text())
    settings["VGPUApp"].update(max_memory="4GiB", max_cores=50)
    config.write_text(json.dumps(settings))
    for args, said in (
        (["--kernel", "gpu-pod"], "a slice may have at most 4GiB of GPU memory on this server, not 6GiB"),
        (["--kernel", "gpu-pod", "--memory", "4GiB", "--cores", "60"], "at most 50% of a GPU's SMs on this server"),
    ):
        result = pod_manifest(*args)
        assert result.returncode != 0 and result.stdout == "", result.stdout
        assert said in result.stderr, result.stderr
    assert pod_manifest("--kernel", "gpu-pod", "--memory", "4GiB").returncode == 0


def test_a_pod_kernel_without_an_image_is_refused_saying_which_image_it_needs(jupyter_env):
    # No public image has jupyter-vgpu in it (the old default had not, and its pod could not
    # start): the image must be named.
    spec = Path(jupyter_env["JUPYTER_DATA_DIR"]) / "kernels" / "gpu-pod" / "kernel.json"
    kernelspec = json.loads(spec.read_text())
    del kernelspec["metadata"]["kernel_provisioner"]["config"]["image"]
    spec.write_text(json.dumps(kernelspec))
    result = pod_manifest("--kernel", "gpu-pod", "--VGPUPodProvisioner.image=")  # and the server's unset
    assert result.returncode != 0 and result.stdout == "", result.stdout
    assert (
        "image is not set; name the kernel image (VGPUPodProvisioner.image), one with ipykernel and jupyter-vgpu "
        "(no public image has jupyter-vgpu: build the kernel image of docs/kubernetes.md"
    ) in result.stderr, result.stderr


def test_help_says_how_to_set_the_image_on_the_command_line_and_that_way_works(jupyter_env):
    """The image is what a newcomer must set first (issue 27 #13): --help names --image and the
    full --VGPUPodProvisioner.NAME=VALUE form, and both do what it says."""
    shown = pod_manifest("--help")
    assert shown.returncode == 0, shown.stderr
    assert "--image=<Unicode>" in shown.stdout and "--VGPUPodProvisioner.NAME=VALUE" in shown.stdout
    assert "jupyter vgpu pod-manifest --image registry.example.org/kernels/torch:2.5" in shown.stdout
    given = pod_manifest("--kernel", "gpu-pod", "--image", "registry.example.org/mine:1")  # over the kernelspec's
    assert given.returncode == 0, given.stderr
    assert next(yaml.safe_load_all(given.stdout))["spec"]["containers"][0]["image"] == "registry.example.org/mine:1"
    spec = Path(jupyter_env["JUPYTER_DATA_DIR"]) / "kernels" / "gpu-pod" / "kernel.json"
    kernelspec = json.loads(spec.read_text())
    del kernelspec["metadata"]["kernel_provisioner"]["config"]["image"]
    spec.write_text(json.dumps(kernelspec))
    full = pod_manifest("--kernel", "gpu-pod", "--VGPUPodProvisioner.image=registry.example.org/full:2")
    assert full.returncode == 0, full.stderr
    assert next(yaml.safe_load_all(full.stdout))["spec"]["containers"][0]["image"] == "registry.example.org/full:2"
