"""What the documentation pages say about the product agrees with the code (issue 34 item 6):
where the lab extension puts its commands, what happens to a start that does not fit, which CUDA
calls wait inside libvgpu.so. Read from the sources (no site build)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LAB = ROOT / "labextension"
MAIN_MENUS = ("File", "Edit", "View", "Run", "Kernel", "Tabs", "Settings", "Help")


def paragraphs() -> list[tuple[str, str]]:
    """(page, paragraph) of every documentation page, whitespace made single spaces."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        if "_build" in path.parts:
            continue
        for paragraph in re.split(r"\n\s*\n", path.read_text()):
            found.append((path.relative_to(DOCS).as_posix(), " ".join(paragraph.split())))
    return found


def command_labels() -> list[str]:
    """The labels of the commands the lab extension adds (labextension/src/index.ts)."""
    return re.findall(r"label: trans\.__\('([^']+)'\)", (LAB / "src" / "index.ts").read_text())


def menus_the_extension_adds() -> set[str]:
    """The JupyterLab main menus the extension adds items to: through its settings schema
    (`jupyter.lab.menus`) or IMainMenu in its code."""
    menus = set()
    for schema in (LAB / "schema").glob("*.json"):
        for menu in json.loads(schema.read_text()).get("jupyter.lab.menus", {}).get("main", []):
            menus.add(menu["id"].removeprefix("jp-mainmenu-").capitalize())
    for source in (LAB / "src").glob("*.ts"):
        menus.update(re.findall(r"mainMenu\.(\w+)Menu", source.read_text()))
    return {menu.capitalize() for menu in menus}


def test_the_docs_name_only_menus_the_lab_extension_puts_its_commands_in():
    labels = command_labels()
    assert "New notebook on a GPU slice..." in labels
    added = menus_the_extension_adds()
    wrong = [
        (page, label, menu)
        for page, paragraph in paragraphs()
        for label in labels
        if label in paragraph
        for menu in re.findall(rf"\b({'|'.join(MAIN_MENUS)}) menu\b", paragraph)
        if menu not in added
    ]
    assert wrong == []


def test_the_docs_never_say_a_start_that_does_not_fit_fails():
    """It waits in line (docs/line.md); only one that can never fit is refused."""
    said = [
        (page, paragraph)
        for page, paragraph in paragraphs()
        if re.search(r"does not fit[^.;]*\bfails? to start", paragraph)
    ]
    assert said == []


def every_driver_call_waits_in_libvgpu_so() -> bool:
    """Whether libvgpu.so holds back the calls it does not otherwise change too (a copy, a
    memset, a synchronize): hooked, or behind its gate (every driver entry point but those
    hooks.def marks VGPU_CUDA_UNGATED); otherwise such a call of a suspended kernel waits in the
    driver."""
    hooks = (ROOT / "native" / "interposer" / "hooks.def").read_text()
    gated = "VGPU_CUDA_UNGATED(symbol)" in hooks
    return all(
        f"VGPU_CUDA_HOOK({name})" in hooks or (gated and f"VGPU_CUDA_UNGATED({name})" not in hooks)
        for name in ("cuMemcpyDtoH_v2", "cuMemsetD8_v2", "cuCtxSynchronize")
    )


def test_the_docs_say_a_kernels_cuda_calls_wait_in_libvgpu_so_only_where_all_of_them_do():
    claims = [
        (page, paragraph)
        for page, paragraph in paragraphs()
        if re.search(r"CUDA calls (?:block|wait) (?:inside|in) `?libvgpu\.so", paragraph)
    ]
    assert every_driver_call_waits_in_libvgpu_so() or claims == []
