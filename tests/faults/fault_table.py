"""The fault matrix's table: rows as the cases record them, written as JSON (with
the machine and versions) and as a Markdown table.

Covers: `row(...)`, one case's row from what it measured: a `Check` of the keys
(None: the case did not run, so no keys were checked), the seconds it took to
recover (None: nothing failed, or the case did not time it); `markdown(rows)`,
where an absent figure shows as "—", never as 0; `write(path, rows)`.
Does not cover: running the cases (test_fault_matrix_gpu.py, test_fault_host_gpu.py)
or checking keys (cudask.testing.integrity). Threading: none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS = ("case", "outcome", "keys_checked", "keys_lost", "keys_changed", "recover_s")
ABSENT = "—"


def row(
    test: str, case: str, outcome: str, check: Any | None, recover_s: float | None, **details: Any
) -> dict[str, Any]:
    """One row; `details` go to the JSON only."""
    return {
        "test": test,
        "case": case,
        "outcome": outcome,
        "keys_checked": None if check is None else check.checked,
        "keys_lost": None if check is None else len(check.lost),
        "keys_changed": None if check is None else len(check.changed),
        "lost": None if check is None else check.lost,
        "recover_s": None if recover_s is None else round(recover_s, 2),
        **details,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    return ABSENT if value is None else str(value).replace("|", "\\|")


def write(path: str, rows: list[dict[str, Any]]) -> None:
    """PATH: the rows with commit, config, machine and versions; PATH with .md: the table."""
    from cudask_bench import provenance

    provenance.write(path, {"rows": rows})
    Path(path).with_suffix(".md").write_text(markdown(rows))


__all__ = ["ABSENT", "COLUMNS", "markdown", "row", "write"]
