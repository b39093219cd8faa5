"""`cudask bench small-tasks` on a real GPU, small: 1 and 2 workers on GPU 0 give the
same results, and the report says so (speed is the benchmark's to show, not asserted)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cudask.cli.main import cli

pytestmark = pytest.mark.gpu


def test_small_tasks_with_one_and_two_workers_per_gpu(tmp_path) -> None:
    pytest.importorskip("cupy")
    out = tmp_path / "small.json"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "small-tasks",
            "--workers-per-gpu",
            "1,2",
            "--tasks",
            "500",
            "--chunks",
            "64",
            "--repeat",
            "1",
            "--timeout",
            "600",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "results identical in every setting: yes" in result.output
    report = json.loads(out.read_text())["report"]
    assert [r["workers_per_gpu"] for r in report["settings"]] == [1, 2]
    assert report["settings"][1]["workers"] == ["0-0", "0-1"]
    assert all(r["correct"] for r in report["settings"])
