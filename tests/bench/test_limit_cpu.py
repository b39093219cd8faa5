"""`cudask bench limit` without a GPU: the phases on a plain distributed cluster with
NumPy chunks and a fake memory reader, the sampler's peaks per phase, the plan's
rotation of backends, the report's checks and lines, the provenance of its figures,
and the command's one-line errors."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster

from cudask.cli.main import cli
from cudask.testing import real_gpu_count, wait_for
from cudask_bench import limit as lim
from cudask_bench.gpu_memory import MemorySampler
from cudask_bench.provenance import figure_modes

PLAN = lim.LimitPlan(
    backends=("cudask", "dask-cuda"),
    rounds=2,
    device_memory_limit=1000,
    chunks=6,
    chunk_size=1 << 12,
    temporary=1 << 14,
    warm_runs=1,
    interval=0.001,
)


def test_sampler_keeps_the_peak_of_each_phase() -> None:
    value = [100]
    lock = threading.Lock()

    def read() -> int:
        with lock:
            return value[0]

    with MemorySampler(read, interval=0.001) as sampler:
        with sampler.phase("a"):
            with lock:
                value[0] = 500
            seen = sampler.samples
            assert wait_for(lambda: sampler.samples >= seen + 2)  # the thread read 500
            with lock:
                value[0] = 200
        with sampler.phase("b"):
            pass
    assert sampler.peaks == {"a": 500, "b": 200} and sampler.samples >= 4
    with pytest.raises(ValueError, match="interval=0"):
        MemorySampler(read, interval=0)


def test_expected_sums_and_working_sets() -> None:
    import numpy

    n = PLAN.chunks * (PLAN.chunk_size // 8)
    values = numpy.arange(n, dtype="int64") % 1000
    assert lim.expected(PLAN) == {"sum": int(values.sum()), "tasks": int(values.sum()) + n}
    ws = lim.working_sets(PLAN)
    assert ws == {"persist": 1 << 12, "sum": 1 << 12, "tasks": 2 * (1 << 12) + (1 << 14)}


def test_measure_gives_right_sums_and_peaks_above_idle() -> None:
    readings = iter(range(10**6))
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        MemorySampler(lambda: 10**6 + next(readings), interval=0.001) as sampler,
    ):
        figures = lim.measure(client, PLAN, sampler, module="numpy")
    assert figures["correct"], figures["results"]
    assert figures["results"] == [lim.expected(PLAN)] * 2  # cold and one warm run
    for phase in lim.PHASES:
        f = figures["phases"][phase]
        assert f["cold_s"] > 0 and f["warm_s"] > 0 and f["peak_bytes"] > 0
        assert f["bound_bytes"] == 1000 + lim.working_sets(PLAN)[phase]
        # the reader grows by one each call: the peaks are far below the bounds
        assert f["within"] is (
            max(f["peak_bytes"], f["warm_peak_bytes"]) <= lim.SLACK * f["bound_bytes"]
        )


def _row(backend: str, peak: int = 900, **result: Any) -> dict[str, Any]:
    phase = {
        "cold_s": 1.5,
        "warm_s": 1.0,
        "peak_bytes": peak,
        "warm_peak_bytes": peak,
        "bound_bytes": 1000,
        "within": peak <= 1100,
    }
    want = lim.expected(PLAN)
    return {
        "backend": backend,
        "idle_bytes": 7,
        "phases": dict.fromkeys(lim.PHASES, phase),
        "results": [{**want, **result}],
        "correct": not result,
    }


def test_plan_rotates_backends_and_checks_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    rows = {"cudask": _row("cudask"), "dask-cuda": _row("dask-cuda", peak=5000)}

    def child(plan: lim.LimitPlan, backend: str) -> dict[str, Any]:
        calls.append(backend)
        return rows[backend]

    monkeypatch.setattr(lim, "_child", child)
    report = lim.run_plan(PLAN)
    assert calls == ["cudask", "dask-cuda", "dask-cuda", "cudask"]
    assert report["correct"] and report["within"]  # dask-cuda's peaks are not held to it
    text = "\n".join(lim.summary(report))
    assert "cudask within 1.10x the bound in every phase: yes" in text
    rows["cudask"] = _row("cudask", peak=2000)
    report = lim.run_plan(PLAN)
    assert not report["within"] and "NO (marked !)" in "\n".join(lim.summary(report))
    rows["cudask"] = _row("cudask", sum=1)
    assert not lim.run_plan(PLAN)["correct"]
    rows["cudask"] = {"backend": "cudask", "error": "boom"}
    report = lim.run_plan(PLAN)
    assert not report["correct"] and "failed: boom" in "\n".join(lim.summary(report))


def test_provenance_names_cold_and_warm_figures() -> None:
    document = {"workload": "limit", "report": {"runs": [_row("cudask")]}}
    modes = figure_modes(document)
    assert modes["runs.0.phases.tasks.cold_s"] == "cold"
    assert modes["runs.0.phases.tasks.warm_peak_bytes"] == "warm"
    assert len(modes) == 4 * len(lim.PHASES)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--chunk-size", "12"], "'12'; accepted: a size of at least 8 bytes, a multiple of 8"),
        (["--data", "1MiB"], "'1MiB' is less than one chunk"),
        (["--device-memory-limit", "lots"], "'lots'; accepted: a size of at least 1 bytes"),
        (["--gpu", "0,,1"], "CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"),
    ],
)
def test_bad_input_is_one_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, ["bench", "limit", *args])
    assert result.exit_code in (1, 2) and said in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(real_gpu_count() > 0, reason="this machine has a GPU")
def test_no_gpu_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["bench", "limit"])
    assert result.exit_code == 1 and "no NVIDIA GPU found" in result.output, result.output
