"""`cudask bench etl` on a real GPU, small: the floor and cudask's store on CSV or Parquet
files of 3.4x a small device limit, cuDF writing the data; every answer right, NVML's
peaks and each phase's largest task present, cudask's store spilling (its device-to-host
bytes) and the floor not, the data folder gone (speed is the benchmark's to show, not
asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cudask.cli.main import cli

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_etl_floor_and_cudask_right_with_spilling(tmp_path: Path, fmt: str) -> None:
    pytest.importorskip("cudf")
    pytest.importorskip("dask_cudf")
    out, data = tmp_path / "etl.json", tmp_path / "data"
    data.mkdir()
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "etl",
            "--settings",
            "floor,cudask",
            "--format",
            fmt,
            "--files",
            "3",
            "--rows-per-file",
            "1000000",
            "--device-memory-limit",
            "25MB",
            "--warm-runs",
            "1",
            "--timeout",
            "120",
            "--data-dir",
            str(data),
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["data"]["generator"] == "cudf"
    assert os.listdir(data) == []
    for name in ("floor", "cudask"):
        entry = doc["results"][fmt][name]
        assert entry["status"] == "ok" and entry["correct"], (name, entry["error"])
        assert entry["cold"]["peak_bytes"] is not None and entry["warm"]["runs"] == 1
        child = entry["children"][0]
        assert child["memory"]["idle_bytes"] > 0 and child["cluster"].get("stand_in") is None
    cold = doc["results"][fmt]["cudask"]["children"][0]["runs"][0]
    assert sum(p["moved"].get("device-to-host/bytes", 0) for p in cold["phases"].values()) > 0
    assert all(p["compute_s"] > 0 for p in cold["phases"].values())
    # where nothing spills, NVML's samples saw tasks add memory while they computed, and the
    # bound of cudask's phases counts what they saw
    floor_runs = [r for c in doc["results"][fmt]["floor"]["children"] for r in c["runs"]]
    assert sum(p["working_set_nvml_tasks"] for r in floor_runs for p in r["phases"].values()) > 0
    limit = doc["plan"]["device_memory_limit"]
    floor_seen = doc["results"][fmt]["floor"]["cold"]["phase_working_set_nvml_bytes"]
    bound = doc["results"][fmt]["cudask"]["cold"]
    for phase, seen in floor_seen.items():
        assert bound["phase_bound_bytes"][phase] >= limit + seen, phase
    store = doc["results"][fmt]["cudask"]["children"][0]["store"]
    assert store["data_type"].startswith("cudask."), store["data_type"]
    floor = doc["results"][fmt]["floor"]["children"][0]["store"]
    assert floor["cumulative_metrics"].get("device-to-host/bytes", 0) == 0, floor
    assert "right" in result.output and set(doc["provenance"]["figures"].values()) == {
        "cold",
        "warm",
    }
