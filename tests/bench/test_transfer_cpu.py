"""`cudask bench transfer` on CPU: the order of its cases rotated between rounds, cold
and warm per case across rounds, the targets, the summary, the plan the command builds
(pools, settings, rounds, budget) and the JSON it writes after each case. The cluster
runs are a stand-in (`run=`); tests/bench/test_bench_gpu.py::test_transfer_tiny runs
the real ones."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cudask_bench import environment, provenance
from cudask_bench import transfer as transfer_run
from cudask_bench.cli import bench
from cudask_bench.transfer import Case, Setting, TransferPlan, rotations
from cudask_bench.transfer_case import run_case
from cudask_bench.transfer_report import aggregate, ratio_spread, summary, targets

MiB = 1 << 20
SETTINGS = transfer_run.settings(("tcp", "ucx"), Setting("dask-cuda", "dask-cuda", "tcp"))


def _plan(**kwargs: Any) -> TransferPlan:
    defaults: dict[str, Any] = {
        "placement": ("0", "0"),
        "sizes": (64 * MiB, 2048 * MiB),
        "repeat": 1,
        "n": 1000,
        "blocks": 4,
        "device_memory_limit": "30GB",
    }
    return TransferPlan(**{**defaults, **kwargs})


def _result(a2a: float, warm: float, gbps: float) -> dict[str, Any]:
    p2p = {"cold": {"GBps": gbps, "task_s": 0.1, "bytes": 1}, "warm_median_GBps": 2 * gbps}
    return {
        "all_to_all": {"seconds": a2a, "sum_ok": True, "bytes": 8e6, "GBps": 8e6 / a2a / 1e9},
        "all_to_all_warm": {"seconds": warm, "sum_ok": True},
        "point_to_point": {str(64 * MiB): p2p, str(2048 * MiB): p2p},
        "ipc": {},
        "store": {},
    }


def test_each_round_starts_with_the_next_case() -> None:
    a, b, c = (Case(s) for s in SETTINGS[:3])
    assert rotations((a, b, c), 4) == [[a, b, c], [b, c, a], [c, a, b], [a, b, c]]
    assert rotations((), 2) == []


def test_every_case_runs_once_per_round_in_the_rotated_order() -> None:
    plan = _plan(settings=SETTINGS[:2], pools=(None, "40GB"), rounds=3)
    calls: list[str] = []
    reports: list[dict[str, Any]] = []

    def run(setting: Setting, plan: TransferPlan, pool: str | None, tag: str) -> dict[str, Any]:
        calls.append(Case(setting, pool).name + tag)
        if setting.name == "cudask-ipc-no-staging" and pool and tag == "-r1":
            raise RuntimeError("a worker did not start")
        return _result(1.0 + len(calls) / 100, 0.5, 100.0)

    report = transfer_run.run_transfer(plan, run=run, progress=reports.append)
    names = [
        "cudask-ipc",
        "cudask-ipc-no-staging",
        "cudask-ipc+pool-40GB",
        "cudask-ipc-no-staging+pool-40GB",
    ]
    assert report["order"] == [names, names[1:] + names[:1], names[2:] + names[:2]]
    assert calls[:4] == [f"{n}-r0" for n in names] and calls[4] == "cudask-ipc-no-staging-r1"
    assert len(calls) == 12 and len(reports) == 12  # the report rewritten after each case
    failed = report["settings"]["cudask-ipc-no-staging+pool-40GB"]
    assert failed["failed"] == 1 and len(failed["rounds"]) == 3
    assert [r["round"] for r in failed["rounds"]] == [0, 1, 2]
    assert "RuntimeError: a worker did not start" in failed["rounds"][1]["error"]
    assert len(failed["cold"]["all_to_all_s_each"]) == 2  # the two rounds that ran
    first = report["settings"]["cudask-ipc"]
    assert first["cold"]["all_to_all_s_each"] == [
        1.01,
        1.08,
        1.11,
    ]  # its place in each round: 1st, 4th, 3rd
    assert first["cold"]["all_to_all_s"] == 1.08 and first["warm"]["all_to_all_s"] == 0.5
    assert first["warm"]["point_to_point_GBps"] == {str(64 * MiB): 200.0, str(2048 * MiB): 200.0}
    json.dumps(report)  # written as JSON as it is


def test_cases_past_the_budget_are_skipped() -> None:
    def slow(*args: Any) -> dict[str, Any]:
        time.sleep(0.3)
        return _result(1.0, 1.0, 1.0)

    tcp = next(s for s in SETTINGS if s.name == "cudask-tcp")
    plan = _plan(settings=(*SETTINGS[:2], tcp), rounds=1, budget_s=0.2)
    report = transfer_run.run_transfer(plan, run=slow)
    runs = [case["rounds"][0] for case in report["settings"].values()]
    assert "all_to_all" in runs[0] and all("past the budget" in r["skipped"] for r in runs[1:])
    assert report["settings"]["cudask-tcp"]["cold"]["all_to_all_s"] is None


def _case(cold: float, warm: float, gbps: float) -> dict[str, Any]:
    return {
        "rounds": [{"round": 0, **_result(cold, warm, gbps)}],
        **aggregate([_result(cold, warm, gbps)]),
    }


def test_targets_against_ucx() -> None:
    settings = {"cudask-ipc": _case(0.30, 0.20, 300.0), "dask-cuda-ucx": _case(0.24, 0.25, 250.0)}
    found = {t["target"]: t["met"] for t in targets(settings, (None,))}
    assert found == {
        "all-to-all cold, no pool: cudask-ipc s <= dask-cuda-ucx": False,
        "all-to-all warm, no pool: cudask-ipc s <= dask-cuda-ucx": True,
        "point to point 2048 MiB cold, no pool: cudask-ipc GB/s >= dask-cuda-ucx": True,
        "point to point 2048 MiB warm, no pool: cudask-ipc GB/s >= dask-cuda-ucx": True,
    }
    # a pool variant whose dask-cuda run failed: its targets are there, not measured
    settings["cudask-ipc+pool-40GB"] = _case(0.1, 0.1, 1.0)
    settings["dask-cuda-ucx+pool-40GB"] = {
        "rounds": [{"round": 0, "error": "x"}],
        **aggregate([{"error": "x"}]),
    }
    pooled = [t for t in targets(settings, (None, "40GB")) if "pool 40GB" in t["target"]]
    assert len(pooled) == 4 and all(t["met"] is None for t in pooled)


def test_summary_shows_cold_and_warm_per_case_and_each_target() -> None:
    plan = _plan(settings=(SETTINGS[0], SETTINGS[-1]), rounds=2)
    # in the order they run: cudask-ipc, dask-cuda-ucx, then dask-cuda-ucx, cudask-ipc
    values = iter([(0.5, 0.2, 300.0), (0.3, 0.25, 250.0), (0.4, 0.25, 250.0), (0.3, 0.2, 300.0)])
    report = transfer_run.run_transfer(plan, run=lambda *args: _result(*next(values)))
    lines = summary(report)
    assert lines[:2] == ["round 0: cudask-ipc, dask-cuda-ucx", "round 1: dask-cuda-ucx, cudask-ipc"]
    assert (
        f"{'cudask-ipc':34} all-to-all 0.0 GB: cold 0.40 s (0.50, 0.30), warm 0.20 s (0.20, 0.20), "
        "sum ok: True"
    ) in lines
    assert f"{'cudask-ipc':34}    2048 MiB  cold   300.0 GB/s  warm   600.0 GB/s" in lines
    cold = next(line for line in lines if line.startswith("target NOT MET: all-to-all cold"))
    assert cold.startswith(
        "target NOT MET: all-to-all cold, no pool: cudask-ipc s <= dask-cuda-ucx: 0.4 "
        "against 0.35 (1.14x; 90% of resampled rounds "
    )
    assert cold.endswith(": within the rounds' spread)")  # 0.5 and 0.3 against 0.3 and 0.4
    assert (
        "target met: all-to-all warm, no pool: cudask-ipc s <= dask-cuda-ucx: 0.2 against 0.25 "
        "(0.80x; 90% of resampled rounds 0.80-0.80x: clear of the threshold)"
    ) in lines
    assert lines[-1] == "targets met: 3 of 4; 1 of the 4 verdicts within the rounds' spread"


def test_a_ratio_s_spread_across_rounds() -> None:
    """The middle 90% of the ratio of medians with each side's rounds drawn again: the
    same for the same rounds, none without two positive rounds a side, narrow for rounds
    that agree, and around the ratio of medians."""
    assert ratio_spread([1.0], [1.0, 2.0]) is None and ratio_spread([1.0, 2.0], [0.0, 1.0]) is None
    assert ratio_spread([0.2, 0.2, 0.2], [0.25, 0.25]) == [pytest.approx(0.8), pytest.approx(0.8)]
    mine, theirs = [0.10, 0.12, 0.11, 0.13, 0.09], [0.11, 0.10, 0.12, 0.12, 0.11]
    spread = ratio_spread(mine, theirs)
    assert spread == ratio_spread(mine, theirs)  # a fixed seed: the same report each time
    assert spread is not None and spread[0] < 0.11 / 0.11 < spread[1]
    assert spread[1] - spread[0] < 0.13 / 0.10 - 0.09 / 0.12  # not the extremes: the middle 90%
    assert ratio_spread(mine, [v * 2 for v in theirs]) == [pytest.approx(v / 2) for v in spread]


def test_a_verdict_within_the_rounds_spread_is_marked() -> None:
    """Met or missed, a target whose resampled ratios cross its threshold is marked
    not clear; one whose ratios all lie on its verdict's side is clear."""

    def case(cold: list[float], warm: list[float], gbps: list[float]) -> dict[str, Any]:
        rounds = [
            {"round": i, **_result(c, w, g)} for i, (c, w, g) in enumerate(zip(cold, warm, gbps))
        ]
        return {"rounds": rounds, **aggregate(rounds)}

    settings = {
        "cudask-ipc": case(
            [0.10, 0.12, 0.11, 0.13, 0.09],
            [0.1, 0.1, 0.1, 0.1, 0.1],
            [300.0, 310.0, 290.0, 305.0, 295.0],
        ),
        "dask-cuda-ucx": case(
            [0.11, 0.10, 0.12, 0.12, 0.11],
            [0.5, 0.6, 0.55, 0.5, 0.6],
            [600.0, 610.0, 590.0, 605.0, 595.0],
        ),
    }
    found = {t["target"].split(",")[0]: t for t in targets(settings, (None,))}
    assert found["all-to-all cold"]["met"] is True and found["all-to-all cold"]["clear"] is False
    assert found["all-to-all warm"]["met"] is True and found["all-to-all warm"]["clear"] is True
    p2p = found["point to point 2048 MiB cold"]  # about half of UCX's GB/s: clearly missed
    assert p2p["met"] is False and p2p["clear"] is True and p2p["ratio_spread"][1] < 1
    settings["dask-cuda-ucx"] = case(
        [0.11, 0.10, 0.12, 0.12, 0.11],
        [0.5, 0.6, 0.55, 0.5, 0.6],
        [300.0, 280.0, 320.0, 295.0, 310.0],
    )
    p2p = next(
        t
        for t in targets(settings, (None,))
        if t["target"].startswith("point to point 2048 MiB cold")
    )
    assert p2p["met"] is True and p2p["clear"] is False  # level GB/s: met, within the spread
    settings["dask-cuda-ucx"] = case([0.2], [0.2], [1.0])  # one round: no spread
    assert all(
        t["ratio_spread"] is None and t["clear"] is None
        for t in targets(settings, (None,))
        if "ucx" in t["target"]
    )


def test_provenance_marks_the_cold_and_warm_figures() -> None:
    report = transfer_run.run_transfer(
        _plan(settings=SETTINGS[:1], rounds=2), run=lambda *args: _result(1.0, 0.5, 1.0)
    )
    modes = provenance.figure_modes({"workload": "transfer", "report": report})
    assert modes == {"settings.cudask-ipc.cold": "cold", "settings.cudask-ipc.warm": "warm"}


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> list[TransferPlan]:
    """The command up to its plan, on a machine of two GPUs; each case returns fixed figures."""
    plans: list[TransferPlan] = []
    monkeypatch.setattr(
        environment, "gpus", lambda: {"available": True, "devices": [{"index": 0}, {"index": 1}]}
    )
    monkeypatch.setattr(environment, "has_module", lambda name: name != "distributed_ucxx")
    real = transfer_run.run_transfer

    def run_transfer(plan: TransferPlan, **kwargs: Any) -> dict[str, Any]:
        assert kwargs.pop("run") is run_case  # the command runs each case in a process of its own
        plans.append(plan)
        return real(plan, run=lambda *args: _result(1.0, 0.5, 10.0), **kwargs)

    monkeypatch.setattr(transfer_run, "run_transfer", run_transfer)
    return plans


def test_the_command_s_plan_and_its_json(no_runs: list[TransferPlan], tmp_path: Path) -> None:
    out = tmp_path / "transfer.json"
    result = CliRunner().invoke(
        bench,
        [
            "transfer",
            "--shuffle-rows",
            "0",
            "--rmm-pool-size",
            "none, 40GB",
            "--settings",
            "cudask-ipc,cudask-tcp",
            "--rounds",
            "3",
            "--budget",
            "500",
            "--warm-runs",
            "3",
            "--output",
            str(out),
        ],
        prog_name="cudask bench",
    )
    assert result.exit_code == 0, result.output
    (plan,) = no_runs
    assert plan.pools == (None, "40GB") and plan.rounds == 3 and plan.budget_s == 500
    assert plan.warm_runs == 3
    assert [s.name for s in plan.settings] == ["cudask-ipc", "cudask-tcp"]  # auto: no UCX here
    document = json.loads(out.read_text())
    assert document["provenance"]["source"] and document["machine"]
    assert list(document["report"]["settings"]) == [
        "cudask-ipc",
        "cudask-tcp",
        "cudask-ipc+pool-40GB",
        "cudask-tcp+pool-40GB",
    ]
    assert all(len(c["rounds"]) == 3 for c in document["report"]["settings"].values())
    assert (
        "round 2: cudask-ipc+pool-40GB, cudask-tcp+pool-40GB, cudask-ipc, cudask-tcp"
        in result.output
    )


def test_auto_protocols_add_ucx_where_it_is_installed(
    no_runs: list[TransferPlan], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(environment, "has_module", lambda name: True)
    result = CliRunner().invoke(
        bench, ["transfer", "--shuffle-rows", "0", "--rounds", "1"], prog_name="cudask bench"
    )
    assert result.exit_code == 0, result.output
    assert [s.name for s in no_runs[0].settings] == [
        "cudask-ipc",
        "cudask-ipc-no-staging",
        "cudask-ipc-gc-freeze",
        "cudask-ipc-spill-ahead",
        "cudask-ipc-no-on-demand",
        "cudask-tcp",
        "cudask-ucx",
    ]


def test_warmup_runs_first_and_stays_out_of_the_figures() -> None:
    plan = _plan(settings=SETTINGS[:2], rounds=2, warmup=1)
    calls: list[str] = []

    def run(setting: Setting, plan: TransferPlan, pool: str | None, tag: str) -> dict[str, Any]:
        calls.append(Case(setting, pool).name + tag)
        return _result(9.0 if tag.startswith("-warmup") else 1.0, 0.5, 100.0)

    report = transfer_run.run_transfer(plan, run=run)
    assert calls == [
        "cudask-ipc-warmup0",
        "cudask-ipc-r0",
        "cudask-ipc-no-staging-r0",
        "cudask-ipc-no-staging-r1",
        "cudask-ipc-r1",
    ]
    assert [w["case"] for w in report["warmup"]] == ["cudask-ipc"]
    assert report["warmup"][0]["all_to_all"]["seconds"] == 9.0
    first = report["settings"]["cudask-ipc"]
    assert len(first["rounds"]) == 2 and first["cold"]["all_to_all_s_each"] == [1.0, 1.0]
    assert summary(report)[0] == "warm-up (left out): cudask-ipc, all-to-all 9.00 s"


def test_rounds_that_spilled_are_named() -> None:
    """A round whose workers moved device memory to host is listed, and the summary says so;
    a round whose workers pinned host memory ahead of spills is listed too."""
    quiet = {**_result(0.2, 0.2, 300.0), "round": 0, "store": {"w1": {}, "w2": {}}}
    spilled = {
        **_result(0.6, 0.2, 300.0),
        "round": 1,
        "store": {"w1": {"spill-device-to-host-bytes": 1.6e9}, "w2": {}},
    }
    failed = {"round": 2, "error": "boom", "store": {"w1": {"spill-device-to-host-bytes": 1.0}}}
    rounds = [quiet, spilled, failed]
    case = {"rounds": rounds, **aggregate(rounds)}
    assert case["spilled_rounds"] == [1]
    lines = summary({"settings": {"cudask-ipc": case}})
    assert (
        f"{'cudask-ipc':34} spilled device memory to host in 1 of 2 measured rounds "
        "(round 1; the first is 0)"
    ) in lines
    assert aggregate([quiet])["spilled_rounds"] == []
    assert aggregate([{k: v for k, v in quiet.items() if k != "store"}])["spilled_rounds"] == []
    pinned = {
        **_result(0.12, 0.13, 300.0),
        "round": 1,
        "store": {"w1": {"pinned-provision-bytes": 2e9}, "w2": {}},
    }
    assert aggregate([quiet, pinned])["pinned_ahead_rounds"] == [1]
    assert case["pinned_ahead_rounds"] == []


def test_the_warm_figure_is_the_run_of_the_median_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four warm runs: the figure is the lower middle one, a run that happened; every
    run's time is kept, and one wrong sum marks the figure wrong."""
    times = iter([0.30, 0.10, 0.20, 0.40])
    sums = iter([True, True, True, False])

    def one_run(client: Any, n: int, blocks: int) -> dict[str, Any]:
        return {"n": n, "blocks": blocks, "seconds": next(times), "sum_ok": next(sums)}

    monkeypatch.setattr(transfer_run, "all_to_all", one_run)
    warm = transfer_run.warm_all_to_all(None, _plan(settings=SETTINGS[:1], warm_runs=4))
    assert warm["seconds"] == 0.20 and warm["seconds_each"] == [0.30, 0.10, 0.20, 0.40]
    assert warm["sum_ok"] is False
    assert aggregate([{**_result(1.0, 0.5, 10.0), "all_to_all_warm": warm}])["sum_ok"] is False


def test_warm_runs_below_one_are_refused() -> None:
    """The option and the plan both refuse fewer than one warm run."""
    result = CliRunner().invoke(bench, ["transfer", "--warm-runs", "0"], prog_name="cudask bench")
    assert (
        result.exit_code == 2
        and "--warm-runs" in result.output
        and "Traceback" not in result.output
    )
    with pytest.raises(ValueError, match="warm_runs=0"):
        _plan(settings=SETTINGS[:1], warm_runs=0)


def test_what_the_workers_did_in_a_run_comes_from_the_task_stream() -> None:
    """Spans clipped to the run's window, summed per action; the waits before the first
    span and after the last, and the span between them; a run with no span has none."""
    from cudask_bench.counters import stream_figures

    records = [
        {
            "key": "a",
            "startstops": [
                {"action": "transfer", "start": 99.0, "stop": 100.5},
                {"action": "compute", "start": 100.5, "stop": 101.0},
            ],
        },
        {
            "key": "b",
            "startstops": [
                {"action": "compute", "start": 101.0, "stop": 102.0},
                {"action": "compute", "start": 104.0, "stop": 105.0},
            ],
        },
    ]
    figures = stream_figures(records, 100.0, 103.0)
    assert figures == {
        "tasks": 2.0,
        "transfer_s": 0.5,
        "compute_s": 1.5,
        "before_first_s": 0.0,
        "busy_s": 2.0,
        "after_last_s": 1.0,
    }
    assert stream_figures([], 100.0, 103.0) == {
        "tasks": 0.0,
        "before_first_s": 0.0,
        "busy_s": 0.0,
        "after_last_s": 0.0,
    }
    records.append(
        {
            "key": ["rechunk-merge", 0, 1],  # a tuple key as it may arrive: a list
            "startstops": [{"action": "compute", "start": 102.0, "stop": 102.5}],
        }
    )
    own = stream_figures(records, 100.0, 103.0, {"b", ("rechunk-merge", 0, 1)})
    assert own == {
        "tasks": 2.0,
        "compute_s": 1.5,
        "before_first_s": 1.0,
        "busy_s": 1.5,
        "after_last_s": 0.5,
    }  # "a" is not the run's: left out


def test_the_workers_span_and_the_waits_are_folded_and_shown() -> None:
    """Each run's task-stream figures: medians per case and mode, and one summary line;
    results without them (older files) fold and print as before."""

    def with_stream(busy: float, wait: float) -> dict[str, Any]:
        r = _result(1.0, 0.5, 10.0)
        for key in ("all_to_all", "all_to_all_warm"):
            r[key] = {
                **r[key],
                "workers": {
                    "tasks": 16.0,
                    "before_first_s": wait,
                    "busy_s": busy,
                    "after_last_s": 0.0,
                },
            }
        return r

    case = aggregate([with_stream(0.08, 0.02), with_stream(0.10, 0.04), with_stream(0.09, 0.03)])
    assert case["cold"]["all_to_all_busy_s"] == 0.09 and case["warm"]["all_to_all_wait_s"] == 0.03
    assert aggregate([_result(1.0, 0.5, 10.0)])["cold"]["all_to_all_busy_s"] is None
    lines = summary({"settings": {"cudask-ipc": {**case, "rounds": []}}})
    assert any(
        "workers' span: cold 0.09 s, warm 0.09 s; waiting before and after it: cold 0.03 s" in line
        for line in lines
    ), lines


def test_the_blocks_and_memory_held_after_the_cold_run_are_shown_per_round() -> None:
    """Per round, the summary gives each worker's row and column blocks after the cold
    all-to-all, the most device memory one held and whether one had spilled by then."""

    def held(
        rows: tuple[int, int], cols: tuple[int, int], most: float, spilled: float
    ) -> dict[str, Any]:
        return {
            "w1": {
                "row-blocks": rows[0],
                "column-blocks": cols[0],
                "device-bytes": most,
                "spill-device-to-host-bytes": spilled,
            },
            "w2": {"row-blocks": rows[1], "column-blocks": cols[1], "device-bytes": 12.8e9},
        }

    even, uneven = _result(0.12, 0.12, 300.0), _result(0.5, 0.12, 300.0)
    even["all_to_all"] = {**even["all_to_all"], "held": held((4, 4), (4, 4), 12.8e9, 0.0)}
    uneven["all_to_all"] = {**uneven["all_to_all"], "held": held((6, 2), (5, 3), 24.1e9, 1.6e9)}
    rounds = [{**even, "round": 0}, {**uneven, "round": 1}, {**_result(0.1, 0.1, 1.0), "round": 2}]
    lines = summary({"settings": {"cudask-ipc": {"rounds": rounds, **aggregate(rounds)}}})
    assert (
        f"{'cudask-ipc':34} after the cold all-to-all, per round: row blocks per worker, "
        "column blocks per worker, the most device memory a worker held: round 0 4+4 and 4+4, 12.8 GB; "
        "round 1 6+2 and 5+3, 24.1 GB, spilled"
    ) in lines, lines
    plain = [{**_result(0.1, 0.1, 1.0), "round": 0}]
    assert not any(
        "after the cold all-to-all" in line
        for line in summary({"settings": {"c": {"rounds": plain, **aggregate(plain)}}})
    )


def test_the_rechunk_plan_each_run_used_is_shown_once_per_kind() -> None:
    """The summary names dask's rechunk threshold and chunk size and the rechunk's task
    count, once for each different plan the runs used; files without them print no such
    line."""

    def planned(threshold: int, tasks: int) -> dict[str, Any]:
        r = _result(0.1, 0.1, 1.0)
        r["all_to_all"] = {
            **r["all_to_all"],
            "rechunk": {"threshold": threshold, "tasks": tasks, "chunk_size": "128MiB"},
        }
        return r

    rounds = [
        {**planned(4, 48), "round": 0},
        {**planned(4, 48), "round": 1},
        {**planned(8, 64), "round": 2},
    ]
    lines = summary({"settings": {"cudask-ipc": {"rounds": rounds, **aggregate(rounds)}}})
    assert [line for line in lines if line.startswith("all-to-all rechunk")] == [
        "all-to-all rechunk: array.rechunk.threshold 4, array.chunk-size 128MiB, 48 tasks",
        "all-to-all rechunk: array.rechunk.threshold 8, array.chunk-size 128MiB, 64 tasks",
    ]
    plain = [{**_result(0.1, 0.1, 1.0), "round": 0}]
    assert not any(
        line.startswith("all-to-all rechunk")
        for line in summary({"settings": {"c": {"rounds": plain, **aggregate(plain)}}})
    )


def test_the_receivers_copy_rate_is_given_per_round() -> None:
    """Per round, by its number, the bytes every worker received by CUDA IPC over the
    seconds their copies took; rounds without IPC receives (dask-cuda, TCP) give none."""

    def received(*workers: tuple[float, float]) -> dict[str, Any]:
        r = _result(0.1, 0.1, 1.0)
        r["ipc"] = {
            f"w{i}": {"received-bytes": b, "receive-copy-seconds": s}
            for i, (b, s) in enumerate(workers)
        }
        return r

    rounds = [
        {**received((30e9, 0.1), (20e9, 0.1)), "round": 0},
        {**received((30e9, 0.1), (0.0, 0.0)), "round": 1},
        {**_result(0.1, 0.1, 1.0), "round": 2},
    ]
    rounds = [rounds[2] | {"round": 0}, rounds[0] | {"round": 1}, rounds[1] | {"round": 2}]
    case = aggregate(rounds)
    assert case["receive_copy_GBps"] == [{"round": 1, "GBps": 250.0}, {"round": 2, "GBps": 300.0}]
    lines = summary({"settings": {"cudask-ipc": {"rounds": rounds, **case}}})
    assert (
        f"{'cudask-ipc':34} received by CUDA IPC in the case, bytes over the receivers' summed copy "
        "seconds: round 1 250, round 2 300 GB/s"
    ) in lines, lines
    plain = [{**_result(0.1, 0.1, 1.0), "round": 0}]
    assert not any(
        "received by CUDA IPC" in line
        for line in summary({"settings": {"c": {"rounds": plain, **aggregate(plain)}}})
    )


def test_point_to_point_submit_to_result_is_folded_and_shown() -> None:
    """Beside each point-to-point bandwidth, the seconds from submitting the reading task
    to its result: the cold run's, and the median of the warm runs', per round, then the
    median across rounds."""

    def timed(task_s: list[float]) -> dict[str, Any]:
        r = _result(0.1, 0.1, 100.0)
        p2p = {
            "cold": {"GBps": 100.0, "task_s": task_s[0], "bytes": 1},
            "warm_median_GBps": 200.0,
            "runs": [{"GBps": 100.0, "task_s": t, "bytes": 1} for t in task_s],
        }
        r["point_to_point"] = {str(2048 * MiB): p2p}
        return r

    rounds = [
        {**timed([0.020, 0.012, 0.016, 0.013]), "round": 0},
        {**timed([0.030, 0.011, 0.010, 0.019]), "round": 1},
        {**timed([0.025, 0.014, 0.014, 0.014]), "round": 2},
    ]
    case = aggregate(rounds)
    key = str(2048 * MiB)
    assert case["cold"]["point_to_point_task_s_each"] == {key: [0.020, 0.030, 0.025]}
    assert case["warm"]["point_to_point_task_s_each"] == {key: [0.013, 0.011, 0.014]}
    assert case["cold"]["point_to_point_task_s"] == {key: 0.025}
    assert case["warm"]["point_to_point_task_s"] == {key: 0.013}
    lines = summary({"settings": {"cudask-ipc": {"rounds": rounds, **case}}})
    assert (
        f"{'cudask-ipc':34}    2048 MiB  cold   100.0 GB/s  warm   200.0 GB/s; submit to result: "
        "cold 25.0 ms, warm 13.0 ms"
    ) in lines, lines
    # a run without its time counts as no figure: the cold one stays the cold one
    gap = timed([0.020, 0.012, 0.016, 0.013])
    gap["point_to_point"][key]["cold"].pop("task_s")
    gap["point_to_point"][key]["runs"][0].pop("task_s")
    case = aggregate([{**gap, "round": 0}])
    assert case["cold"]["point_to_point_task_s_each"] == {key: []}
    assert case["warm"]["point_to_point_task_s_each"] == {key: [0.013]}
