"""Git history for scripts/results-index: which commits changed the code a benchmark
measures, which of them catalogue.toml explains, and the commit that brought a result
file's content into bench/results.

Covers: `git` (one git command, None when git is missing or fails), `knows`, `code_paths`,
`explained`, `unexplained` (the commits since one that a benchmark's figures depend on and
the catalogue does not explain), `content_commit`. Does not cover: reading result files, the catalogue or the
docs (scripts/results-index). Threading: none; stdlib only.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any


def git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def knows(root: Path, commit: str) -> bool:
    """Whether git is there and this checkout's history has `commit` (not a shallow copy)."""
    return git(root, "cat-file", "-e", f"{commit}^{{commit}}") is not None


def code_paths(cat: dict[str, Any], benchmark: str) -> tuple[list[str], list[str]]:
    """(paths, excluded paths) a benchmark's figures depend on, `@other` expanded."""
    include: list[str] = []
    exclude: list[str] = []
    for item in cat["benchmarks"][benchmark]:
        if item.startswith("@"):
            more, less = code_paths(cat, item[1:])
            include += more
            exclude += less
        elif item.startswith("!"):
            exclude.append(item[1:])
        else:
            include.append(item)
    return include, [p for p in exclude if p not in include]


def explained(root: Path, cat: dict[str, Any], benchmark: str,
              name: str | None = None) -> dict[str, str]:
    """Commit (full hash) -> why it leaves `benchmark`'s figures as they were (for the
    result file `name`: an entry with `files` explains only the files it lists)."""
    out: dict[str, str] = {}
    for entry in cat.get("unaffected", []):
        if benchmark not in entry.get("benchmarks", []):
            continue
        if "files" in entry and name not in entry["files"]:
            continue
        hashes = list(entry.get("commits", []))
        if entry.get("range"):
            hashes += (git(root, "rev-list", entry["range"]) or "").split()
        for short in hashes:
            if full := _full_hash(root, short):
                out[full] = entry["reason"]
    return out


@functools.cache
def _full_hash(root: Path, short: str) -> str:
    """The full hash of commit `short` ("" when git does not know it); asked once per run,
    though every result file's check reads the catalogue's entries again."""
    return (git(root, "rev-parse", f"{short}^{{commit}}") or "").strip()


def content_commit(root: Path, name: str, results: str) -> str | None:
    """The commit that first brought the file's present content into bench/results (under
    any name: renames and replacements followed); None when git does not know it."""
    blob = git(root, "hash-object", f"{results}/{name}")
    if not blob:
        return None
    log = git(root, "log", "--reverse", "--format=%h", f"--find-object={blob.strip()}", "HEAD",
               "--", results)
    return log.split()[0] if log and log.split() else None


def unexplained(root: Path, cat: dict[str, Any], benchmark: str, since: str,
                name: str | None = None) -> list[str] | None:
    """"HASH subject" of the commits after `since` that touch `benchmark`'s code and that
    catalogue.toml does not explain (for the result file `name`); None when git cannot
    list them."""
    include, exclude = code_paths(cat, benchmark)
    log = git(root, "log", "--no-merges", "--format=%H %h %s", f"{since}..HEAD",
              "--", *include, *(f":(exclude){p}" for p in exclude))
    if log is None:
        return None
    reasons = explained(root, cat, benchmark, name)
    return [f"{line.split(' ', 2)[1]} {line.split(' ', 2)[2][:90]}"
            for line in log.splitlines() if line.split(" ", 1)[0] not in reasons]


__all__ = ["code_paths", "content_commit", "explained", "git", "knows", "unexplained"]
