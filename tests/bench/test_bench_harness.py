"""Harness pieces on CPU: variants, runner argv, ratios, merging, JSON, progress, chart,
environment probing, and the runner subprocess itself (help, clean failures, another
interpreter reaching cudask through the PYTHONPATH shim)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudask.errors import MissingDependencyError, OptionError
from cudask_bench import environment, harness, report, spec, targets
from cudask_bench.run import RunnerError, check_honesty

GIB4 = 4 * 2**30


# --------------------------------------------------------------------------- variants


def test_variants_with_limit_baseline_and_both_jit() -> None:
    variants = spec.build_variants(
        ["cudask", "dask-cuda"],
        device_memory_limit=GIB4,
        limit_set=True,
        jit_mode="both",
        baseline=True,
    )
    assert [v.name for v in variants] == [
        "dict store",
        "cudask no limit",
        "cudask 4 GiB",
        "cudask 4 GiB +jit",
        "dask-cuda 4 GiB",
        "dask-cuda 4 GiB +jit",
    ]


def test_variants_without_baseline_or_limit() -> None:
    variants = spec.build_variants(
        ["cudask"], device_memory_limit=None, limit_set=True, jit_mode="off", baseline=False
    )
    assert variants == [spec.Variant("cudask", None, False)]
    variants = spec.build_variants(
        ["cudask"], device_memory_limit=None, limit_set=True, jit_mode="on", baseline=True
    )
    # no limit: the cudask no-limit baseline would duplicate nothing new but the dict store
    assert [v.name for v in variants] == ["dict store", "cudask no limit +jit"]


def test_variants_dask_cuda_jit_mode_of_its_own() -> None:
    variants = spec.build_variants(
        ["cudask", "dask-cuda"],
        device_memory_limit=GIB4,
        limit_set=True,
        jit_mode="both",
        against_jit_mode="on",
        baseline=False,
    )
    assert [v.name for v in variants] == ["cudask 4 GiB", "cudask 4 GiB +jit", "dask-cuda 4 GiB +jit"]


def test_variants_backend_default_limit() -> None:
    [dict_v, nolimit, v] = spec.build_variants(
        ["cudask"], device_memory_limit=None, limit_set=False, jit_mode="off", baseline=True
    )
    assert v.name == "cudask default limit" and v.describe()["device_memory_limit"] == "default"
    assert nolimit.name == "cudask no limit" and dict_v.backend == "dict"


def test_bad_names_are_refused() -> None:
    with pytest.raises(OptionError, match="accepted: cudask, dask-cuda, dict"):
        spec.build_variants(
            ["ray"], device_memory_limit=None, limit_set=True, jit_mode="off", baseline=False
        )
    with pytest.raises(OptionError, match="--jit-unspill='maybe'"):
        spec.jit_flags("maybe")
    assert spec.check_operations(["sum,mean", "sum"]) == ["sum", "mean"]
    assert spec.check_operations([]) == list(spec.CUPY_OPERATIONS)


def test_operation_shapes() -> None:
    assert spec.operation_shape("transpose_sum", None, None, None) == {
        "size": 40000,
        "chunk": 5000,
        "second": None,
    }
    assert spec.operation_shape("svd", 1000, 100, None)["second"] == 1000
    with pytest.raises(OptionError, match="--chunk-size=200"):
        spec.operation_shape("sum", 100, 200, None)


def test_runner_argv() -> None:
    v = spec.Variant("dask-cuda", GIB4, True)
    argv = spec.runner_argv(
        v,
        "spill",
        array_module="cupy",
        device="0",
        memory_limit="auto",
        rmm_pool_size=2**30,
        protocol="tcp",
        repeat=3,
        warmup=1,
        mode="cold",
        warm_runs=1,
        total=2**34,
        chunk_size=2**28,
    )
    joined = " ".join(argv)
    assert "--backend dask-cuda" in joined and "--workload spill" in joined
    assert "--mode cold --warm-runs 1" in joined
    assert f"--device-memory-limit {GIB4}" in joined and "--jit-unspill" in argv
    assert f"--total {2**34} --chunk-size {2**28}" in joined
    assert f"--rmm-pool-size {2**30}" in joined and "--json" not in argv
    no_limit = spec.runner_argv(
        spec.Variant("cudask", None),
        "cupy",
        array_module="cupy",
        device="1",
        memory_limit="auto",
        rmm_pool_size=None,
        protocol="tcp",
        repeat=1,
        warmup=0,
        mode="warm",
        warm_runs=3,
        operations=["sum", "dot"],
        size=100,
    )
    assert "--mode warm" in " ".join(no_limit) and "--warm-runs" not in no_limit
    assert "--device-memory-limit" in no_limit
    assert no_limit[no_limit.index("--device-memory-limit") + 1] == "0"
    assert no_limit.count("--operation") == 2 and "--jit-unspill" not in no_limit
    default = spec.runner_argv(
        spec.Variant("cudask", None, limit_set=False),
        "startup",
        array_module="cupy",
        device="0",
        memory_limit="auto",
        rmm_pool_size=None,
        protocol="tcp",
        repeat=1,
        warmup=0,
    )
    assert "--device-memory-limit" not in default and "--mode" not in default
    with pytest.raises(OptionError, match="needs a mode; accepted: cold, warm"):
        spec.runner_argv(spec.Variant("dict"), "spill", array_module="numpy", device="0",
                         memory_limit="auto", rmm_pool_size=None, protocol="tcp", repeat=1,
                         warmup=0, total=8, chunk_size=8)
    with pytest.raises(OptionError, match="--mode='hot'"):
        spec.runner_argv(spec.Variant("dict"), "cupy", array_module="numpy", device="0",
                         memory_limit="auto", rmm_pool_size=None, protocol="tcp", repeat=1,
                         warmup=0, mode="hot")


def test_runner_parses_what_the_harness_writes() -> None:
    from cudask_bench.run import parse_args

    argv = spec.runner_argv(
        spec.Variant("cudask", GIB4, True),
        "cupy",
        array_module="numpy",
        device="0",
        memory_limit="8GB",
        rmm_pool_size=None,
        protocol="tcp",
        repeat=2,
        warmup=1,
        mode="cold",
        warm_runs=0,
        operations=["svd"],
        size=1000,
        array_chunk=100,
        second_size=10,
        json_path="x.json",
    )
    args = parse_args(argv)
    assert args.backend == "cudask" and args.device_memory_limit == GIB4 and args.jit_unspill
    assert args.operation == ["svd"] and args.second_size == 10 and args.array_chunk == 100
    assert args.memory_limit == "8GB" and args.repeat == 2 and args.warmup == 1
    assert args.mode == "cold" and args.warm_runs == 0


def _runner_args(*extra: str) -> Any:
    from cudask_bench.run import parse_args

    return parse_args(["--backend", "dict", "--json", "x.json", *extra])


def test_planned_steps() -> None:
    """The progress total each runner announces: one per cluster start and per run."""
    from cudask_bench.run import cluster_groups, planned_steps

    spill = ("--workload", "spill", "--total", "8", "--chunk-size", "8")
    # warm: cluster up + (create, read) x (warm-ups + repetitions)
    assert planned_steps(_runner_args(*spill, "--mode", "warm", "--repeat", "3",
                                      "--warmup", "1")) == 1 + 2 * 4
    # cold: cluster up + (create, read) x (the cold run + warm runs)
    assert planned_steps(_runner_args(*spill, "--mode", "cold", "--warm-runs", "2")) == 1 + 2 * 3
    cupy = ("--workload", "cupy", "--operation", "sum", "--operation", "dot")
    warm = _runner_args(*cupy, "--mode", "warm", "--repeat", "2", "--warmup", "1")
    assert planned_steps(warm) == 1 + 2 * 3 and cluster_groups(warm) == [["sum", "dot"]]
    # cold: per operation, its cluster up + input + the cold run + warm runs
    cold = _runner_args(*cupy, "--mode", "cold", "--warm-runs", "1")
    assert planned_steps(cold) == 2 * (1 + 1 + 2) and cluster_groups(cold) == [["sum"], ["dot"]]
    assert planned_steps(_runner_args("--workload", "startup")) == 1
    defaults = _runner_args("--workload", "cupy")
    assert defaults.mode == spec.DEFAULT_MODE == "cold"
    assert defaults.warm_runs == spec.DEFAULT_WARM_RUNS
    assert len(cluster_groups(defaults)) == len(spec.CUPY_OPERATIONS)


def test_modes_and_defaults() -> None:
    assert spec.MODES == ("cold", "warm") and spec.DEFAULT_MODE in spec.MODES
    assert spec.default_warmup("spill", "cold") == spec.default_warmup("cupy", "cold") == 1
    assert spec.default_warmup("spill", "warm") == 0 and spec.default_warmup("cupy", "warm") == 1
    with pytest.raises(OptionError, match="--mode='hot'"):
        spec.default_warmup("spill", "hot")
    assert spec.process_per_repetition("startup", None)
    assert spec.process_per_repetition("spill", "cold")
    assert not spec.process_per_repetition("cupy", "warm")


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
            **{k + "_warm": dict(x, median=x["median"] / 2) for k, x in m.items()}, **m
        }
    synthetic_document["parameters"].update(mode="cold", warm_runs=2)
    table = report.format_table(synthetic_document)
    lines = table.splitlines()
    assert lines[1] == (
        "cold: first run on a fresh cluster, timed from the first submit; "
        "*_warm: the next 2 runs in the same cluster"
    )
    rows = [line.split()[0] for line in lines[2:] if line.split()
            and line.split()[0] in {"create", "read_verify", "create_warm", "read_verify_warm"}]
    assert rows[:4] == ["create", "read_verify", "create_warm", "read_verify_warm"]
    pairs = report.comparisons(synthetic_document["variants"])
    assert {c["metric"] for c in pairs} == {"create", "read_verify", "create_warm",
                                            "read_verify_warm"}
    synthetic_document["parameters"]["mode"] = "warm"
    assert report.format_table(synthetic_document).splitlines()[1] == (
        "warm: steady state after warm-ups"
    )
    synthetic_document["parameters"] = {}  # startup, or a file from before --mode
    assert report.format_table(synthetic_document).splitlines()[1].startswith("metric")


def test_comparisons_cover_cupy_cold_metrics(synthetic_document: dict[str, Any]) -> None:
    for v in synthetic_document["variants"]:
        v["measurements"] = {
            f"sum{suffix}": dict(x) for x in v["measurements"].values()
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
    write_chart(synthetic_document, tmp_path / "c.png", Origin.of_file(source, "runs/r.json", "abc1234"))
    text = pngtext.read((tmp_path / "c.png").read_bytes())
    assert text["Source"] == "runs/r.json"
    assert text["Source-SHA256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    lines = text["Description"].splitlines()
    assert lines[0] == "result: runs/r.json" and "cudask abc1234" in lines[1]
    assert lines[2].startswith("figures: warm") or lines[2].startswith("figures: cold"), lines
    synthetic_document["variants"] = []
    with pytest.raises(ValueError, match="no measurements"):
        write_chart(synthetic_document, tmp_path / "d.png")


# --------------------------------------------------------------------------- environments


def test_version_tuple_and_jit_support() -> None:
    assert environment.version_tuple("26.04.00a3") == (26, 4, 0)
    assert environment.version_tuple("26.10.00") == (26, 10, 0)
    assert environment.version_tuple(None) == ()
    assert environment.dask_cuda_has_jit_unspill("26.04.00", True)
    assert environment.dask_cuda_has_jit_unspill("25.10.00", None)
    assert not environment.dask_cuda_has_jit_unspill("26.06.00", True)
    assert not environment.dask_cuda_has_jit_unspill("26.04.00", False)
    assert not environment.dask_cuda_has_jit_unspill(None, None)


def test_machine_facts() -> None:
    facts = environment.machine()
    assert facts["hostname"] and facts["cpu_count"] >= 1 and facts["host_memory"] > 0
    assert isinstance(facts["gpus"]["available"], bool)
    v = environment.versions()
    assert v["dask"] and v["distributed"] and v["numpy"] and v["cudask"]


def test_resolve_dask_cuda_2604_with_jit(tmp_path: Path, fake_dask_cuda: Callable[..., Path]) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.04.00", proxy_object=True)
    target = targets.resolve_dask_cuda(None, str(path), jit_unspill=True, array_module="numpy")
    assert target.pythonpath == (str(path),)
    assert target.probe is not None and target.probe["versions"]["dask_cuda"] == "26.04.00"
    assert target.probe["dask_cuda_has_proxy_object"] is True


def test_resolve_dask_cuda_refuses_jit_on_2610(tmp_path: Path, fake_dask_cuda: Callable[..., Path]) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    targets.resolve_dask_cuda(None, str(path), jit_unspill=False, array_module="numpy")
    with pytest.raises(OptionError, match="removed JIT-unspill in 26.06"):
        targets.resolve_dask_cuda(None, str(path), jit_unspill=True, array_module="numpy")


@pytest.mark.skipif(environment.has_module("cupy"), reason="CuPy is installed here")
def test_resolve_dask_cuda_needs_cupy_there(tmp_path: Path, fake_dask_cuda: Callable[..., Path]) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    with pytest.raises(MissingDependencyError, match="cupy"):
        targets.resolve_dask_cuda(None, str(path), jit_unspill=False, array_module="cupy")


# --------------------------------------------------------------------------- runner process


def _runner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cudask_bench.run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_runner_help() -> None:
    proc = _runner("--help")
    assert proc.returncode == 0
    for flag in ("--backend", "--workload", "--json", "--jit-unspill", "--array-module"):
        assert flag in proc.stdout


def test_runner_bad_arguments() -> None:
    proc = _runner("--backend", "ray", "--workload", "spill", "--json", "x")
    assert proc.returncode == 2 and "ray" in proc.stderr


@pytest.mark.skipif(environment.has_module("cupy"), reason="CuPy is installed here")
def test_runner_fails_cleanly_without_cupy(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _runner(
        "--backend",
        "dict",
        "--workload",
        "spill",
        "--total",
        "8",
        "--chunk-size",
        "8",
        "--json",
        str(out),
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "failed"
    assert "cupy is not installed" in result["error"] and "pip install" in result["error"]
    assert result["versions"]["dask"]


@pytest.mark.skipif(environment.has_module("dask_cuda"), reason="dask-cuda is installed here")
def test_runner_dask_cuda_missing(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _runner(
        "--backend",
        "dask-cuda",
        "--workload",
        "startup",
        "--array-module",
        "numpy",
        "--json",
        str(out),
    )
    assert proc.returncode == 1
    result = json.loads(out.read_text())
    assert "dask_cuda cannot be imported" in result["error"]
    # the honesty record exists even for a failed run, and shows no cluster code
    assert not [m for m in result["cudask_modules"] if m.startswith("cudask.deploy")]


def test_runner_rejects_jit_on_new_dask_cuda(tmp_path: Path, fake_dask_cuda: Callable[..., Path]) -> None:
    """The runner checks too: a dask-cuda without JIT-unspill is refused by name."""
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    (path / "dask_cuda" / "__init__.py").write_text(
        "__version__ = '26.10.00'\n"
        "class LocalCUDACluster:\n"
        "    def __init__(self, n_workers=None, device_memory_limit=None): pass\n"
    )
    out = tmp_path / "r.json"
    src = targets.package_root("cudask_bench").parent  # the cudask_bench under test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(path), str(src)]))
    proc = _runner(
        "--backend",
        "dask-cuda",
        "--workload",
        "startup",
        "--array-module",
        "numpy",
        "--jit-unspill",
        "--json",
        str(out),
        env=env,
    )
    assert proc.returncode == 1
    error = json.loads(out.read_text())["error"]
    assert "dask-cuda 26.10.00 has no JIT-unspill" in error


def test_honesty_check() -> None:
    runner = ["cudask", "cudask_bench.run", "numpy"]
    result: dict[str, Any] = {"store": {"cudask_modules": ["cudask", "cudask.memory.store"]}}
    with pytest.raises(RunnerError, match="cudask.memory.store"):
        check_honesty("dask-cuda", result, runner)
    check_honesty("cudask", result, runner)
    with pytest.raises(RunnerError, match="cudask.deploy.local"):
        check_honesty("dict", {}, [*runner, "cudask.deploy.local"])
    several: dict[str, Any] = {  # cold cupy: a cluster per operation
        "store": {"cudask_modules": ["cudask"]},
        "stores": {"sum": {"cudask_modules": ["cudask"]},
                   "dot": {"cudask_modules": ["cudask.worker.plugins"]}},
    }
    with pytest.raises(RunnerError, match="cudask.worker.plugins"):
        check_honesty("dask-cuda", several, runner)
    clean: dict[str, Any] = {"store": {"cudask_modules": ["cudask", "cudask_bench.workloads"]}}
    check_honesty("dask-cuda", clean, runner)
    assert clean["cudask_modules"] == ["cudask", "cudask_bench.run"]


def tiny_host_spill_argv(repeat: int) -> list[str]:
    """Runner arguments for 1 MiB of host-memory spill chunks on the dict store, warm mode."""
    return spec.runner_argv(
        spec.Variant("dict"),
        "spill",
        array_module="numpy",
        device="0",
        memory_limit="auto",
        rmm_pool_size=None,
        protocol="tcp",
        repeat=repeat,
        warmup=0,
        mode="warm",
        total=2**20,
        chunk_size=2**19,
    )


def test_spawn_runner_through_another_interpreter(tmp_path: Path) -> None:
    """A 'foreign' interpreter gets cudask and cudask_bench through the shim on PYTHONPATH."""
    wrapper = tmp_path / "otherpython"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    target = targets.Target(str(wrapper))
    assert target.foreign
    shim = targets.make_shim()
    try:
        assert sorted(os.listdir(shim)) == ["cudask", "cudask_bench"]
        events: list[tuple[int, int, str]] = []
        argv = tiny_host_spill_argv(repeat=1)
        result = harness.spawn_runner(
            target,
            argv,
            shim=shim,
            timeout=120,
            on_progress=lambda d, t, label: events.append((d, t, label)),
        )
    finally:
        targets.remove_shim(shim)
    assert result["status"] == "ok", result
    assert result["cudask_path"] == os.path.join(shim, "cudask")
    assert events[-1][0] == events[-1][1] == 3 and events[0][2] == "cluster up"
    assert result["measurements"]["read_verify_warm"]["times"]
    assert "-m cudask_bench.run" in result["command"]


def test_runner_module_imports_no_workload_libraries() -> None:
    """Each worker the runner's cluster spawns re-runs the runner's module (multiprocessing's
    spawn re-imports the parent's main module), so its imports count in every start-up."""
    code = "import sys, cudask_bench.run; print(sorted({'numpy', 'cupy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_spawn_runner_timeout_kills_the_group(tmp_path: Path) -> None:
    """A runner past --timeout is killed with its workers and reported, not waited for."""
    argv = tiny_host_spill_argv(repeat=1000)
    result = harness.spawn_runner(
        targets.Target(sys.executable), argv, shim=None, timeout=1, on_progress=lambda *a: None
    )
    assert result["status"] == "failed" and "timed out after 1 s" in result["error"]


def test_startup_rounds_go_through_the_variants_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Machine drift must not favour the variant that runs last: startup processes
    alternate between variants; a failing variant is not run again."""
    from cudask_bench import harness, spec

    order: list[str] = []

    def runner(target: object, argv: list[str], **kwargs: object) -> dict[str, Any]:
        backend = argv[argv.index("--backend") + 1]
        limit = argv[argv.index("--device-memory-limit") + 1] if "--device-memory-limit" in argv \
            else "default"
        order.append(f"{backend}:{limit}")
        failed = backend == "cudask" and limit == "default"
        return {"status": "failed" if failed else "ok", "error": "boom" if failed else None,
                "measurements": {"startup": {"times": [] if "--repeat" in argv and
                                             argv[argv.index("--repeat") + 1] == "0" else [1.0],
                                             "warmup_times": []}},
                "process_wall_s": 0.1}

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    variants = [spec.Variant("dict"), spec.Variant("cudask", None),
                spec.Variant("cudask", limit_set=False)]
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="startup", variants=variants,
        targets={"dict": target, "cudask": target},
        runner_options={"array_module": "numpy", "device": "0", "memory_limit": "auto",
                        "rmm_pool_size": None, "protocol": "tcp"},
        repeat=2, warmup=1, parameters={},
    )
    doc = harness.execute(plan, harness.ProgressLine(False))
    assert order == ["dict:0", "cudask:0", "cudask:default"] + ["dict:0", "cudask:0"] * 2
    assert [v["runs"] for v in doc["variants"]] == [3, 3, 1]
    assert [v["status"] for v in doc["variants"]] == ["ok", "ok", "failed"]


def test_processes_take_turns_and_pool_their_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """--processes N: each variant runs in N fresh processes, alternating with the
    other variants; the median is over all their repetitions."""
    from cudask_bench import harness, spec

    order: list[str] = []

    def runner(target: object, argv: list[str], **kwargs: object) -> dict[str, Any]:
        jit = "--jit-unspill" in argv
        order.append("jit" if jit else "plain")
        value = 2.0 if jit else 1.0
        repeat = int(argv[argv.index("--repeat") + 1])
        return {"status": "ok", "measurements": {"sum": {"times": [value + 0.01 * len(order)] * repeat,
                                                         "warmup_times": [9.0]}},
                "process_wall_s": 0.1}

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="cupy", variants=[spec.Variant("cudask", 1 << 30), spec.Variant("cudask", 1 << 30, jit_unspill=True)],
        targets={"cudask": target},
        runner_options={"array_module": "numpy", "device": "0", "memory_limit": "auto",
                        "rmm_pool_size": None, "protocol": "tcp", "operations": ["sum"],
                        "mode": "warm"},
        repeat=2, warmup=1, parameters={}, processes=3,
    )
    doc = harness.execute(plan, harness.ProgressLine(False))
    assert order == ["plain", "jit"] * 3
    plain, jit = doc["variants"]
    assert plain["runs"] == 3 and len(plain["measurements"]["sum"]["times"]) == 6
    assert len(plain["measurements"]["sum"]["warmup_times"]) == 3
    assert jit["measurements"]["sum"]["median"] > 2 > plain["measurements"]["sum"]["median"]
    assert doc["parameters"]["processes"] == 3


def test_cold_rounds_take_turns_one_process_per_repetition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--mode cold: startup's rounds: the warm-up processes first, then one process per
    measured repetition, the variants alternating; --processes plays no part."""
    from cudask_bench import harness, spec

    calls: list[tuple[str, str, str, str]] = []

    def runner(target: object, argv: list[str], **kwargs: object) -> dict[str, Any]:
        def value(flag: str) -> str:
            return argv[argv.index(flag) + 1]

        jit = "jit" if "--jit-unspill" in argv else "plain"
        calls.append((jit, value("--warmup"), value("--repeat"), value("--mode")))
        measured = value("--warmup") == "0"
        times = {"times": [1.0], "warmup_times": []} if measured else {
            "times": [], "warmup_times": [5.0]}
        return {"status": "ok", "pid": len(calls), "process_wall_s": 0.1,
                "measurements": {"create": times, "create_warm": times}}

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="spill",
        variants=[spec.Variant("cudask", 1 << 30), spec.Variant("cudask", 1 << 30, True)],
        targets={"cudask": target},
        runner_options={"array_module": "numpy", "device": "0", "memory_limit": "auto",
                        "rmm_pool_size": None, "protocol": "tcp", "total": 8,
                        "chunk_size": 8, "mode": "cold", "warm_runs": 2},
        repeat=2, warmup=1, parameters={}, processes=5,
    )
    assert harness.plan_rounds(plan) == [(1, 0), (0, 1), (0, 1)]
    doc = harness.execute(plan, harness.ProgressLine(False))
    assert calls == [("plain", "1", "0", "cold"), ("jit", "1", "0", "cold")] + [
        ("plain", "0", "1", "cold"), ("jit", "0", "1", "cold")] * 2
    plain, jit = doc["variants"]
    assert plain["runs"] == 3 and plain["pids"] == [1, 3, 5] and jit["pids"] == [2, 4, 6]
    assert plain["measurements"]["create"]["times"] == [1.0, 1.0]
    assert plain["measurements"]["create"]["warmup_times"] == [5.0]
    assert doc["parameters"]["processes"] == 3
