"""Tiny versions of every `cudask bench` workload through real clusters on a real GPU.

They check that each workload runs, verifies its data and reports what it measured on
cudask (with and without JIT-unspill), the plain-dict baseline and, where dask-cuda is
installed in this environment, dask-cuda. Speed is not asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cudask_bench import environment
from cudask_bench.cli import bench

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

HAS_DASK_CUDA = environment.has_module("dask_cuda")
HAS_DASK_CUDF = environment.has_module("dask_cudf")


def run(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "result.json"
    result = CliRunner().invoke(bench, [*args, "--output", str(out)], prog_name="cudask bench")
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", [(v["name"], v["error"]) for v in doc["variants"]]
    assert doc["machine"]["gpu_used"]["name"]
    assert doc["variants"], doc  # the loops over them check something
    for v in doc["variants"]:
        assert v["worker"].get("name"), v["worker"]  # the worker computed on a GPU
    return doc


def test_spill_tiny_with_baselines(tmp_path: Path) -> None:
    doc = run(
        tmp_path,
        "spill",
        "--total",
        "512MiB",
        "--chunk-size",
        "32MiB",
        "--device-memory-limit",
        "128MiB",
        "--disk-size",
        "256MiB",
        "--repeat",
        "2",
    )
    names = [v["name"] for v in doc["variants"]]
    assert names == ["dict store", "cudask no limit", "cudask 128 MiB"]
    assert doc["parameters"]["mode"] == "cold"
    for v in doc["variants"]:
        m = v["measurements"]
        assert len(m["create"]["times"]) == 2 and m["read_verify"]["bytes"] == 512 * 2**20
        assert v["runs"] == 3 and len(set(v["pids"])) == 3  # a warm-up + 2 cold processes
        assert len(m["read_verify_warm"]["times"]) == 2 * 2  # --warm-runs 2 per process
    assert {c["kind"] for c in doc["comparisons"]} == {"vs dict store"}


def test_spill_tiny_warm_mode(tmp_path: Path) -> None:
    doc = run(
        tmp_path,
        "spill",
        "--mode",
        "warm",
        "--total",
        "256MiB",
        "--chunk-size",
        "16MiB",
        "--device-memory-limit",
        "64MiB",
        "--disk-size",
        "256MiB",
        "--repeat",
        "2",
        "--no-baseline",
    )
    [v] = doc["variants"]
    assert set(v["measurements"]) == {"create_warm", "read_verify_warm", "read_sum_warm"}
    assert len(v["measurements"]["create_warm"]["times"]) == 2


def test_spill_past_the_host_limit_to_disk_beside_the_disks_figures(tmp_path: Path) -> None:
    """6 GiB through a 256 MB device tier and an 8 GB host limit (a 4.8 GB host tier):
    about 1.2 GB reach disk, and each pass reports its disk I/O beside the disk's own
    sequential figures, measured first in the same run."""
    doc = run(
        tmp_path,
        "spill",
        "--mode",
        "warm",
        "--total",
        "6GiB",
        "--chunk-size",
        "128MiB",
        "--device-memory-limit",
        "256MB",
        "--memory-limit",
        "8GB",
        "--disk-size",
        "1GiB",
        "--repeat",
        "1",
        "--no-baseline",
    )
    assert doc["disk"]["status"] == "ok" and doc["disk"]["buffered"]["write_GBps"] > 0
    [v] = doc["variants"]
    create, verify = v["measurements"]["create_warm"], v["measurements"]["read_verify_warm"]
    assert create["disk"]["written_bytes"] > 2**29, create["disk"]  # over half a GiB to disk
    assert verify["disk"]["read_bytes"] > 2**29, verify["disk"]
    assert create["disk"]["write_vs_disk"] > 0 and verify["disk"]["read_vs_disk"] > 0
    assert v["measurements"]["read_sum_warm"]["status"] == "ok"


def test_spill_tiny_jit_both(tmp_path: Path) -> None:
    doc = run(
        tmp_path,
        "spill",
        "--total",
        "256MiB",
        "--chunk-size",
        "16MiB",
        "--device-memory-limit",
        "64MiB",
        "--disk-size",
        "256MiB",
        "--repeat",
        "1",
        "--jit-unspill",
        "both",
        "--no-baseline",
    )
    assert [v["jit_unspill"] for v in doc["variants"]] == [False, True]
    assert {c["kind"] for c in doc["comparisons"]} == {"jit-unspill vs plain"}


@pytest.mark.parametrize("jit", ["off", "on"])
def test_cupy_tiny_all_operations(tmp_path: Path, jit: str) -> None:
    doc = run(
        tmp_path,
        "cupy",
        "--size",
        "2000",
        "--chunk-size",
        "500",
        "--second-size",
        "100",
        "--device-memory-limit",
        "16MiB",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--warm-runs",
        "1",
        "--jit-unspill",
        jit,
        "--no-baseline",
    )
    [v] = doc["variants"]
    for op in ("transpose_sum", "dot", "svd", "sum", "mean", "slice", "map_overlap"):
        for name in (f"{op}_input", op, f"{op}_total", f"{op}_warm"):
            m = v["measurements"][name]
            assert m["status"] == "ok" and len(m["times"]) == 1, (name, m["error"])
        assert v["measurements"][op]["check"]
    assert len(v["stores"]) == 7  # a fresh cluster per operation


def test_startup_tiny(tmp_path: Path) -> None:
    doc = run(
        tmp_path, "startup", "--repeat", "1", "--warmup", "0", "--chart", str(tmp_path / "s.png")
    )
    for v in doc["variants"]:
        assert len(v["measurements"]["startup"]["times"]) == 1
        assert len(v["measurements"]["ready_for_arrays"]["times"]) == 1
    assert (tmp_path / "s.png").exists()


@pytest.mark.skipif(not HAS_DASK_CUDA, reason="dask-cuda is not installed in this environment")
def test_against_dask_cuda_tiny(tmp_path: Path) -> None:
    doc = run(
        tmp_path,
        "spill",
        "--total",
        "256MiB",
        "--chunk-size",
        "16MiB",
        "--device-memory-limit",
        "64MiB",
        "--disk-size",
        "256MiB",
        "--repeat",
        "1",
        "--against",
        "dask-cuda",
        "--no-baseline",
    )
    dc = [v for v in doc["variants"] if v["backend"] == "dask-cuda"]
    assert dc and dc[0]["versions"]["dask_cuda"]
    assert "written_bytes" in dc[0]["measurements"]["create"]["disk"]  # counted there too
    assert not [m for m in dc[0]["cudask_modules"] if m.startswith("cudask.deploy")]
    assert {c["kind"] for c in doc["comparisons"]} == {"vs dask-cuda"}


def test_transfer_tiny(tmp_path: Path) -> None:
    """Two workers (on GPU 0, or one per GPU), two rounds whose order rotates, two warm
    all-to-all runs per cluster: IPC moves the arrays in the cudask-ipc setting and
    nothing in cudask-tcp; every value and the rechunk check out in each round; after the
    cold run the workers hold both layouts' blocks, on the device; with
    dask-cuda in this environment, its workers too; the report ends with the targets."""
    out = tmp_path / "transfer.json"
    names = ["cudask-ipc", "cudask-tcp"] + (["dask-cuda-tcp"] if HAS_DASK_CUDA else [])
    against = ["--against", "dask-cuda"] if HAS_DASK_CUDA else []
    shuffle_rows = "100000" if HAS_DASK_CUDF else "0"
    result = CliRunner().invoke(
        bench,
        [
            "transfer",
            "--sizes",
            "8MiB",
            "--repeat",
            "1",
            "--n",
            "2048",
            "--blocks",
            "4",
            "--shuffle-rows",
            shuffle_rows,
            "--protocols",
            "tcp",
            "--settings",
            ",".join(names),
            "--rounds",
            "2",
            "--warm-runs",
            "2",
            *against,
            "--output",
            str(out),
        ],
        prog_name="cudask bench",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())["report"]
    assert list(report["settings"]) == names
    assert report["order"] == [names, names[1:] + names[:1]]
    for setting, case in report["settings"].items():
        assert case["failed"] == 0 and len(case["rounds"]) == 2 and case["sum_ok"], case
        for r in case["rounds"]:
            assert r["all_to_all"]["sum_ok"] and r["all_to_all_warm"]["sum_ok"], r
            assert len(r["all_to_all_warm"]["seconds_each"]) == 2, r["all_to_all_warm"]
            stream = r["all_to_all"]["workers"]  # the scheduler's task stream of the cold run
            assert stream["tasks"] > 0 and stream["compute_s"] > 0 and stream["busy_s"] > 0, stream
            held = r["all_to_all"][
                "held"
            ]  # each worker's blocks and device bytes after the cold run
            for layout in ("row-blocks", "column-blocks"):  # every block somewhere (some on both)
                assert 4 <= sum(w[layout] for w in held.values()) <= 8, held
            assert sum(w["device-bytes"] for w in held.values()) >= 2 * 2048 * 2048 * 8, held
            if (
                HAS_DASK_CUDF
            ):  # dask-cuDF frames shuffled by tasks, P2P and explicit comms, cold and warm
                runs = [run for method in r["shuffle"].values() for run in method.values()]
                assert len(runs) == 6 and all(
                    run.get("rows_ok") and run.get("keys_ok") for run in runs
                ), runs
            else:
                assert "shuffle" not in r
            cold = r["point_to_point"][str(8 << 20)]["cold"]
            assert cold["bytes"] >= 8 << 20, cold
            received = sum(w["received"] for w in r["ipc"].values())
            assert (received >= 2) if setting == "cudask-ipc" else (received == 0), (
                setting,
                r["ipc"],
            )
        assert case["cold"]["all_to_all_s"] > 0 and case["warm"]["all_to_all_s"] > 0, case
    assert (tmp_path / "transfer-cudask-ipc-r0" / "worker-0.log").exists()
    assert (tmp_path / "transfer-cudask-ipc-r1" / "worker-0.log").exists()
    assert f"round 0: {', '.join(names)}" in result.output.splitlines()
