"""`cudask bench etl` without a GPU: pandas frames on distributed's LocalCluster stand in
for cuDF. The reference answers against pandas on the whole data, the check that finds
wrong answers, the settings' rotation, the document and its table, a failing setting's
error, the sampler's peaks, dask-cuda's settings skipped when it is absent, the command's
one-line errors, and an interrupt that stops the children and removes the data."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas
import psutil
import pytest
from click.testing import CliRunner

from cudask.cli.main import cli
from cudask.errors import MissingDependencyError
from cudask_bench import environment, etl, etl_data, etl_phases, etl_sampler, working_set
from cudask_bench.cli.etl import resolve_targets
from cudask_bench.targets import Target

SMALL = etl_data.EtlPlan(
    settings=("floor", "cudask"),
    formats=("csv", "parquet"),
    files=3,
    rows_per_file=4000,
    device_memory_limit=1000,
    frames="pandas",
    keys=500,
    categories=7,
    warm_runs=1,
    timeout=300.0,
)


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("etl-data")
    return root, etl_data.prepare(SMALL, str(root))


def test_reference_is_pandas_on_the_whole_data(data: tuple[Path, dict[str, Any]]) -> None:
    root, prepared = data
    for fmt in SMALL.formats:
        read = pandas.read_csv if fmt == "csv" else pandas.read_parquet
        fact = pandas.concat([read(p) for p in etl_data.fact_files(str(root), fmt)])
        dim = read(etl_data.dim_file(str(root), fmt))
        want = prepared["formats"][fmt]["reference"]
        assert want["rows"] == len(fact) == SMALL.rows
        assert want["groups"] == fact["key"].nunique()
        keys = etl_data.sample_keys(SMALL.keys)
        sample = (
            fact[fact["key"].isin(keys)].groupby("key").agg({"x": "sum", "y": "sum", "v": "count"})
        )
        assert (
            len(sample) > 10
            and etl_data.compare(want, {**want, "sample": etl_data.sample_answer(sample)}) == []
        )
        merged = (
            fact.merge(dim, on="key").groupby("cat").agg({"x": "sum", "w": "sum", "y": "count"})
        )
        assert (
            etl_data.compare(want, {**want, "by_category": etl_data.category_answer(merged)}) == []
        )
        means = fact.mean()
        assert all(
            abs(want["means"][c] - means[c]) <= 1e-9 * abs(means[c]) for c in etl_data.FACT_DTYPES
        )
    assert prepared["generator"] == "pandas" and prepared["formats"]["csv"]["fact_files"] == 3


def test_compare_names_every_wrong_answer(data: tuple[Path, dict[str, Any]]) -> None:
    want = data[1]["formats"]["parquet"]["reference"]
    assert etl_data.compare(want, copy.deepcopy(want)) == []
    got = copy.deepcopy(want)
    got["groups"] += 1
    key = next(iter(got["sample"]))
    got["sample"][key]["x"] *= 1 + 1e-6
    got["by_category"].pop("3")
    got["means"]["v"] = None
    wrong = etl_data.compare(want, got)
    assert wrong[0] == f"groups: {want['groups'] + 1} != {want['groups']}"
    assert wrong[1].startswith(f"sample[{key}]: x ") and wrong[2].startswith("by_category[3]: None")
    assert wrong[3].startswith("means[v]: None != ")
    assert etl_data.compare(want, {"groups": want["groups"]})[0] == "sample: missing"


def test_rotation_moves_each_repetition_one_place() -> None:
    assert etl.rotation(("a", "b", "c"), 4) == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert etl.rotation((), 2) == []


def test_plan_round_trips_as_json() -> None:
    plan = etl_data.EtlPlan(settings=("floor",), skipped={"dask-cuda": "absent"})
    assert etl_data.EtlPlan.from_json(plan.to_json()) == plan


def test_sampler_peaks_per_window() -> None:
    values = iter(range(10**9))
    sampler = etl_sampler.MemorySampler(None, interval=0.005, read=lambda: next(values))
    first = time.perf_counter()
    sampler.start()
    _wait_for(lambda: sampler.mark() > 20, 30, "samples")
    middle = time.perf_counter()
    _wait_for(lambda: sampler.mark() > 40, 30, "more samples")
    sampler.stop()
    early, late = sampler.peak(first, middle), sampler.peak(middle, time.perf_counter())
    assert early is not None and late is not None and early < late
    assert sampler.peak(0.0, first - 1) is None
    epochs = sampler.by_epoch()
    assert len(epochs) > 40 and abs(epochs[-1][0] - time.time()) < 60
    idle = sampler.idle(count=3)
    assert idle is not None and idle > late
    none = etl_sampler.MemorySampler(None)
    assert none.mark() is None and none.idle(1) is None and none.reason


def test_a_run_over_both_formats_rotates_checks_and_removes_its_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = dataclasses.replace(SMALL, repeat=2, formats=("parquet",), data_dir=str(tmp_path))
    saved: list[dict[str, Any]] = []
    doc = etl.run_etl(
        plan, {"cudask": Target(sys.executable)}, argv=["etl"], checkpoint=saved.append
    )
    # the document so far, after the data and after each child
    assert [(d["status"], d["failed_so_far"]) for d in saved] == [("partial", False)] * 5
    assert [
        sum(len(e["children"]) for e in d["results"].get("parquet", {}).values()) for d in saved
    ] == [0, 1, 2, 3, 4]
    assert saved[-1]["results"]["parquet"]["cudask"]["correct"]  # checked as the last document is
    assert all("finished_at" not in d for d in saved) and "finished_at" in doc
    lines = capsys.readouterr().out.splitlines()  # one per child as it ends
    assert lines[0].startswith("[data] writing the files: ") and len(lines) == 5
    assert (
        lines[1].startswith("[1/4] floor parquet (repetition 1): cold ") and "; warm 1 " in lines[1]
    )
    assert lines[4].startswith("[4/4] floor parquet (repetition 2): cold ")
    assert os.listdir(tmp_path) == []  # the data folder is gone
    assert doc["status"] == "ok" and doc["order"] == [["floor", "cudask"], ["cudask", "floor"]]
    assert doc["data"]["status"] == "ok" and doc["data"]["formats"]["parquet"]["disk_bytes"] > 0
    for name in ("floor", "cudask"):
        entry = doc["results"]["parquet"][name]
        assert entry["status"] == "ok" and entry["correct"] and entry["error"] is None
        assert [len(c["runs"]) for c in entry["children"]] == [2, 2]
        assert all(r["check"] == "right" for c in entry["children"] for r in c["runs"])
        runs = [r for c in entry["children"] for r in c["runs"]]
        assert all(r["released"]["tasks_left"] == 0 for r in runs)
        assert all(
            0 < p["compute_s"] <= p["seconds"] * 1.5 for r in runs for p in r["phases"].values()
        )
        assert all(r["total_s"] <= r["wall_s"] for r in runs)
        assert any(p["moved"] for r in runs for p in r["phases"].values())  # the store's reads
        assert entry["cold"]["runs"] == 2 and entry["warm"]["runs"] == 2
        assert set(entry["cold"]["phases_s"]) == set(etl_phases.PHASES)
        assert entry["children"][0]["cluster"]["stand_in"] is True
    assert doc["results"]["parquet"]["floor"]["cold"]["x_floor"] == 1.0
    runs = [r for e in doc["results"]["parquet"].values() for c in e["children"] for r in c["runs"]]
    assert all(p["working_set_bytes"] > 0 for r in runs for p in r["phases"].values())
    # no NVML here: what a task was seen to add is what the worker sized
    assert all(
        p["working_set_nvml_bytes"] == p["working_set_bytes"]
        for r in runs
        for p in r["phases"].values()
    )
    cold = doc["results"]["parquet"]["cudask"]["cold"]
    floor = doc["results"]["parquet"]["floor"]
    seen = max(floor[mode]["phase_working_set_nvml_bytes"]["merge"] for mode in ("cold", "warm"))
    assert cold["phase_bound_bytes"]["merge"] == plan.device_memory_limit + max(
        cold["phase_working_set_bytes"]["merge"], seen
    )  # the floor's runs, cold and warm
    assert cold["within"] is None  # no NVML peaks on this machine
    assert "phase_bound_bytes" not in doc["results"]["parquet"]["floor"]["cold"]  # no limit
    text = "\n".join(etl.summary(doc))
    assert "etl parquet: 3 files x 4,000 rows" in text and text.count("  right") == 2
    assert "in every phase, cold/warm: cudask -/-" in text
    assert etl.failures(doc) == []


def test_the_bound_adds_the_largest_task_of_each_phase_to_the_limit() -> None:
    windows = {"load": (0.0, 10.0), "merge": (10.0, 20.0)}
    found = [(1.0, "a", 2, 3), (2.0, "b", 4, 5), (15.0, "c", 1, 2), (30.0, "d", 90, 9)]
    assert working_set.largest(found, windows) == {"load": 9, "merge": 3}
    # what NVML saw a task add counts where it is more than its output
    assert working_set.largest(found, windows, {"a": 20, "c": 0}) == {"load": 23, "merge": 3}
    fig = {
        "phase_peak_bytes": dict.fromkeys(etl_phases.PHASES, 100),
        "phase_working_set_bytes": dict.fromkeys(etl_phases.PHASES, 10),
    }
    etl.bound(fig, 90)
    assert fig["phase_bound_bytes"]["merge"] == 100 and fig["within"] is True
    fig["phase_peak_bytes"]["merge"] = 111  # past 1.10x its bound
    etl.bound(fig, 90)
    assert fig["within"] is False
    # the same tasks' temporaries, seen where nothing spilled, widen the bound
    floor = {"phase_working_set_nvml_bytes": {**dict.fromkeys(etl_phases.PHASES, 4), "merge": 20}}
    etl.bound(fig, 90, floor)
    assert fig["phase_task_bytes"]["merge"] == 20 and fig["phase_task_bytes"]["load"] == 10
    assert fig["phase_bound_bytes"]["merge"] == 110 and fig["within"] is True
    # the floor's cold and warm runs count together: each sees few tasks
    runs = {
        "cold": {
            "phase_working_set_nvml_bytes": {**dict.fromkeys(etl_phases.PHASES, 4), "merge": 20}
        },
        "warm": {
            "phase_working_set_nvml_bytes": {**dict.fromkeys(etl_phases.PHASES, None), "merge": 30}
        },
    }
    seen = etl._floor_tasks(runs)
    assert seen is not None and seen["phase_working_set_nvml_bytes"] == {
        **dict.fromkeys(etl_phases.PHASES, 4),
        "merge": 30,
    }
    assert etl._floor_tasks(None) is None and etl._floor_tasks({"cold": None}) is None


def test_growth_is_the_rise_of_used_memory_while_a_task_computed() -> None:
    samples = [(0.0, 100), (1.0, 100), (1.5, 180), (2.0, 150), (2.5, 120), (4.0, 300)]
    stream = [
        {
            "key": "('merge', 0)",
            "startstops": [
                {"action": "compute", "start": 1.2, "stop": 2.2},
                {"action": "transfer", "start": 0.0, "stop": 9.0},
            ],
        },
        {"key": "short", "startstops": [{"action": "compute", "start": 3.0, "stop": 3.5}]},
        {"key": "first", "startstops": [{"action": "compute", "start": -1.0, "stop": 0.5}]},
    ]
    spans = working_set.compute_spans(stream)
    assert spans == [("('merge', 0)", 1.2, 2.2), ("short", 3.0, 3.5), ("first", -1.0, 0.5)]
    # the largest sample inside less the last before; none inside or none before: absent
    assert working_set.growth(list(reversed(samples)), spans) == {"('merge', 0)": 80}
    assert working_set.compute_spans(None) == []
    # a sample at a span's very start or stop is inside it
    assert working_set.growth(samples, [("edges", 1.5, 2.0)]) == {"edges": 80}
    # a task that computed twice (retried) keeps its larger rise
    assert working_set.growth(samples, [("again", 1.2, 1.6), ("again", 3.0, 4.0)]) == {"again": 180}


def test_growth_never_charges_a_task_with_what_the_task_before_it_left() -> None:
    # A (0.001-0.005) allocates 100 between two samples; B (0.006-0.025) allocates nothing
    samples = [(0.0, 100), (0.02, 201)]
    spans = [("A", 0.001, 0.005), ("B", 0.006, 0.025)]
    # B's last sample before it came before A ended: no clean baseline, so B is not seen
    assert working_set.growth(samples, spans) == {}
    # with a sample between A and B, B's rise is its own
    assert working_set.growth([*samples, (0.0055, 200)], spans) == {"B": 1}
    windows = {"load": (0.0, 1.0)}
    found = [(0.005, "A", 10, 0), (0.025, "B", 10, 5)]
    assert working_set.measured(found, windows, {"B": 1}) == {"load": 1}


def _run(**run: Any) -> dict[str, Any]:
    phases = {p: {"seconds": 1.0, "peak_bytes": 5} for p in etl_phases.PHASES}
    return {
        "kind": "cold",
        "phases": phases,
        "total_s": 4.0,
        "peak_bytes": 7,
        "error": None,
        "answers": {},
        **run,
    }


def test_a_failed_setting_is_reported_with_its_error(data: tuple[Path, dict[str, Any]]) -> None:
    want = data[1]["formats"]["csv"]["reference"]
    right = _run(answers=copy.deepcopy(want))
    crashed = {
        "status": "failed",
        "error": "cold run, merge: MemoryError: out of memory",
        "runs": [_run(error="merge: MemoryError: out of memory", total_s=9.0)],
    }
    wrong = _run(answers={**copy.deepcopy(want), "groups": 1})
    results = {
        "csv": {
            "floor": [{"status": "ok", "runs": [right, copy.deepcopy(right)]}],
            "cudask": [crashed],
            "cudask-jit": [{"status": "ok", "runs": [wrong]}],
        }
    }
    doc = etl.document(
        SMALL,
        {"status": "ok", "formats": {"csv": {"reference": want}}},
        results,
        [["floor", "cudask", "cudask-jit"]],
        {},
        etl._dt.datetime.now(etl._dt.UTC),
        1.0,
        ["etl"],
    )
    entries = doc["results"]["csv"]
    assert doc["status"] == "failed"
    assert entries["floor"]["correct"] and entries["floor"]["warm"]["total_s"] == 4.0
    assert entries["cudask"]["status"] == "failed" and entries["cudask"]["cold"] is None
    assert entries["cudask"]["error"] == "cold run, merge: MemoryError: out of memory"
    assert not entries["cudask-jit"]["correct"] and entries["cudask-jit"]["cold"]["x_floor"] == 1.0
    assert entries["cudask-jit"]["children"][0]["runs"][0]["check"][0].startswith("groups: 1 != ")
    text = "\n".join(etl.summary(doc))
    assert "failed: cold run, merge: MemoryError: out of memory" in text and "WRONG" in text
    assert etl.failures(doc) == [
        "cudask csv: cold run, merge: MemoryError: out of memory",
        "cudask-jit csv: wrong answers",
    ]


def test_a_phase_that_raises_ends_the_child_with_its_error(tmp_path: Path) -> None:
    plan = dataclasses.replace(SMALL, formats=("csv",), files=2)
    etl_data.generate(plan, str(tmp_path))
    with open(etl_data.fact_files(str(tmp_path), "csv")[1], "a") as fh:
        fh.write("not,a,number,here\n")
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudask_bench.etl_run",
            "--plan",
            plan.to_json(),
            "--root",
            str(tmp_path),
            "--setting",
            "cudask",
            "--format",
            "csv",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    result = json.loads(out.read_text())
    assert done.returncode == 1 and result["status"] == "failed", done.stderr
    assert result["error"].startswith("cold run, load: "), result["error"]
    assert result["runs"][0]["error"].startswith("load: ") and result["runs"][0]["phases"] == {}
    assert "cudask bench etl runner: cold run, load: " in done.stderr


@pytest.mark.skipif(environment.has_module("dask_cuda"), reason="dask_cuda is installed here")
def test_dask_cuda_settings_skipped_unless_named() -> None:
    plan = etl_data.EtlPlan(frames="pandas")
    kw = {"dask_cuda_python": None, "dask_cuda_path": None}
    kept, found = resolve_targets(kw, plan, asked=False)
    assert kept.settings == ("floor", "cudask", "cudask-jit", "cudask-cudf-spill")
    assert set(kept.skipped) == {"dask-cuda", "dask-cuda-cudf-spill"} and set(found) == {"cudask"}
    assert "give --dask-cuda-path" in kept.skipped["dask-cuda"]
    with pytest.raises(MissingDependencyError, match="dask-cuda"):
        resolve_targets(kw, plan, asked=True)


PANDAS = ["bench", "etl", "--frames", "pandas", "--files", "3", "--rows-per-file", "1000"]


@pytest.mark.parametrize(
    "args, said",
    [
        (["--settings", "floor,nope"], "'nope': accepted: floor, dask-cuda, "),
        (
            ["--settings", "cudask@memory.nope=1"],
            "'memory.nope=1' is not KEY=VALUE with KEY a cudask",
        ),
        (
            ["--settings", "cudask@worker.jit-unspill=true"],
            "with KEY a cudask.memory or cudask.worker.rmm-",
        ),
        (
            ["--settings", "floor,floor@worker.rmm-async=true@worker.rmm-managed-memory=true"],
            (
                "'floor@worker.rmm-async=true@worker.rmm-managed-memory=true': rmm_async=True and "
                "rmm_managed_memory=True cannot be combined"
            ),
        ),
        (["--settings", "floor@worker.rmm-pool-size=lots"], "rmm_pool_size='lots' is not a size"),
        (
            ["--settings", "cudask@memory.pinned-pool-size=huge"],
            "cudask.memory.pinned-pool-size='huge' is not a size",
        ),
        (["--format", "xls"], "'xls'; accepted: csv, parquet, comma-separated"),
        (["--device-memory-limit", "none"], "--device-memory-limit='none'; accepted: a size"),
        (
            ["--device-memory-limit", "1MB"],
            (
                "--files 3 x --rows-per-file 1,000 make 82.03 kiB on "
                "the device, less than 3x --device-memory-limit "
                "(0.95 MiB); accepted: at least 2.86 MiB, e.g. --files 108"
            ),
        ),
        (
            ["--device-memory-limit", "1kB", "--data-dir", "/nonexistent/x"],
            "--data-dir='/nonexistent/x'",
        ),
    ],
)
def test_bad_input_is_one_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, [*PANDAS, *args])
    assert result.exit_code in (1, 2) and said in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(environment.has_module("dask_cudf"), reason="dask_cudf is installed here")
def test_cudf_frames_need_dask_cudf() -> None:
    result = CliRunner().invoke(cli, ["bench", "etl"])
    assert result.exit_code == 1 and "needs dask_cudf, which is not installed" in result.output
    assert "--frames pandas" in result.output


def _etl_children(bench: subprocess.Popen[str]) -> list[psutil.Process] | None:
    assert bench.poll() is None, bench.communicate()
    for child in psutil.Process(bench.pid).children():
        try:
            if "cudask_bench.etl_run" in child.cmdline():
                workers = [
                    p
                    for p in child.children(recursive=True)
                    if "spawn_main" in " ".join(p.cmdline())
                ]
                if workers:
                    return [child, *child.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return None


@pytest.mark.timeout(400)
def test_interrupt_stops_the_children_and_removes_the_data(tmp_path: Path) -> None:
    data_dir, tmp = tmp_path / "data", tmp_path / "tmp"
    data_dir.mkdir()
    tmp.mkdir()
    bench = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, signal, sys; signal.signal(signal.SIGINT, "
                "signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
            ),
            sys.executable,
            "-m",
            "cudask.cli",
            *PANDAS,
            "--device-memory-limit",
            "1kB",
            "--settings",
            "cudask",
            "--warm-runs",
            "100000",
            "--data-dir",
            str(data_dir),
            "--output",
            str(tmp_path / "out.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        processes = _wait_for(lambda: _etl_children(bench), 120, "a child with a worker")
        assert isinstance(processes, list) and os.listdir(data_dir)  # the data, while it runs
        bench.send_signal(signal.SIGINT)
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 130, (out, err)
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(
            "bench etl: interrupted by SIGINT; its processes "
            "are stopped and its temporary files removed"
        )
    ), err
    _, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, [p.cmdline() for p in alive]
    assert os.listdir(data_dir) == [] and os.listdir(tmp) == []
    saved = json.loads((tmp_path / "out.json").read_text())  # written once the data was there
    assert saved["status"] == "partial" and saved["data"]["status"] == "ok"
    assert f"the results so far (status partial) are in {tmp_path / 'out.json'}" in err


def test_a_setting_may_choose_the_allocator() -> None:
    setting = etl_data.setting_named("floor@worker.rmm-async=true")
    assert setting.dask_config() == {"cudask.worker.rmm-async": True}
    assert not setting.limited and setting.backend == "cudask"


def test_a_setting_with_config_values_of_its_own_runs_under_them(tmp_path: Path) -> None:
    name = "cudask@memory.spill-target=0.75"
    setting = etl_data.setting_named(name)
    assert setting.dask_config() == {"cudask.memory.spill-target": 0.75}  # read as YAML
    assert (
        setting.limited
        and setting.backend == "cudask"
        and "spill-target=0.75" in setting.description
    )
    plan = dataclasses.replace(
        SMALL, settings=(name,), formats=("csv",), warm_runs=0, data_dir=str(tmp_path)
    )
    doc = etl.run_etl(plan, {"cudask": Target(sys.executable)}, argv=["etl"])
    entry = doc["results"]["csv"][name]
    assert entry["status"] == "ok" and entry["correct"], entry.get("error")
    assert entry["description"] == setting.description
    assert [c["config"] for c in entry["children"]] == [{"cudask.memory.spill-target": 0.75}]
    assert [c["worker_config"] for c in entry["children"]] == [{"cudask.memory.spill-target": 0.75}]


def test_results_so_far_that_cannot_be_written_are_said_once_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cudask_bench.cli.etl import _Saver

    (tmp_path / "file").write_text("")
    save = _Saver(str(tmp_path / "file" / "out.json"))  # under a file: no folder to write in
    save({"workload": "etl"})
    save({"workload": "etl"})
    err = capsys.readouterr().err
    assert err.count("could not write the results so far to --output") == 1 and "going on" in err
    assert not save.written


def test_a_run_that_failed_inside_a_child_is_shown_with_its_error() -> None:
    result = {
        "status": "ok",
        "runs": [
            {"kind": "cold", "total_s": 1.5, "peak_bytes": 2e9},
            {"kind": "warm 1", "error": "MemoryError: merge"},
        ],
    }
    assert etl.child_line("2/6", "cudask parquet", result) == (
        "[2/6] cudask parquet: cold 1.50 s (peak 2.00 GB); warm 1 FAILED: MemoryError: merge "
        "(answers checked at the end)"
    )


def test_fused_graphs_store_fewer_intermediates(tmp_path: Path) -> None:
    # Client.compute does not fuse dask-expr's blockwise steps (dask/distributed#8833): the
    # merge phase's projections and merge outputs are stored by the worker, and read again
    reads = {}
    for fuse in (False, True):
        plan = dataclasses.replace(
            SMALL,
            settings=("cudask",),
            formats=("parquet",),
            warm_runs=0,
            data_dir=str(tmp_path),
            fuse=fuse,
        )
        doc = etl.run_etl(plan, {"cudask": Target(sys.executable)}, argv=["etl"])
        entry = doc["results"]["parquet"]["cudask"]
        assert entry["correct"] and doc["plan"]["fuse"] is fuse
        (run,) = entry["children"][0]["runs"]
        reads[fuse] = run["phases"]["merge"]["moved"]["memory-read/count"]
        assert ("graphs fused" in "\n".join(etl.summary(doc))) is fuse
    assert reads[True] < reads[False]
