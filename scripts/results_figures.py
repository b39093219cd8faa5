"""Figure markers for scripts/results-index: the pattern of a quoted figure, the value a
marker's key names in a result, and the markers that pattern cannot read.

Covers: `FIGURE` (a number, its unit, then `<!-- figure FILE#KEY -->`), `lookup` (the
value at a dotted key of a loaded result), `unread` (the lines of markers `FIGURE` does
not match: split over lines, or with no number right before them; unmatched, they would
go unchecked). Does not cover: finding the docs, loading result files, comparing values
(scripts/results-index). Threading: none; stdlib only.
"""

from __future__ import annotations

import re
from typing import Any

FIGURE = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<space>\s?)(?P<unit>ms|s|GB/s|×)?(?:\*\*)?"
                    r"(?P<marker><!-- figure )(?P<file>[^#\s]+)#(?P<key>.+?) -->")
MARKER = re.compile(r"<!--\s*figure\s")
TOKEN = re.compile(r"\[([^\]]+)\]|([^.\[\]]+)")


def lookup(document: Any, key: str) -> Any:
    """The value at a dotted KEY (`[NAME]` or `[field=VALUE]` picks a list item; `[KEY]`
    picks a mapping's KEY as written, dots and all)."""
    value = document
    for item, name in TOKEN.findall(key):
        if name:
            value = value[name] if isinstance(value, dict) else value[int(name)]
            continue
        if isinstance(value, dict):
            value = value[item]
            continue
        field, _, wanted = item.rpartition("=")
        matches = [v for v in value if isinstance(v, dict) and v.get(field or "name") == wanted]
        if len(matches) != 1:
            raise KeyError(f"{len(matches)} items with {field or 'name'} {wanted!r} in {key}")
        value = matches[0]
    return value


def unread(text: str) -> list[int]:
    """The line numbers (from 1) of figure markers in `text` that `FIGURE` does not read."""
    read = {m.start("marker") for m in FIGURE.finditer(text)}
    return [text.count("\n", 0, m.start()) + 1 for m in MARKER.finditer(text)
            if m.start() not in read]


__all__ = ["FIGURE", "MARKER", "TOKEN", "lookup", "unread"]
