"""The bench's plan on CPU (cudask_bench.spec): the variants built from the options,
the runner's command line and what the runner parses of it, cold and warm modes with
their defaults, and the steps each runner announces."""

from __future__ import annotations

from typing import Any

import pytest

from cudask.errors import OptionError
from cudask_bench import spec

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
    assert [v.name for v in variants] == [
        "cudask 4 GiB",
        "cudask 4 GiB +jit",
        "dask-cuda 4 GiB +jit",
    ]


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
        spec.runner_argv(
            spec.Variant("dict"),
            "spill",
            array_module="numpy",
            device="0",
            memory_limit="auto",
            rmm_pool_size=None,
            protocol="tcp",
            repeat=1,
            warmup=0,
            total=8,
            chunk_size=8,
        )
    with pytest.raises(OptionError, match="--mode='hot'"):
        spec.runner_argv(
            spec.Variant("dict"),
            "cupy",
            array_module="numpy",
            device="0",
            memory_limit="auto",
            rmm_pool_size=None,
            protocol="tcp",
            repeat=1,
            warmup=0,
            mode="hot",
        )


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
    # warm: cluster up + (create, read+verify, read+sum) x (warm-ups + repetitions)
    assert (
        planned_steps(_runner_args(*spill, "--mode", "warm", "--repeat", "3", "--warmup", "1"))
        == 1 + 3 * 4
    )
    # cold: cluster up + (create, read+verify, read+sum) x (the cold run + warm runs)
    assert planned_steps(_runner_args(*spill, "--mode", "cold", "--warm-runs", "2")) == 1 + 3 * 3
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
