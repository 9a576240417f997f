"""Every npm package the repository locks runs on the Node it is installed with (CONTRIBUTING.md:
Node 20): `npm ci` warns (EBADENGINE) for a package whose `engines.node` leaves that Node out, and
such a package may use what that Node lacks (issue 34 item 6: commander 15, pulled in by
configurable-http-proxy 5.3.0, needs Node 22.12). Checked against the lock files, so without
the registry: each locked package's `engines.node` range, npm's range syntax."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
LOCK_FILES = ("tests/hub/package-lock.json", "tests/browser/package-lock.json", "labextension/package-lock.json")

Version = tuple[int, int, int]


def _version(text: str) -> tuple[list[int | None], int]:
    """``20``, ``20.9``, ``0.8.x``, ``*`` -> ([20, None, None], parts given)."""
    parts: list[int | None] = [None if part in ("x", "X", "*") else int(part) for part in text.split(".")]
    given = sum(part is not None for part in parts)
    return [*parts, None, None, None][:3], given


def _lowest(parts: list[int | None]) -> Version:
    return (parts[0] or 0, parts[1] or 0, parts[2] or 0)


def _after(parts: list[int | None], given: int) -> Version:
    """The first version past what ``parts`` names (``20`` -> 21.0.0, ``20.9`` -> 20.10.0)."""
    major, minor, patch = _lowest(parts)
    if given <= 1:
        return (major + 1, 0, 0)
    if given == 2:
        return (major, minor + 1, 0)
    return (major, minor, patch + 1)


def _comparator(token: str, version: Version) -> bool:
    operator, text = re.fullmatch(r"(>=|<=|>|<|=|\^|~)?\s*v?(.+)", token).groups()  # type: ignore[union-attr]
    if text in ("*", "x", "X"):
        return True
    parts, given = _version(text)
    low = _lowest(parts)
    if operator == ">=":
        return version >= low
    if operator == ">":
        return version >= _after(parts, given)
    if operator == "<":
        return version < low
    if operator == "<=":
        return version < _after(parts, given)
    if operator == "^":
        first = next((index for index, part in enumerate(low) if part), 2)
        top = list(low[: first + 1])
        top[first] += 1
        return low <= version < (*top, *[0] * (2 - first))  # type: ignore[operator]
    if operator == "~":
        return low <= version < _after(parts, min(given, 2))
    return low <= version < _after(parts, given)  # "20" or "=20.1": that version (or line)


def satisfies(version: Version, spec: str) -> bool:
    """Whether ``version`` is in npm range ``spec`` (``||`` of space-separated comparators)."""
    for alternative in spec.split("||"):
        tokens = re.findall(r"(?:>=|<=|>|<|=|\^|~)?\s*v?[\dxX*][\w.*]*", alternative)
        if all(_comparator(token, version) for token in tokens):
            return True
    return False


def test_the_range_reader_reads_npm_ranges():
    assert satisfies((20, 20, 2), ">= 20") and satisfies((20, 20, 2), "^20.19.0 || >=22.12.0")
    assert not satisfies((20, 20, 2), ">=22.12.0") and not satisfies((20, 18, 0), "^20.19.0 || >=22.12.0")
    assert satisfies((20, 20, 2), "18 || 20 || >=22") and not satisfies((21, 0, 0), "18 || 20 || >=22")
    assert satisfies((20, 0, 0), "*") and satisfies((20, 0, 0), ">=0.8.x") and satisfies((20, 1, 0), "~20.1.0")
    assert not satisfies((14, 16, 0), ">=16 || 14 >=14.17") and satisfies((14, 17, 0), ">=16 || 14 >=14.17")
    assert not satisfies((0, 3, 0), "^0.2.1") and satisfies((0, 2, 5), "^0.2.1")


def installed_node() -> Version:
    if shutil.which("node") is None:
        pytest.fail("node is not installed (CONTRIBUTING.md: Node 20 and npm)")
    printed = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    major, minor, patch = (int(part) for part in printed.strip().lstrip("v").split("."))
    return (major, minor, patch)


@pytest.mark.parametrize("lock_file", LOCK_FILES)
def test_every_locked_package_runs_on_the_installed_node(lock_file):
    node = installed_node()
    packages = json.loads((REPOSITORY / lock_file).read_text())["packages"]
    refused = {
        path.removeprefix("node_modules/"): package["engines"]["node"]
        for path, package in packages.items()
        if isinstance(package.get("engines"), dict)
        and "node" in package["engines"]
        and not satisfies(node, package["engines"]["node"])
    }
    assert refused == {}, f"these need another Node than {'.'.join(map(str, node))}"
