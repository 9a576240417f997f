"""Sphinx configuration of jupyter-vgpu's documentation site.

Build it as CI does (README's test block): ``python -m sphinx -W --keep-going -n -b html docs docs/_build/html``.
The reference pages are generated from the code at build time: the options from the traitlets
(autodoc-traits), the REST API from jupyter_vgpu/server/api.yaml (sphinxcontrib-openapi), the CLI
from its own ``--help`` and the classroom file's keys from jupyter_vgpu/hub/classroom/keys.py
(docs/_ext/vgpu_docs.py), so none of them can drift from what the code does.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(ROOT))  # the checkout's jupyter_vgpu, whether or not it is installed

from jupyter_vgpu._version import __version__  # noqa: E402

project = "jupyter-vgpu"
author = "jupyter-vgpu developers"
copyright = "jupyter-vgpu developers"
version = release = __version__

extensions = [
    "myst_parser",
    "autodoc_traits",
    "sphinxcontrib.openapi",
    "vgpu_docs",
]

source_suffix = {".md": "markdown"}
nitpicky = True  # as -n does: a reference to nothing is a warning, and with -W an error (Read the Docs too)
root_doc = "index"
exclude_patterns = ["_build", "screenshots", "grafana"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [the image](#a-kernel-image) in docs/kubernetes.md and the like

# The options reference: traits in the order the source defines them (inherited ones after).
autodoc_member_order = "bysource"
autodoc_typehints = "none"
# jupyter_server's ExtensionApp.default_url, inherited by VGPUApp, has no help (ours all do).
warnings.filterwarnings("ignore", r"\s*Documenting VGPUApp\.default_url without a help string", FutureWarning)

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-vgpu"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # The "Section Navigation" column lists the pages under the current top-level page; every
    # page here is a top-level leaf (the index's toctrees are the top bar), so it listed nothing.
    # With hidden toctrees not counted the theme resolves each page's own subtree and leaves the
    # column out where it is empty, as it would an explicit `html_sidebars` entry per leaf page,
    # and keeps it for a page that someday has pages under it.
    "sidebar_includehidden": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_context = {"default_mode": "auto"}

# The REST reference: sphinxcontrib-openapi's newer renderer, which shows request and reply fields.
openapi_default_renderer = "httpdomain"
