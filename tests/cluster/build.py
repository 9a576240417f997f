#!/usr/bin/env python3
"""Build the tests' Kubernetes control plane from the Kubernetes project's own Go modules.

The binaries are test infrastructure, like the browser and JupyterHub the tests use: nothing of
jupyter-vgpu is Go. ``tests/cluster/go`` is a Go module of tools only: its go.mod requires
``k8s.io/kubernetes`` (and replaces each staging module with its published ``v0.36.3``, the
documented way to depend on it), etcd's server and KWOK, and lists their commands as ``tool``s.
This script builds each command once into a cache folder named for go.mod and go.sum, skips what
is already there, and writes KWOK's own published stages (from its module, as it ships them)
beside them::

    python tests/cluster/build.py            # prints the folder; builds what is missing
    python tests/cluster/build.py --check    # says what is missing, builds nothing (exit 1 if any)

``JUPYTER_VGPU_CLUSTER_CACHE`` names the cache (default ``~/.cache/jupyter-vgpu/cluster``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODULE = Path(__file__).resolve().parent / "go"
# command name -> Go package (the `tool` lines of go.mod)
COMMANDS = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
}
# KWOK's own stages, as its module ships them: nodes become Ready and keep a Lease; pods on its
# nodes run, and go when deleted.
KWOK_STAGES = ("node/fast", "node/heartbeat-with-lease", "pod/fast")


def cache_folder() -> Path:
    root = Path(os.environ.get("JUPYTER_VGPU_CLUSTER_CACHE") or Path.home() / ".cache" / "jupyter-vgpu" / "cluster")
    digest = hashlib.sha256((MODULE / "go.mod").read_bytes() + (MODULE / "go.sum").read_bytes()).hexdigest()[:16]
    return root / digest


def missing(folder: Path) -> list[str]:
    wanted = [*COMMANDS, "kwok-stages.yaml"]
    return [name for name in wanted if not (folder / name).is_file()]


def go(*args: str, **kwargs) -> subprocess.CompletedProcess:
    if shutil.which("go") is None:
        sys.exit(
            "tests/cluster/build.py: no `go` command; the control plane is built with Go 1.26 (README's install block)"
        )
    return subprocess.run(["go", *args], cwd=MODULE, check=True, **kwargs)


def binary_name(package: str) -> str:
    """The file `go build -o DIR/` writes for a main package: its last path element, or the one
    before a major-version suffix (go.etcd.io/etcd/server/v3 -> server)."""
    parts = package.split("/")
    return parts[-2] if re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def write_stages(folder: Path) -> None:
    kwok_dir = go("list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok", capture_output=True, text=True).stdout.strip()
    documents = []
    for stage in KWOK_STAGES:
        for path in sorted((Path(kwok_dir) / "kustomize" / "stage" / stage).glob("*.yaml")):
            if path.name != "kustomization.yaml":
                documents.append(path.read_text().strip())
    (folder / "kwok-stages.yaml.tmp").write_text("\n---\n".join(documents) + "\n")
    (folder / "kwok-stages.yaml.tmp").replace(folder / "kwok-stages.yaml")


def build(folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    todo = [name for name in missing(folder) if name in COMMANDS]
    started = time.monotonic()
    if todo:
        print(f"building {', '.join(todo)} into {folder} (a few minutes on a cold cache)", file=sys.stderr, flush=True)
        staging = folder / "building"
        staging.mkdir(exist_ok=True)
        # One `go build` for all: the packages they share compile once. -trimpath: the binaries do
        # not name this machine's paths; -s -w: no symbol tables (a third of the size, nothing lost to tests).
        go("build", "-trimpath", "-ldflags=-s -w", "-o", str(staging) + "/", *(COMMANDS[name] for name in todo))
        for name in todo:
            (staging / binary_name(COMMANDS[name])).replace(folder / name)
        shutil.rmtree(staging, ignore_errors=True)
    if not (folder / "kwok-stages.yaml").is_file():
        write_stages(folder)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "folder": str(folder),
        "built": todo,
        "seconds": round(time.monotonic() - started, 1),
        "peak_rss_mib": children.ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="say what is missing and build nothing")
    parser.add_argument("--json", action="store_true", help="print what was done as JSON")
    args = parser.parse_args()
    folder = cache_folder()
    if args.check:
        gone = missing(folder)
        print(f"{folder}: " + (f"missing {', '.join(gone)}" if gone else "complete"))
        sys.exit(1 if gone else 0)
    done = build(folder)
    print(json.dumps(done) if args.json else done["folder"])


if __name__ == "__main__":
    main()
