"""CI (.ci/run) runs README.md's install block, then every step of its test block, even after a
step failed, and fails at the end naming each failed step. Run on a copy of .ci/run beside a
README.md of its own, whose steps leave traces in files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

README = """\
# A project

<!-- ci:install -->
```bash
echo installed > install.txt
```

<!-- ci:test -->
```bash
. ./activate.sh                 # sets STEP_PREFIX for every step after it
echo "$STEP_PREFIX first" >> steps.txt
false                           # a failing lint, say
# a comment line is no step

echo "$STEP_PREFIX after the failure" \\
  "and its continued line" >> steps.txt
exit_three() { return 3; }; exit_three
echo "$STEP_PREFIX last" >> steps.txt
```
"""


def run_ci(tmp_path: Path, readme: str) -> subprocess.CompletedProcess:
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "activate.sh").write_text("export STEP_PREFIX=activated\n")
    return subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60, check=False
    )


def test_every_test_step_runs_and_the_failures_are_listed_at_the_end(tmp_path):
    result = run_ci(tmp_path, README)

    assert result.returncode == 1, result.stdout + result.stderr
    assert (tmp_path / "install.txt").read_text() == "installed\n"
    assert (tmp_path / "steps.txt").read_text().splitlines() == [
        "activated first",
        "activated after the failure and its continued line",
        "activated last",
    ]
    summary = result.stderr[result.stderr.index("== 2 of 6 test steps failed:") :].splitlines()
    assert summary[1:] == [
        "   exit 1: false                           # a failing lint, say",
        "   exit 3: exit_three() { return 3; }; exit_three",
    ], result.stderr


def test_a_passing_test_block_passes(tmp_path):
    result = run_ci(tmp_path, README.replace("false  ", "true   ").replace("exit_three\n", "true\n"))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "== all 6 test steps passed" in result.stdout
    assert len((tmp_path / "steps.txt").read_text().splitlines()) == 3
