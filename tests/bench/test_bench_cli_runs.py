"""`cudask bench` runs on CPU: whole runs of the harness on the plain-dict backend with
NumPy (cold and warm spill, cold cupy, startup), a failing variant, and the chart command."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from bench_invoke import CPU, invoke

from cudask_bench import pngtext


@pytest.mark.timeout(600)
def test_whole_run_on_dict_backend(tmp_path: Path) -> None:
    """The harness end to end on CPU, cold mode (the default): a warm-up process, then a
    fresh runner process per measured repetition; JSON, chart, table."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "r" / "spill.json", tmp_path / "r" / "spill.png"
    code, text = invoke(
        "spill",
        *CPU,
        "--total",
        "4MiB",
        "--chunk-size",
        "1MiB",
        "--repeat",
        "2",
        "--output",
        str(out),
        "--chart",
        str(png),
        "--progress",
    )
    assert code == 0, text
    assert "dict store" in text and "create" in text and "read_verify" in text
    assert "cold: first run on a fresh cluster, timed from the first submit" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == "cudask-bench/1" and doc["status"] == "ok"
    assert doc["parameters"]["total"] == 4 * 2**20 and doc["parameters"]["chunks"] == 4
    assert doc["parameters"]["mode"] == "cold" and doc["parameters"]["warm_runs"] == 2
    assert doc["parameters"]["warmup"] == 1 and doc["parameters"]["processes"] == 3
    [variant] = doc["variants"]
    assert variant["backend"] == "dict" and variant["status"] == "ok"
    assert variant["store"]["data_type"] == "builtins.dict"
    # one warm-up process, then one process per measured repetition: three runners
    assert variant["runs"] == 3 and len(set(variant["pids"])) == 3 and None not in variant["pids"]
    m = variant["measurements"]
    assert list(m) == [
        "create",
        "read_verify",
        "read_sum",
        "create_warm",
        "read_verify_warm",
        "read_sum_warm",
    ]
    create = m["create"]
    assert len(create["times"]) == 2 and create["bytes"] == 4 * 2**20
    assert len(create["warmup_times"]) == 1  # the warm-up process: kept, never in a median
    assert create["median"] > 0 and create["gbps"] > 0
    assert "every run" in create["check"]
    # --warm-runs 2 in each of the two measured processes (and two in the warm-up one)
    assert len(m["read_verify_warm"]["times"]) == 4
    assert len(m["read_verify_warm"]["warmup_times"]) == 2
    assert doc["machine"]["hostname"] and doc["harness"]["versions"]["dask"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the chart is of the file written, whose commit its caption gives
    text = pngtext.read(png.read_bytes())
    assert text["Source"] == str(out)
    assert text["Source-SHA256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    commit = doc["provenance"]["source"].get("commit") or "commit not recorded"
    assert f"cudask {commit[:7]}" in text["Description"].splitlines()[1]
    assert "figures: cold (first run on a fresh cluster) and warm" in text["Description"]


@pytest.mark.timeout(600)
def test_warm_mode_on_dict_backend(tmp_path: Path) -> None:
    """--mode warm: today's steady state in one process, every metric named *_warm."""
    out = tmp_path / "warm.json"
    code, text = invoke(
        "spill",
        *CPU,
        "--mode",
        "warm",
        "--total",
        "2MiB",
        "--chunk-size",
        "1MiB",
        "--repeat",
        "2",
        "--warmup",
        "1",
        "--output",
        str(out),
    )
    assert code == 0, text
    assert "warm: steady state after warm-ups" in text
    doc = json.loads(out.read_text())
    assert doc["parameters"]["mode"] == "warm" and doc["parameters"]["warm_runs"] is None
    assert doc["parameters"]["processes"] == 1
    [variant] = doc["variants"]
    assert variant["runs"] == 1
    m = variant["measurements"]
    assert list(m) == ["create_warm", "read_verify_warm", "read_sum_warm"]
    assert len(m["create_warm"]["times"]) == 2 and len(m["create_warm"]["warmup_times"]) == 1


@pytest.mark.timeout(600)
def test_spill_measures_the_disk_and_each_passs_disk_io(tmp_path: Path) -> None:
    """--disk-size: the disk the workers spill to, measured first (buffered and with
    O_DIRECT, or the reason why not), in the JSON and the table beside each pass's disk
    I/O and its ratio to the disk's figure; --disk-size 0 measures nothing."""
    out = tmp_path / "disk.json"
    code, text = invoke(
        "spill",
        *CPU,
        "--mode",
        "warm",
        "--total",
        "2MiB",
        "--chunk-size",
        "1MiB",
        "--repeat",
        "1",
        "--disk-size",
        "8MiB",
        "--output",
        str(out),
    )
    assert code == 0, text
    doc = json.loads(out.read_text())
    disk = doc["disk"]
    assert disk["status"] == "ok" and disk["bytes"] == 8 << 20 and disk["filesystem"]["type"]
    assert disk["buffered"]["write_GBps"] > 0 and disk["buffered"]["read_GBps"] > 0
    assert disk["direct"]["status"] in ("ok", "refused")
    assert "O_DIRECT" in disk["method"] and doc["parameters"]["disk_size"] == 8 << 20
    assert not list(tmp_path.glob("**/cudask-bench-disk*"))
    [variant] = doc["variants"]
    for name in ("create_warm", "read_verify_warm", "read_sum_warm"):
        traffic = variant["measurements"][name]["disk"]
        assert traffic["written_bytes"] is not None and traffic["read_bytes"] is not None
        assert traffic["disk_method"] in ("direct", "buffered") and "write_vs_disk" in traffic
    lines = text.splitlines()
    assert any(line.startswith("disk ") and "8.00 MiB sequential" in line for line in lines)
    heading = next(i for i, line in enumerate(lines) if line.startswith("worker's disk I/O"))
    assert re.match(r"create_warm +w \d", lines[heading + 3]), text
    assert lines[heading + 5].startswith("read_sum_warm"), text
    code, text = invoke(
        "spill",
        *CPU,
        "--mode",
        "warm",
        "--total",
        "1MiB",
        "--chunk-size",
        "1MiB",
        "--repeat",
        "1",
        "--disk-size",
        "0",
        "--output",
        str(out),
    )
    assert code == 0, text
    assert "disk" not in json.loads(out.read_text()) and "sequential" not in text


@pytest.mark.timeout(600)
def test_cupy_cold_on_dict_backend(tmp_path: Path) -> None:
    """Cold cupy: a process per repetition, and in it a fresh cluster per operation."""
    out = tmp_path / "cupy.json"
    code, text = invoke(
        "cupy",
        *CPU,
        "--operation",
        "sum,dot",
        "--size",
        "200",
        "--chunk-size",
        "50",
        "--repeat",
        "1",
        "--warmup",
        "1",
        "--warm-runs",
        "1",
        "--output",
        str(out),
    )
    assert code == 0, text
    assert "*_input: creating the input, *_total: input + operation" in text
    doc = json.loads(out.read_text())
    [variant] = doc["variants"]
    assert variant["runs"] == 2 and len(set(variant["pids"])) == 2
    m = variant["measurements"]
    assert list(m) == [
        "sum_input",
        "sum",
        "sum_total",
        "sum_warm",
        "dot_input",
        "dot",
        "dot_total",
        "dot_warm",
    ]
    for op in ("sum", "dot"):
        assert all(len(m[op + s]["times"]) == 1 for s in ("_input", "", "_total", "_warm"))
        assert all(len(m[op + s]["warmup_times"]) == 1 for s in ("_input", "", "_total", "_warm"))
        assert m[op + "_total"]["median"] == pytest.approx(
            m[op + "_input"]["median"] + m[op]["median"]
        )
        assert m[op]["check"]
    assert set(variant["stores"]) == {"sum", "dot"}  # a cluster each
    # the table lists the cold figures first
    rows = [line.split()[0] for line in text.splitlines() if line.startswith(("sum", "dot"))]
    assert rows[:8] == [
        "sum_input",
        "sum",
        "sum_total",
        "dot_input",
        "dot",
        "dot_total",
        "sum_warm",
        "dot_warm",
    ]


@pytest.mark.timeout(600)
def test_startup_runs_fresh_processes(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    code, text = invoke("startup", *CPU, "--repeat", "2", "--warmup", "1", "--output", str(out))
    assert code == 0, text
    [variant] = json.loads(out.read_text())["variants"]
    assert variant["runs"] == 3
    m = variant["measurements"]
    assert len(m["startup"]["times"]) == 2 and len(m["startup"]["warmup_times"]) == 1
    assert {"import", "cluster", "first_roundtrip", "first_array_task", "close"} <= set(m)
    ready = m["ready_for_arrays"]["times"]
    assert all(r > s for r, s in zip(ready, m["startup"]["times"], strict=True))
    assert len(variant["process_wall_s"]) == 3 and len(set(variant["pids"])) == 3


def test_failing_variant_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant whose runner fails: the table says FAILED, JSON keeps the error, exit 1."""
    from cudask_bench import harness

    def failing_runner(*args: object, **kwargs: object) -> dict[str, object]:
        return {
            "status": "failed",
            "error": "RuntimeError: out of memory",
            "measurements": {},
            "returncode": 1,
            "process_wall_s": 0.1,
            "log_tail": ["boom"],
        }

    monkeypatch.setattr(harness, "spawn_runner", failing_runner)
    out = tmp_path / "fail.json"
    code, text = invoke(
        "spill", *CPU, "--total", "1MiB", "--chunk-size", "1MiB", "--output", str(out)
    )
    assert code == 1
    assert "FAILED dict store: RuntimeError: out of memory" in text
    assert "1 of 1 variants failed" in text
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed"
    assert doc["variants"][0]["error"] == "RuntimeError: out of memory"
    assert doc["variants"][0]["log_tail"] == ["boom"]


def test_chart_command(tmp_path: Path, synthetic_document: dict[str, object]) -> None:
    pytest.importorskip("matplotlib")
    src = tmp_path / "doc.json"
    src.write_text(json.dumps(synthetic_document))
    code, out = invoke("chart", str(src), "--output", str(tmp_path / "c.png"))
    assert code == 0, out
    assert "ratios" in out and "dask-cuda 4 GiB" in out
    assert (tmp_path / "c.png").stat().st_size > 1000
    # the picture names the file it was drawn from, as given on the command line
    text = pngtext.read((tmp_path / "c.png").read_bytes())
    assert text["Source"] == str(src) and text["Description"].startswith(f"result: {src}\n")


def test_chart_command_refuses_other_json(tmp_path: Path) -> None:
    src = tmp_path / "other.json"
    src.write_text('{"hello": 1}')
    code, out = invoke("chart", str(src), "--output", str(tmp_path / "c.png"))
    assert code == 1 and "not a cudask bench result" in out
