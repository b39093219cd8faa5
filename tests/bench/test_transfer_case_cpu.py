"""cudask_bench.transfer_case on CPU: a plan and a setting survive the trip to the
case's runner as JSON; a case whose workers cannot start comes back as its error, with
the runner, its workers and its temporary directory gone. The measured cases run on a
GPU in tests/bench/test_bench_gpu.py::test_transfer_tiny."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from cudask_bench import environment
from cudask_bench import transfer as transfer_run
from cudask_bench.transfer import Setting, TransferPlan
from cudask_bench.transfer_case import plan_from, run_case, setting_from

DASK_CUDA = Setting(
    "dask-cuda", "dask-cuda", "ucx", python="/opt/dc/bin/python", pythonpath=("/opt/dc",)
)


def _plan() -> TransferPlan:
    return TransferPlan(
        placement=("0", "0"),
        sizes=(1 << 20,),
        repeat=1,
        n=64,
        blocks=4,
        device_memory_limit="1GB",
        settings=transfer_run.settings(("tcp",), DASK_CUDA),
        pools=(None, "2GB"),
        rounds=2,
        warm_runs=3,
        shuffle_methods=("tasks",),
    )


def test_a_plan_and_its_settings_go_through_json_unchanged() -> None:
    import json

    plan = _plan()
    assert plan_from(json.loads(json.dumps(asdict(plan)))) == plan
    for setting in plan.settings:
        assert setting_from(json.loads(json.dumps(asdict(setting)))) == setting


def _runner_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("cudask-bench-run-*"))


@pytest.mark.skipif(
    environment.gpus().get("available", False), reason="a GPU is present: the case runs"
)
def test_a_case_that_cannot_start_its_workers_is_its_error_and_leaves_nothing() -> None:
    """No GPU here: the case's `cudask worker` processes exit, and the runner says so."""
    before, running = _runner_dirs(), {p.pid for p in psutil.Process().children(recursive=True)}
    plan = _plan()
    figures = run_case(plan.settings[0], plan, None, "-r0")
    assert set(figures) <= {"error", "log_tail", "traceback"}, figures  # no figures
    assert figures["error"].startswith("RuntimeError: cudask worker processes"), figures
    assert "run_setting" in figures["traceback"]  # where the runner failed comes back with it
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= running
    assert _runner_dirs() <= before
