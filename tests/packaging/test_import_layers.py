"""Imports go one way (CONTRIBUTING.md, docs/architecture.md): every import of jupyter_vgpu's own
modules, at the top of a file or inside a function, is of the importer's layer or one below it.
Read from the sources (ast), so a module imported only lazily counts too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jupyter_vgpu"

# Top to bottom, as CONTRIBUTING.md's "Imports go one way" lists them.
LAYERS = (
    ("jupyter_vgpu", "jupyter_vgpu.__main__"),
    (
        "jupyter_vgpu.server",
        "jupyter_vgpu.notebook",
        "jupyter_vgpu.hub",
        "jupyter_vgpu.cli",
        "jupyter_vgpu.pod_agent",
    ),
    ("jupyter_vgpu.provisioning",),
    ("jupyter_vgpu.client",),
    ("jupyter_vgpu.manager",),
    ("jupyter_vgpu.holders",),
    ("jupyter_vgpu.pods",),
    ("jupyter_vgpu.ledger", "jupyter_vgpu.line"),
    ("jupyter_vgpu.model",),
    ("jupyter_vgpu.native", "jupyter_vgpu._version"),
)


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest listed name that `module` is or lies inside."""
    matches = [
        (len(name), index)
        for index, names in enumerate(LAYERS)
        for name in names
        if module == name or module.startswith(f"{name}.")
    ]
    assert matches, f"{module} is in no layer: add it to LAYERS and to CONTRIBUTING.md's list"
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import of a jupyter_vgpu module in the file at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] == "jupyter_vgpu"]
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        for line, imported in own_imports(path):
            if layer_of(imported) < layer_of(importer):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_modules_import_before_their_code():
    """No import at the end of a module to get round a cycle (holders/__init__.py imported its
    own children after defining what they import from it): a cycle is broken by moving what both
    sides need into a module of its own (holders/base.py)."""
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        body = ast.parse(path.read_text(), str(path)).body
        code_seen = False
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if code_seen:
                    late.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
            elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # the docstring
                code_seen = True
    assert not late, "imports after the module's code:\n" + "\n".join(late)
