"""The test suites of the projects jupyter-vgpu plugs into, run as they are against sliced
kernels: a kernelspec made by ``jupyter vgpu kernelspec install --simulate`` answers for
``python3``, so every kernel these suites start by that name runs in a slice on the simulated
GPU. A Jupyter release that changes a contract a sliced kernel relies on fails here first. The
tests that fail are run once more, as the projects' own CI runs them (``pytest || pytest --lf``).

    python tests/peers/run_peer_suites.py                     # every suite (README's test block)
    python tests/peers/run_peer_suites.py --suite nbclient    # one of them
    python tests/peers/run_peer_suites.py --plain             # the same, with ipykernel's own python3
    python tests/peers/run_peer_suites.py -- -k restart -x    # arguments after -- go to pytest

Each suite is the source distribution of the installed version (``pip download``), so its tests
match the code they test, run with its own pytest configuration and fixtures from its own folder,
in a private runtime, data and config folder and a simulated machine of its own. The kernels are
counted (peer_check.py): the run fails unless the suite started sliced kernels and every
``python3`` kernel it started was one, so a kernelspec that Jupyter does not find cannot pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peer_check import RECORD_VARIABLE  # noqa: E402

SLICED_NAME = "python3"


@dataclass(frozen=True)
class Suite:
    """One project's tests: which of them, the plugins they need (pytest's automatic plugin
    loading is off, so that this environment's other plugins do not change their run) and the
    test-only packages they import, which are installed next to them, not into the environment."""

    distribution: str
    paths: tuple[str, ...]
    plugins: tuple[str, ...]
    packages: tuple[str, ...] = ()
    deselect: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


SUITES = {
    "nbclient": Suite(
        "nbclient",
        paths=("tests",),
        plugins=("pytest_asyncio.plugin", "flaky.flaky_pytest_plugin"),
        packages=("flaky", "testpath", "xmltodict"),
        # pytest-asyncio newer than the one nbclient's config was written for warns about the
        # unset option, and nbclient's config makes every warning an error.
        options=("-o", "asyncio_default_fixture_loop_scope=function"),
    ),
    "jupyter_server": Suite(
        "jupyter_server",
        paths=("tests/services/kernels", "tests/services/sessions"),
        plugins=("pytest_timeout", "flaky.flaky_pytest_plugin"),
        packages=("flaky",),
        # Tornado 6.6 deprecates how five of test_connection.py's tests make an HTTPServerRequest,
        # and the suite's config makes every warning an error: they fail so with ipykernel's own
        # kernel too (--plain). The two warnings are ignored, so that the tests run.
        options=(
            "-W",
            "ignore:The method, uri, and version arguments to HTTPServerRequest:DeprecationWarning",
            "-W",
            "ignore:The start_line argument to HTTPServerRequest:DeprecationWarning",
        ),
        # Its second connection's kernel_info request times out after 1 s with ipykernel's own
        # kernel too (--plain, the test run alone): a failure of these versions together, not
        # of slices.
        deselect=("tests/services/kernels/test_connection.py::test_disconnect_resolves_orphaned_kernel_info_future",),
    ),
}


@dataclass
class Verdict:
    """What a suite's kernels were, from peer_check's record."""

    sliced: int = 0
    plain: list[str] = field(default_factory=list)  # python3 kernels that were not sliced
    others: dict[str, int] = field(default_factory=dict)  # kernels of other kernelspecs

    @classmethod
    def read(cls, record: Path) -> Verdict:
        verdict = cls()
        lines = record.read_text().splitlines() if record.exists() else []
        for entry in map(json.loads, lines):
            if entry["kernel_name"] != SLICED_NAME:
                name = entry["kernel_name"] or "(none)"
                verdict.others[name] = verdict.others.get(name, 0) + 1
            elif entry["provisioner"] == "VGPUProvisioner" and entry["loaded_libvgpu"] and entry["region"]:
                verdict.sliced += 1
            else:
                verdict.plain.append(f"{entry['test'] or 'outside a test'} ({entry['provisioner']})")
        return verdict

    def problem(self, *, plain_run: bool) -> str:
        """Why the run does not prove what it is for ('' where it does)."""
        if plain_run:
            return f"{self.sliced} python3 kernels were sliced in a plain run" if self.sliced else ""
        if self.plain:
            return f"{len(self.plain)} python3 kernels were not sliced: " + "; ".join(self.plain[:5])
        if not self.sliced:
            return "no sliced kernel started: the suite did not use the sliced python3 kernelspec"
        return ""

    def summary(self) -> str:
        others = ", ".join(f"{count} {name}" for name, count in sorted(self.others.items()))
        return f"{self.sliced} sliced python3 kernels, {len(self.plain)} plain" + (
            f"; other kernelspecs: {others}" if others else ""
        )


def run(command: list[str], **kwargs: Any) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def fetch(suite: Suite, work: Path) -> Path:
    """The suite's project at the installed version, unpacked from its source distribution."""
    wanted = version(suite.distribution)
    downloads = work / "downloads"
    found = [each for each in downloads.glob("*.tar.gz") if _is_sdist_of(each, suite.distribution, wanted)]
    if not found:
        run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            + ["--dest", str(downloads), f"{suite.distribution}=={wanted}"]
        )
        found = [each for each in downloads.glob("*.tar.gz") if _is_sdist_of(each, suite.distribution, wanted)]
    if not found:
        raise SystemExit(f"pip downloaded no source distribution of {suite.distribution} {wanted} into {downloads}")
    source = work / "src"
    with tarfile.open(found[0]) as archive:
        top = archive.getnames()[0].split("/")[0]
        if not (source / top).exists():
            # The "data" filter (no links out, no devices) where this Python has it (3.10.12+).
            archive.extractall(source, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return source / top


def _is_sdist_of(path: Path, distribution: str, wanted: str) -> bool:
    # Source distributions are named with the project's name normalised either way.
    stem = path.name.removesuffix(".tar.gz").lower().replace("-", "_")
    return stem == f"{distribution.lower().replace('-', '_')}_{wanted}"


def install_packages(suites: list[Suite], work: Path) -> Path:
    packages = sorted({name for suite in suites for name in suite.packages})
    target = work / ("packages-" + "+".join(packages))  # a kept --work folder may hold another set
    if packages and not target.exists():
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *packages])
    return target


def install_sliced_kernelspec(prefix: Path, env: dict[str, str]) -> None:
    """``jupyter vgpu kernelspec install`` as a user would run it, named python3 and put in a
    prefix of its own, which JUPYTER_PATH puts before every other place (ipykernel's own python3
    included)."""
    run(
        [sys.executable, "-c", "from jupyter_vgpu.cli import main; main()", "kernelspec", "install"]
        + ["--simulate", "--name", SLICED_NAME, "--prefix", str(prefix)],
        env=env,
    )


def suite_environment(folder: Path, packages: Path | None, jupyter_path: Path | None) -> dict[str, str]:
    """The environment of a suite's run: its own Jupyter folders and simulated machine, so that
    neither the user's config nor a vGPU server's ledger in the user's runtime folder reaches it."""
    env = dict(os.environ)
    for name in list(env):  # a run from inside a test or a sliced kernel passes none of theirs on
        if name.startswith(("JUPYTER_VGPU_", "VGPU_", "PYTEST_")) or name in ("LD_PRELOAD", "JUPYTER_PATH"):
            del env[name]
    for name, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("IPYTHONDIR", "ipython"),
    ):
        env[name] = str(folder / sub)
    env["VGPU_SIM_STATE"] = str(folder / "simulated-gpu.state")
    env[RECORD_VARIABLE] = str(folder / "kernels.jsonl")
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    paths = [str(packages) if packages else "", str(HERE), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    if jupyter_path is not None:
        env["JUPYTER_PATH"] = str(jupyter_path)
    return env


def run_suite(
    name: str, suite: Suite, project: Path, folder: Path, packages: Path | None, *, plain: bool, pytest_args: list[str]
) -> str:
    """Runs one suite's tests in ``project`` (its unpacked source), with ``folder`` for its
    Jupyter folders and kernel record; returns '' where it passed with sliced kernels, else what
    went wrong."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    prefix = folder / "prefix"
    env = suite_environment(folder, packages, None if plain else prefix / "share" / "jupyter")
    if not plain:
        install_sliced_kernelspec(prefix, env)
    # A pytest's own temporary folder too: pytest keeps a user's three newest and deletes the
    # rest, another run's included, which a long suite beside other test runs would lose. Its
    # cache (what --lf reads) lives in the run's folder, not in the project's source.
    command = [sys.executable, "-m", "pytest", "-p", "peer_check", "--color=no"]
    command += [f"--basetemp={folder / 'tmp'}", "-o", f"cache_dir={folder / 'cache'}"]
    command += [arg for plugin in suite.plugins for arg in ("-p", plugin)]
    command += [*suite.options, *(f"--deselect={each}" for each in suite.deselect), *suite.paths, *pytest_args]
    print(f"== {name} in {project}, {'plain' if plain else 'sliced'} kernels", flush=True)
    started = time.monotonic()
    status = subprocess.run(command, check=False, cwd=project, env=env).returncode
    print(f"== {name}: pytest exit {status} after {time.monotonic() - started:.0f} s", flush=True)
    if status == pytest.ExitCode.TESTS_FAILED:
        status = rerun_failed(name, command, project, env, folder)
    verdict = Verdict.read(folder / "kernels.jsonl")
    print(f"== {name}: {verdict.summary()}", flush=True)
    problem = verdict.problem(plain_run=plain)
    if status != 0:
        problem = f"pytest exit {status}" + (f"; {problem}" if problem else "")
    return problem


def rerun_failed(name: str, command: list[str], project: Path, env: dict[str, str], folder: Path) -> int:
    """The tests that failed, run once more, as the projects' own CI does (``pytest ... || pytest
    --lf``): their suites hold races of their own. jupyter_server's ``test_restart_kernel`` failed
    three CI runs here: its websocket's open raised "fd 45 added twice" in ZMQStream (a socket's
    fd reused while the event loop still had it registered, pyzmq and jupyter_server's race, seen
    upstream too: enterprise_gateway#1051, jupyter_client#988), so the connection count never went
    back to 0. Which tests needed the second run is printed, and a test that fails twice fails."""
    record = folder / "cache" / "v" / "cache" / "lastfailed"
    failed = json.loads(record.read_text()) if record.exists() else {}
    if not failed:  # pytest named no test that failed: nothing to run again
        return pytest.ExitCode.TESTS_FAILED
    print(f"== {name}: {len(failed)} failed; run once more (--lf): " + ", ".join(sorted(failed)), flush=True)
    started = time.monotonic()
    status = subprocess.run([*command, "--lf"], check=False, cwd=project, env=env).returncode
    print(f"== {name}: the second run's pytest exit {status} after {time.monotonic() - started:.0f} s", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), help="a suite to run (default: all)")
    parser.add_argument("--plain", action="store_true", help="ipykernel's own python3 kernelspec, no slices")
    parser.add_argument("--work", type=Path, help="keep downloads and runs here (default: a temporary folder)")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for each suite's pytest")
    options = parser.parse_args(argv)
    names = options.suite or sorted(SUITES)
    work = options.work.resolve() if options.work else Path(tempfile.mkdtemp(prefix="jupyter-vgpu-peers-"))
    try:
        packages = install_packages([SUITES[name] for name in names], work)
        problems = {}
        for name in names:
            suite = SUITES[name]
            project = fetch(suite, work)
            print(f"== {name} {version(suite.distribution)}: its source distribution's tests", flush=True)
            problems[name] = run_suite(
                name,
                suite,
                project,
                work / "runs" / name,
                packages,
                plain=options.plain,
                pytest_args=options.pytest_args,
            )
    finally:
        if not options.work:
            shutil.rmtree(work, ignore_errors=True)
    failed = {name: problem for name, problem in problems.items() if problem}
    for name, problem in failed.items():
        print(f"== {name} failed: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
