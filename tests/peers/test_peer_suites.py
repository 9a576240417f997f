"""run_peer_suites.py's proof that a peer suite's kernels were sliced: a suite of one test that
starts a ``python3`` kernel, as nbclient's and jupyter_server's tests do, run the way the runner
runs the real ones (a pytest of its own, peer_check, the sliced kernelspec on JUPYTER_PATH)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from run_peer_suites import SLICED_NAME, Suite, Verdict, run_suite

# What the kernel itself says of its environment and process: proof from the inside that the
# recorded start was the kernel that ran the cell.
STARTS_PYTHON3 = """
import json
import os
from pathlib import Path

from jupyter_client.manager import start_new_kernel


def test_a_python3_kernel_runs_a_cell():
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        code = "import os, pathlib; print(os.environ.get('LD_PRELOAD', ''), '/libvgpu.so' in pathlib.Path('/proc/self/maps').read_text())"
        said = []
        client.execute_interactive(code, output_hook=lambda m: said.append(m["content"].get("text", "")), timeout=60)
        Path(os.environ["SAID"]).write_text("".join(said))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_starts_python3.py").write_text(textwrap.dedent(STARTS_PYTHON3))
    return folder


SUITE = Suite("jupyter_client", paths=("test_starts_python3.py",), plugins=())


def test_a_suite_whose_python3_kernel_runs_in_a_slice_passes_and_the_kernel_is_counted_as_sliced(
    project, tmp_path, native_libs, monkeypatch
):
    monkeypatch.setenv("SAID", str(tmp_path / "said.txt"))
    folder = tmp_path / "run"
    problem = run_suite("one", SUITE, project, folder, None, plain=False, pytest_args=["-q"])
    assert problem == ""
    verdict = Verdict.read(folder / "kernels.jsonl")
    assert (verdict.sliced, verdict.plain, verdict.others) == (1, [], {})
    preload, mapped = (tmp_path / "said.txt").read_text().split()
    assert Path(preload).name == "libvgpu.so" and mapped == "True"
    spec = json.loads((folder / "prefix/share/jupyter/kernels" / SLICED_NAME / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "vgpu-provisioner"


def test_a_suite_whose_python3_kernel_is_ipykernels_own_fails_though_its_tests_pass(
    project, tmp_path, native_libs, monkeypatch
):
    """The mistake the record is there for: a kernelspec Jupyter does not find (here none at all)
    leaves ipykernel's own python3 answering, and every test still passes."""
    monkeypatch.setenv("SAID", str(tmp_path / "said.txt"))
    folder = tmp_path / "run"
    suite_passed = run_suite("one", SUITE, project, folder, None, plain=True, pytest_args=["-q"]) == ""
    verdict = Verdict.read(folder / "kernels.jsonl")
    assert suite_passed and (tmp_path / "said.txt").read_text().split() == ["False"]
    assert (verdict.sliced, len(verdict.plain)) == (0, 1)
    assert verdict.problem(plain_run=False).startswith("1 python3 kernels were not sliced: test_starts_python3.py::")


# A suite with a test that fails on its first run only (it leaves a mark), one that always
# passes and, where FAIL_ALWAYS is set, one that always fails; each test counts its runs.
RACY_SUITE = """
import os
from pathlib import Path


def count(name):
    runs = Path(os.environ["RUNS"]) / name
    runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
    return len(runs.read_text())


def test_passes():
    count("passes")


def test_fails_the_first_time():
    assert count("racy") > 1


def test_fails_always():
    count("always")
    assert not os.environ.get("FAIL_ALWAYS")
"""


@pytest.fixture
def racy_project(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "racy"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_racy.py").write_text(textwrap.dedent(RACY_SUITE))
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("RUNS", str(runs))
    return folder


def runs_of(tmp_path: Path) -> dict[str, int]:
    return {each.name: len(each.read_text()) for each in (tmp_path / "runs").iterdir()}


def test_a_test_that_fails_once_is_run_once_more_alone_and_the_suite_passes(racy_project, tmp_path, capfd):
    suite = Suite("racy", paths=("test_racy.py",), plugins=())
    problem = run_suite("racy", suite, racy_project, tmp_path / "run", None, plain=True, pytest_args=["-q"])
    assert problem == ""
    assert runs_of(tmp_path) == {"passes": 1, "racy": 2, "always": 1}
    assert "1 failed; run once more (--lf): test_racy.py::test_fails_the_first_time" in capfd.readouterr().out


def test_a_test_that_fails_twice_fails_the_suite(racy_project, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIL_ALWAYS", "1")
    suite = Suite("racy", paths=("test_racy.py",), plugins=())
    problem = run_suite("racy", suite, racy_project, tmp_path / "run", None, plain=True, pytest_args=["-q"])
    assert problem == "pytest exit 1"
    assert runs_of(tmp_path) == {"passes": 1, "racy": 2, "always": 2}
