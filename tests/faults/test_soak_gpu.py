"""A short `cudask bench soak` on a real GPU: random create / read / combine /
spill / delete steps and worker kills for 40 s at a 256 MiB device limit, then
every held key byte-identical; the command's JSON report is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cudask_bench.cli import bench

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(300)
def test_short_soak_loses_nothing(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    out = tmp_path / "soak.json"
    result = CliRunner().invoke(
        bench,
        [
            "soak",
            "--duration",
            "40",
            "--device-memory-limit",
            "256MiB",
            "--memory-limit",
            "4GiB",
            "--max-held",
            "1GiB",
            "--kill-every",
            "12",
            "--min-kills",
            "2",
            "--n-workers",
            "1",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(out.read_text())["report"]
    assert report["ok"] and report["keys_lost"] == 0 and report["keys_changed"] == 0
    assert report["kills"] >= 2 and report["keys_checked"] > 0 and report["reads_checked"] > 0
    assert report["bytes_moved"]["spill-device-to-host"] > 0
