"""The fault matrix's table: every case records one row through `fault_row`;
with `--fault-table PATH` the rows, the machine and the versions are written to
PATH (JSON) and PATH with .md (a Markdown table) as each row comes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fault_table
import pytest

ROWS: list[dict[str, Any]] = []


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """record(case=..., outcome=..., check=cudask.testing.integrity.Check or None (not run),
    recover_s=seconds or None (nothing to recover from, or not timed), **details): one row
    of the table (also kept when the test then fails)."""

    def record(
        case: str, outcome: str, check: Any | None, recover_s: float | None, **details: Any
    ) -> dict[str, Any]:
        row = fault_table.row(request.node.nodeid, case, outcome, check, recover_s, **details)
        ROWS.append(row)
        _write(request.config)  # each row at once: a run cut short keeps what it had
        return row

    return record


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write(session.config)


def _write(config: pytest.Config) -> None:
    path = config.getoption("--fault-table")
    if path and ROWS:
        fault_table.write(path, ROWS)
