"""`cudask bench small-tasks` without a GPU: the measurements on a plain distributed
cluster with NumPy chunks, the report's checks of the settings' results, and the
command's one-line errors."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster

from cudask.cli.main import cli
from cudask.testing import real_gpu_count
from cudask_bench import small_tasks as st

PLAN = st.SmallTasksPlan(settings=(1, 2), tasks=200, chunks=24, chunk_size=1 << 12, repeat=1)


def test_measure_gives_the_expected_sums() -> None:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        figures = st.measure(client, PLAN, module="numpy")
    want = st.expected(PLAN)
    assert figures["tiny"]["result"] == {"tiny": want["tiny"], "same_every_run": True}
    assert figures["chunks"]["result"] == {
        "chunks_sum": want["chunks_sum"],
        "chunks_diff": want["chunks_diff"],
        "same_every_run": True,
    }
    assert figures["tiny"]["tasks"] == 200 and figures["chunks"]["tasks"] > PLAN.chunks
    assert len(figures["tiny"]["times_s"]) == 2 and figures["tiny"]["warm_tasks_per_s"] > 0


def _row(n: int, rate: float, **result: Any) -> dict[str, Any]:
    want = st.expected(PLAN)
    tiny = {"tiny": want["tiny"], "same_every_run": True}
    chunks = {
        "chunks_sum": want["chunks_sum"],
        "chunks_diff": want["chunks_diff"],
        "same_every_run": True,
        **result,
    }
    figures = {
        "tasks": 100,
        "cold_s": 2.0,
        "warm_s": 100 / rate,
        "times_s": [2.0, 100 / rate],
        "warm_tasks_per_s": rate,
    }
    return {
        "workers_per_gpu": n,
        "workers": [],
        "tiny": {**figures, "result": tiny},
        "chunks": {**figures, "result": chunks},
    }


def test_report_checks_results_and_speedups(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {1: _row(1, 100.0), 2: _row(2, 250.0)}
    monkeypatch.setattr(st, "_child", lambda plan, n: rows[n])
    report = st.run_plan(PLAN)
    assert report["identical"] and [r["correct"] for r in report["settings"]] == [True, True]
    assert report["settings"][1]["tiny"]["speedup"] == pytest.approx(2.5)
    text = "\n".join(st.summary(report))
    assert "results identical in every setting: yes" in text and " 2.50 " in text
    rows[2] = _row(2, 250.0, chunks_sum=1)
    assert not st.run_plan(PLAN)["identical"]
    rows[2] = {"workers_per_gpu": 2, "error": "boom"}
    said: list[str] = []
    report = st.run_plan(PLAN, progress=said.append)
    assert not report["identical"] and "failed: boom" in "\n".join(st.summary(report))
    assert [line.rsplit(" in ", 1)[0] for line in said] == [
        "small-tasks: 1 worker(s) per GPU done",
        "small-tasks: 2 worker(s) per GPU failed",
    ]


@pytest.mark.parametrize(
    "args, said",
    [
        (["--workers-per-gpu", "1,0"], "'1,0'; accepted: distinct whole numbers"),
        (["--workers-per-gpu", "2,2"], "'2,2'; accepted: distinct whole numbers"),
        (["--chunk-size", "12"], "'12'; accepted: a size of at least 8 bytes, a multiple of 8"),
        (["--gpus", "0,,1"], "CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"),
    ],
)
def test_bad_input_is_one_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, ["bench", "small-tasks", *args])
    assert result.exit_code in (1, 2) and said in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(real_gpu_count() > 0, reason="this machine has a GPU")
def test_no_gpu_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["bench", "small-tasks"])
    assert result.exit_code == 1 and "no NVIDIA GPU found" in result.output, result.output
