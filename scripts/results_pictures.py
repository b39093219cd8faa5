"""Pictures for scripts/results-index: every PNG of bench/results and docs/, and whether
each names the result file it was drawn from (its PNG text chunks, cudask_bench.pngtext)
as that file is now.

A chart in bench/results (`cudask bench --chart`, `cudask bench chart`, `results-index
--charts`) names the JSON beside it and that file's SHA-256, so a chart left behind by a
changed JSON is found; a picture in docs/ names a catalogued result file the same way
(scripts/dashboard-shot), or says it is simulated.

Covers: `pictures`, `check_picture`, the text keys `SOURCE`, `SHA256`, `SIMULATED`. Does
not cover: drawing charts or reading the catalogue (scripts/results-index passes the
catalogued files). Threading: none; stdlib and cudask_bench.pngtext only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cudask_bench import pngtext

#: PNG text keys naming a picture's source (cudask_bench.chart, scripts/dashboard-shot).
SOURCE, SHA256, SIMULATED = "Source", "Source-SHA256", "Simulated"


def pictures(root: Path, results: str) -> list[Path]:
    """Every PNG under `results` and docs/ (not the built site)."""
    found = sorted((root / results).rglob("*.png")) + sorted((root / "docs").rglob("*.png"))
    return [p for p in found if "_build" not in p.parts]


def check_picture(root: Path, path: Path, results: str, files: Mapping[str, Any]) -> str | None:
    """None when the PNG names its source (a file of `results` that `files`, the
    catalogue, lists) and that file is as it was drawn from."""
    rel = path.relative_to(root)
    try:
        text = pngtext.read(path.read_bytes())
    except (OSError, ValueError) as exc:
        return f"{rel}: {exc}"
    source = text.get(SOURCE)
    if str(rel).startswith(results + "/"):
        twin = str(rel.with_suffix(".json"))
        if source != twin:
            return (f"{rel}: names {source!r} as its source, not {twin}: redraw it "
                    "(scripts/results-index --charts)")
    elif text.get(SIMULATED):
        return None  # says so in the picture too (scripts/dashboard-shot --simulate)
    elif source is None:
        return (f"{rel}: names no source result file and does not say it is simulated "
                "(draw it with scripts/dashboard-shot or cudask bench chart)")
    name = source.removeprefix(results + "/")
    if not source.startswith(results + "/") or name not in files:
        return f"{rel}: its source {source!r} is not a file of {results}/catalogue.toml"
    if not (root / source).is_file():
        return f"{rel}: its source {source} is missing"
    if hashlib.sha256((root / source).read_bytes()).hexdigest() != text.get(SHA256):
        return f"{rel}: {source} changed since this picture was drawn from it: redraw it"
    return None


__all__ = ["SHA256", "SIMULATED", "SOURCE", "check_picture", "pictures"]
