"""A machine of its own for a test session or a benchmark run (issue 27), shared by tests/conftest.py
and the benchmarks. It imports nothing but the standard library: benchmarks/framework_checks.py
runs on GPU machines that have no pytest.

jupyter-vgpu finds what a user's processes share through a few places: Jupyter's runtime folder
(a running server's files, which `jupyter vgpu run` and the provisioner look for to join its
ledger, the default ledger and regions, kernels' connection files), Jupyter's config and data
folders (the user's own options and kernelspecs) and the runtime folder the simulated GPU keeps
its state file in by default (``$XDG_RUNTIME_DIR``, else ``/dev/shm``). A user's own JupyterLab
with jupyter-vgpu on the same machine uses the same places on purpose: that is how their
`jupyter vgpu run` joins their server's ledger. Tests and benchmarks must not join it, nor share
its simulated GPU, so their processes get every one of these places under a folder of their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Where each of them leads: jupyter_core.paths (the three JUPYTER_ ones),
# jupyter_vgpu.model.devices.simulated_state_path and native/sim/common/shared.c (XDG_RUNTIME_DIR),
# IPython's profiles (their startup files run in every kernel).
PLACES = {
    "JUPYTER_RUNTIME_DIR": "jupyter-runtime",
    "JUPYTER_CONFIG_DIR": "jupyter-config",
    "JUPYTER_DATA_DIR": "jupyter-data",
    "XDG_RUNTIME_DIR": "runtime",
    "IPYTHONDIR": "ipython",
}


def private_machine_environment(folder: Path) -> dict[str, str]:
    """The variables that put a process's Jupyter folders and its simulated GPU's default state
    file under ``folder`` (made, with each place in it)."""
    environment = {}
    for name, place in PLACES.items():
        path = folder / place
        # 0700: XDG's rule for a runtime folder, and what jupyter_core wants of its runtime folder.
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        environment[name] = str(path)
    return environment


@contextlib.contextmanager
def environment_changed(changes: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``changes`` for the length of the block; each variable is
    then as it was before, unset again if it was unset."""
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def private_machine(prefix: str) -> Iterator[Path]:
    """For the length of the block, this process and every process it starts use a fresh folder
    (yielded) for the places above, and the processes it starts for their temporary files too
    (TMPDIR); the folder is removed at the end and the variables are restored."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with environment_changed({**private_machine_environment(folder), "TMPDIR": str(folder)}):
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
