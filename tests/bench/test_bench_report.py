"""The bench's results on CPU (cudask_bench.report, .harness, .chart): ratios between
variants, merging the runs of a variant, the table and JSON, the progress line, and the
chart with its caption."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cudask_bench import harness, report, spec, targets

# --------------------------------------------------------------------------- ratios


def test_comparisons(synthetic_document: dict[str, Any]) -> None:
    pairs = report.comparisons(synthetic_document["variants"])
    by = {(c["kind"], c["metric"], c["variant"]): c for c in pairs}
    c = by[("vs dask-cuda", "create", "cudask 4 GiB")]
    assert c["reference"] == "dask-cuda 4 GiB"
    assert c["ratio"] == pytest.approx(0.9 / 5.75) and c["speedup"] == pytest.approx(5.75 / 0.9)
    d = by[("vs dict store", "read_verify", "cudask no limit")]
    assert d["ratio"] == pytest.approx(0.34 / 0.33)
    j = by[("jit-unspill vs plain", "create", "cudask 4 GiB +jit")]
    assert j["reference"] == "cudask 4 GiB" and j["ratio"] == pytest.approx(0.8 / 0.9)
    # the failed dask-cuda +jit variant gives no ratio at all
    assert not [c for c in pairs if "dask-cuda 4 GiB +jit" in (c["variant"], c["reference"])]
    assert not [
        c for c in pairs if c["variant"] == "cudask 4 GiB +jit" and c["kind"] == "vs dask-cuda"
    ]
    assert len(pairs) == 6  # 3 pairs x 2 metrics


def test_comparison_skips_failed_metric(synthetic_document: dict[str, Any]) -> None:
    dc = synthetic_document["variants"][4]
    dc["measurements"]["create"]["status"] = "failed"
    pairs = report.comparisons(synthetic_document["variants"])
    assert not [c for c in pairs if c["reference"] == "dask-cuda 4 GiB" and c["metric"] == "create"]
    assert [
        c for c in pairs if c["reference"] == "dask-cuda 4 GiB" and c["metric"] == "read_verify"
    ]


def test_merge_runs_for_startup() -> None:
    v = spec.Variant("cudask", None, limit_set=False)
    runs = [
        {
            "status": "ok",
            "process_wall_s": 3.0,
            "versions": {"dask": "1"},
            "measurements": {"startup": {"times": [], "warmup_times": [2.0]}},
        },
        {
            "status": "ok",
            "process_wall_s": 2.5,
            "measurements": {"startup": {"times": [1.5], "warmup_times": []}},
        },
        {
            "status": "ok",
            "process_wall_s": 2.4,
            "measurements": {"startup": {"times": [1.2], "warmup_times": []}},
        },
    ]
    entry = report.merge_runs(v, targets.Target(sys.executable), runs)
    m = entry["measurements"]["startup"]
    assert m["times"] == [1.5, 1.2] and m["warmup_times"] == [2.0]
    assert m["median"] == pytest.approx(1.35) and m["min"] == 1.2 and m["max"] == 1.5
    assert entry["status"] == "ok" and entry["runs"] == 3 and entry["versions"] == {"dask": "1"}
    assert entry["pids"] == [None, None, None]


def test_merge_runs_failure() -> None:
    runs = [{"status": "failed", "error": "boom", "traceback": "tb", "measurements": {}}]
    entry = report.merge_runs(spec.Variant("dict"), targets.Target(sys.executable), runs)
    assert entry["status"] == "failed" and entry["error"] == "boom" and entry["traceback"] == "tb"
    assert entry["measurements"] == {}


def test_table_and_json_roundtrip(tmp_path: Path, synthetic_document: dict[str, Any]) -> None:
    synthetic_document["comparisons"] = report.comparisons(synthetic_document["variants"])
    report.write_json(synthetic_document, tmp_path / "a" / "r.json")
    doc = json.loads((tmp_path / "a" / "r.json").read_text())
    table = report.format_table(doc)
    assert "0.157 (6.39x)" in table
    assert "FAILED dask-cuda 4 GiB +jit" in table
    assert "5.750 s (3.0 GB/s)" in table


def test_table_says_the_mode_and_puts_cold_before_warm(
    synthetic_document: dict[str, Any],
) -> None:
    for v in synthetic_document["variants"]:
        m = v["measurements"]
        v["measurements"] = {
            **{k + "_warm": dict(x, median=x["median"] / 2) for k, x in m.items()},
            **m,
        }
    synthetic_document["parameters"].update(mode="cold", warm_runs=2)
    table = report.format_table(synthetic_document)
    lines = table.splitlines()
    assert lines[1] == (
        "cold: first run on a fresh cluster, timed from the first submit; "
        "*_warm: the next 2 runs in the same cluster"
    )
    rows = [
        line.split()[0]
        for line in lines[2:]
        if line.split()
        and line.split()[0] in {"create", "read_verify", "create_warm", "read_verify_warm"}
    ]
    assert rows[:4] == ["create", "read_verify", "create_warm", "read_verify_warm"]
    pairs = report.comparisons(synthetic_document["variants"])
    assert {c["metric"] for c in pairs} == {
        "create",
        "read_verify",
        "create_warm",
        "read_verify_warm",
    }
    synthetic_document["parameters"]["mode"] = "warm"
    assert report.format_table(synthetic_document).splitlines()[1] == (
        "warm: steady state after warm-ups"
    )
    synthetic_document["parameters"] = {}  # startup, or a file from before --mode
    assert report.format_table(synthetic_document).splitlines()[1].startswith("metric")


def test_comparisons_cover_cupy_cold_metrics(synthetic_document: dict[str, Any]) -> None:
    for v in synthetic_document["variants"]:
        v["measurements"] = {
            f"sum{suffix}": dict(x)
            for x in v["measurements"].values()
            for suffix in ("_input", "", "_total", "_warm")
        }
    pairs = report.comparisons(synthetic_document["variants"])
    vs_dask_cuda = {c["metric"] for c in pairs if c["kind"] == "vs dask-cuda"}
    assert vs_dask_cuda == {"sum_input", "sum", "sum_total", "sum_warm"}


def test_progress_line() -> None:
    out = io.StringIO()
    p = harness.ProgressLine(True, out, width=10)
    p.update("1/2", "cudask 4 GiB", 3, 6, "create run 1/3")
    p.finish("[1/2] cudask 4 GiB: ok")
    text = out.getvalue()
    assert "[#####-----] 3/6 create run 1/3" in text
    assert text.endswith("\n") and text.rstrip().endswith("cudask 4 GiB: ok")
    quiet = io.StringIO()
    q = harness.ProgressLine(False, quiet)
    q.update("1/1", "x", 1, 1, "y")
    q.finish("done")
    assert quiet.getvalue() == ""


# --------------------------------------------------------------------------- chart


def test_chart_png(tmp_path: Path, synthetic_document: dict[str, Any]) -> None:
    pytest.importorskip("matplotlib")
    from cudask_bench import pngtext
    from cudask_bench.chart import Origin, write_chart

    write_chart(synthetic_document, tmp_path / "c.png")
    data = (tmp_path / "c.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    text = pngtext.read(data)
    assert "Source" not in text
    assert text["Description"].startswith("result: not written to a file")
    source = tmp_path / "r.json"
    source.write_text(json.dumps(synthetic_document))
    write_chart(
        synthetic_document, tmp_path / "c.png", Origin.of_file(source, "runs/r.json", "abc1234")
    )
    text = pngtext.read((tmp_path / "c.png").read_bytes())
    assert text["Source"] == "runs/r.json"
    assert text["Source-SHA256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    lines = text["Description"].splitlines()
    assert lines[0] == "result: runs/r.json" and "cudask abc1234" in lines[1]
    assert lines[2].startswith("figures: warm") or lines[2].startswith("figures: cold"), lines
    synthetic_document["variants"] = []
    with pytest.raises(ValueError, match="no measurements"):
        write_chart(synthetic_document, tmp_path / "d.png")
