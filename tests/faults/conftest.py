"""The fault matrix's table: every case records one row through `fault_row`;
with `--fault-table PATH` the rows, the machine and the versions are written to
PATH (JSON) and PATH with .md (a Markdown table) as each row comes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROWS: list[dict[str, Any]] = []
COLUMNS = ("case", "outcome", "keys_checked", "keys_lost", "keys_changed", "recover_s")


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """record(case=..., outcome=..., check=cudask.testing.integrity.Check, recover_s=...,
    **details): one row of the table (also kept when the test then fails)."""

    def record(case: str, outcome: str, check: Any, recover_s: float | None,
               **details: Any) -> dict[str, Any]:
        row = {"test": request.node.nodeid, "case": case, "outcome": outcome,
               "keys_checked": check.checked, "keys_lost": len(check.lost),
               "keys_changed": len(check.changed), "lost": check.lost,
               "recover_s": None if recover_s is None else round(recover_s, 2), **details}
        ROWS.append(row)
        _write(request.config)  # each row at once: a run cut short keeps what it had
        return row

    return record


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write(session.config)


def _write(config: pytest.Config) -> None:
    path = config.getoption("--fault-table")
    if not path or not ROWS:
        return
    from cudask_bench import provenance

    provenance.write(path, {"rows": ROWS})  # with commit, config, machine and versions
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |" for r in ROWS]
    Path(path).with_suffix(".md").write_text("\n".join(lines) + "\n")
