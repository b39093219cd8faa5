"""Harness pieces on CPU: the environment probing (versions, machine, a dask-cuda to
compare with), the runner subprocess itself (help, clean failures, another interpreter
reaching cudask through the PYTHONPATH shim, a timeout), and the order in which the
harness runs variants' processes. Variants and runner argv: test_bench_spec.py;
ratios, merging, table, JSON, progress and chart: test_bench_report.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudask.errors import MissingDependencyError, OptionError
from cudask_bench import environment, harness, spec, targets
from cudask_bench.run import RunnerError, check_honesty

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


def test_resolve_dask_cuda_2604_with_jit(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.04.00", proxy_object=True)
    target = targets.resolve_dask_cuda(None, str(path), jit_unspill=True, array_module="numpy")
    assert target.pythonpath == (str(path),)
    assert target.probe is not None and target.probe["versions"]["dask_cuda"] == "26.04.00"
    assert target.probe["dask_cuda_has_proxy_object"] is True


def test_resolve_dask_cuda_refuses_jit_on_2610(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    targets.resolve_dask_cuda(None, str(path), jit_unspill=False, array_module="numpy")
    with pytest.raises(OptionError, match="removed JIT-unspill in 26.06"):
        targets.resolve_dask_cuda(None, str(path), jit_unspill=True, array_module="numpy")


@pytest.mark.skipif(environment.has_module("cupy"), reason="CuPy is installed here")
def test_resolve_dask_cuda_needs_cupy_there(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
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


def test_runner_rejects_jit_on_new_dask_cuda(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
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
        "stores": {
            "sum": {"cudask_modules": ["cudask"]},
            "dot": {"cudask_modules": ["cudask.worker.plugins"]},
        },
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
    assert events[-1][0] == events[-1][1] == 4 and events[0][2] == "cluster up"
    assert result["measurements"]["read_sum_warm"]["times"]
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
        limit = (
            argv[argv.index("--device-memory-limit") + 1]
            if "--device-memory-limit" in argv
            else "default"
        )
        order.append(f"{backend}:{limit}")
        failed = backend == "cudask" and limit == "default"
        return {
            "status": "failed" if failed else "ok",
            "error": "boom" if failed else None,
            "measurements": {
                "startup": {
                    "times": []
                    if "--repeat" in argv and argv[argv.index("--repeat") + 1] == "0"
                    else [1.0],
                    "warmup_times": [],
                }
            },
            "process_wall_s": 0.1,
        }

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    variants = [
        spec.Variant("dict"),
        spec.Variant("cudask", None),
        spec.Variant("cudask", limit_set=False),
    ]
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="startup",
        variants=variants,
        targets={"dict": target, "cudask": target},
        runner_options={
            "array_module": "numpy",
            "device": "0",
            "memory_limit": "auto",
            "rmm_pool_size": None,
            "protocol": "tcp",
        },
        repeat=2,
        warmup=1,
        parameters={},
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
        return {
            "status": "ok",
            "measurements": {
                "sum": {"times": [value + 0.01 * len(order)] * repeat, "warmup_times": [9.0]}
            },
            "process_wall_s": 0.1,
        }

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="cupy",
        variants=[
            spec.Variant("cudask", 1 << 30),
            spec.Variant("cudask", 1 << 30, jit_unspill=True),
        ],
        targets={"cudask": target},
        runner_options={
            "array_module": "numpy",
            "device": "0",
            "memory_limit": "auto",
            "rmm_pool_size": None,
            "protocol": "tcp",
            "operations": ["sum"],
            "mode": "warm",
        },
        repeat=2,
        warmup=1,
        parameters={},
        processes=3,
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
        times = (
            {"times": [1.0], "warmup_times": []}
            if measured
            else {"times": [], "warmup_times": [5.0]}
        )
        return {
            "status": "ok",
            "pid": len(calls),
            "process_wall_s": 0.1,
            "measurements": {"create": times, "create_warm": times},
        }

    monkeypatch.setattr(harness, "spawn_runner", runner)
    monkeypatch.setattr(harness.environment, "machine", dict)
    target = targets.Target(sys.executable)
    plan = harness.Plan(
        workload="spill",
        variants=[spec.Variant("cudask", 1 << 30), spec.Variant("cudask", 1 << 30, True)],
        targets={"cudask": target},
        runner_options={
            "array_module": "numpy",
            "device": "0",
            "memory_limit": "auto",
            "rmm_pool_size": None,
            "protocol": "tcp",
            "total": 8,
            "chunk_size": 8,
            "mode": "cold",
            "warm_runs": 2,
        },
        repeat=2,
        warmup=1,
        parameters={},
        processes=5,
    )
    assert harness.plan_rounds(plan) == [(1, 0), (0, 1), (0, 1)]
    doc = harness.execute(plan, harness.ProgressLine(False))
    assert (
        calls
        == [("plain", "1", "0", "cold"), ("jit", "1", "0", "cold")]
        + [("plain", "0", "1", "cold"), ("jit", "0", "1", "cold")] * 2
    )
    plain, jit = doc["variants"]
    assert plain["runs"] == 3 and plain["pids"] == [1, 3, 5] and jit["pids"] == [2, 4, 6]
    assert plain["measurements"]["create"]["times"] == [1.0, 1.0]
    assert plain["measurements"]["create"]["warmup_times"] == [5.0]
    assert doc["parameters"]["processes"] == 3
