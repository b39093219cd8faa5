"""Sphinx configuration of cudask's documentation (Markdown through myst-parser).

Build: python3 -m pip install -e ".[docs]" && python3 -m sphinx -W -b html docs OUTDIR
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # document this checkout's cudask

project = "cudask"
author = "cudask contributors"
copyright = "cudask contributors"
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.intersphinx"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "kubernetes/*.yaml"]
myst_heading_anchors = 3  # links to headings (page.md#a-heading) resolve
suppress_warnings: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["dask_kubernetes", "kubernetes", "kopf", "kr8s"]
autodoc_default_options = {"members": False}

intersphinx_mapping: dict[str, tuple[str, None]] = {}  # no network needed to build

html_theme = "alabaster"
html_title = "cudask"
html_static_path: list[str] = []


#: A Markdown link to a .md file: rewritten when the file lies outside docs/ (below).
_MD_LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s]+\.md)(#[^)\s]*)?\)")


def _outside_links(app: Any, docname: str, source: list[str]) -> None:
    """Links to Markdown files outside docs/ (bench/results/README.md, the README) become
    `path:` links, which Sphinx copies as downloads, instead of unknown documents; the
    pages keep plain relative links, which GitHub and editors follow."""
    here = (Path(app.srcdir) / docname).parent

    def rewrite(match: re.Match[str]) -> str:
        target = (here / match[1]).resolve()
        if target.is_relative_to(Path(app.srcdir).resolve()):
            return match[0]
        return f"](path:{match[1]})"

    source[0] = _MD_LINK.sub(rewrite, source[0])


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _outside_links)
    return {"parallel_read_safe": True}
