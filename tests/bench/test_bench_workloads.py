"""Workload task functions on host memory (NumPy): fill, verification, stencil, summaries,
and the cupy operations' result checks against a real distributed cluster."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cudask_bench import cupy_cases, measure, spec, tasks, workloads


def test_chunk_fill_and_verify() -> None:
    base = workloads.spill_base(1, 2, 10)
    chunk = tasks.make_chunk("numpy", base, 1000)
    assert chunk.dtype == np.uint64 and chunk[0] == base and chunk[-1] == base + 999
    assert tasks.verify_chunk(chunk, "numpy", base, 1000) == 0
    # another chunk's data, a flipped element, a zeroed chunk, a wrong shape all fail
    assert tasks.verify_chunk(chunk, "numpy", workloads.spill_base(1, 3, 10), 1000) == 1000
    broken = chunk.copy()
    broken[517] ^= 1
    assert tasks.verify_chunk(broken, "numpy", base, 1000) == 1
    assert tasks.verify_chunk(np.zeros(1000, np.uint64), "numpy", base, 1000) == 1000
    assert tasks.verify_chunk(chunk[:999], "numpy", base, 1000) == -1
    assert tasks.verify_chunk(chunk.astype(np.int64), "numpy", base, 1000) == -1


def test_spill_bases_are_distinct() -> None:
    bases = {workloads.spill_base(r, i, 64) for r in range(3) for i in range(64)}
    assert len(bases) == 3 * 64
    assert all(b % 2**32 == 0 for b in bases)


def test_stencil_matches_formula() -> None:
    a = np.arange(25, dtype=float).reshape(5, 5) ** 2
    out = tasks.stencil(a)
    assert out[2, 2] == 4 * a[2, 2] - a[1, 2] - a[3, 2] - a[2, 1] - a[2, 3]


def test_to_numpy_and_summary() -> None:
    a = np.ones(3)
    assert tasks.to_numpy(a) is a
    entry = measure.summarize({"times": [3.0, 1.0, 2.0], "bytes": 2 * 10**9})
    assert entry["median"] == 2.0 and entry["min"] == 1.0 and entry["max"] == 3.0
    assert entry["gbps"] == pytest.approx(1.0)
    empty = measure.summarize({"times": [], "bytes": None})
    assert empty["median"] is None and empty["gbps"] is None


def test_measurement_json() -> None:
    m = measure.Measurement(nbytes=10)
    m.record(1.0, warmup=True)
    m.record(2.0, warmup=False)
    m.fail("x")
    out = m.to_json()
    assert out["times"] == [2.0] and out["warmup_times"] == [1.0]
    assert out["status"] == "failed" and out["error"] == "x"


@pytest.fixture(scope="module")
def client() -> Any:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def test_schedules() -> None:
    warm = measure.schedule("warm", warmup=1, repeat=2, warm_runs=5)
    assert [(s.suffix, s.warmup, s.label) for s in warm] == [
        ("_warm", True, "warm-up 1/1"),
        ("_warm", False, "run 1/2"),
        ("_warm", False, "run 2/2"),
    ]
    cold = measure.schedule("cold", warmup=0, repeat=7, warm_runs=2)
    assert [(s.suffix, s.warmup) for s in cold] == [("", False), ("_warm", False), ("_warm", False)]
    # a cold warm-up process runs the same steps, none of them measured
    assert all(s.warmup for s in measure.schedule("cold", warmup=1, repeat=0, warm_runs=2))
    assert len(measure.schedule("cold", warmup=0, repeat=1, warm_runs=0)) == 1
    with pytest.raises(measure.BenchFailure, match="accepted: cold, warm"):
        measure.schedule("hot", warmup=0, repeat=1, warm_runs=0)


def test_cupy_operations_on_numpy(client: Any) -> None:
    ops = list(spec.CUPY_OPERATIONS)
    assert ops  # the loop below checks something
    shapes = {op: spec.operation_shape(op, 200, 50, 20) for op in ops}
    events: list[str] = []
    result = workloads.run_cupy(
        client,
        module="numpy",
        operations=ops,
        shapes=shapes,
        steps=measure.schedule("warm", warmup=1, repeat=2, warm_runs=0),
        progress=events.append,
    )
    assert list(result) == [op + "_warm" for op in ops]
    for op in ops:
        m = result[op + "_warm"]
        assert m.status == "ok", (op, m.error)
        assert len(m.times) == 2 and len(m.warmup_times) == 1 and m.check
    assert len(events) == 3 * len(ops)


def test_cold_operation_times_input_and_total(client: Any) -> None:
    """Cold: the input from its first submit, the operation's first run, their sum, and the
    warm runs on the same input; the check covers every figure."""
    events: list[str] = []
    result = workloads.run_operation(
        client,
        module="numpy",
        op="dot",
        shape=spec.operation_shape("dot", 200, 50, None),
        steps=measure.schedule("cold", warmup=0, repeat=1, warm_runs=2),
        progress=events.append,
        time_input=True,
    )
    assert list(result) == ["dot_input", "dot", "dot_total", "dot_warm"]
    assert all(m.status == "ok" and m.check for m in result.values()), result
    assert len(result["dot_input"].times) == len(result["dot"].times) == 1
    assert result["dot_total"].times == [result["dot_input"].times[0] + result["dot"].times[0]]
    assert len(result["dot_warm"].times) == 2
    assert events == ["dot input", "dot cold", "dot warm 1/2", "dot warm 2/2"]


def test_cold_warmup_process_measures_nothing(client: Any) -> None:
    result = workloads.run_operation(
        client,
        module="numpy",
        op="sum",
        shape=spec.operation_shape("sum", 200, 50, None),
        steps=measure.schedule("cold", warmup=1, repeat=0, warm_runs=1),
        progress=lambda s: None,
        time_input=True,
    )
    assert all(not m.times and m.warmup_times for m in result.values()), result
    total = result["sum_total"].warmup_times[0]
    assert total == result["sum_input"].warmup_times[0] + result["sum"].warmup_times[0]


def test_failing_operation_fails_every_figure(client: Any) -> None:
    result = workloads.run_operation(
        client,
        module="numpy",
        op="fft",
        shape={"size": 100, "chunk": 50, "second": None},
        steps=measure.schedule("cold", warmup=0, repeat=1, warm_runs=1),
        progress=lambda s: None,
        time_input=True,
    )
    assert set(result) == {"fft_input", "fft", "fft_total", "fft_warm"}
    assert all(m.status == "failed" and "fft" in (m.error or "") for m in result.values())


def test_every_repetition_computes_its_result(client: Any) -> None:
    """A repetition must not find the previous one's result still in memory."""
    from distributed import get_task_stream

    shapes = {"transpose_sum": spec.operation_shape("transpose_sum", 200, 50, None)}
    with get_task_stream(client) as stream:
        steps = measure.schedule("warm", warmup=1, repeat=4, warm_runs=0)
        result = workloads.run_cupy(
            client,
            module="numpy",
            operations=["transpose_sum"],
            shapes=shapes,
            steps=steps,
            progress=lambda s: None,
        )
    assert result["transpose_sum_warm"].status == "ok"
    final = [
        t["key"]
        for t in stream.data
        if isinstance(t["key"], tuple) and t["key"][0].startswith("sum-aggregate")
    ]
    assert len(final) == 5 and len(set(final)) == 1  # the same key, computed every time


def test_cupy_check_catches_a_wrong_result(client: Any) -> None:
    """The transpose_sum check is real: a result that is off by a little fails it."""
    import dask.array as da

    x = (
        da.random.RandomState(seed=1, RandomState=np.random.RandomState)
        .random((100, 100), chunks=50)
        .persist()
    )
    case = cupy_cases.cupy_case("transpose_sum", [x], {"size": 100, "chunk": 50, "second": None})
    assert case.check(case.build()) == "equals 2 * x.sum()"
    with pytest.raises(measure.BenchFailure, match="expected 2 \\* x.sum"):
        case.check(case.build() * (1 + 1e-6))


def test_spill_on_numpy(client: Any) -> None:
    events: list[str] = []
    result = workloads.run_spill(
        client,
        module="numpy",
        total=2**20,
        chunk_size=2**18,
        steps=measure.schedule("warm", warmup=0, repeat=2, warm_runs=0),
        progress=events.append,
    )
    assert list(result) == ["create_warm", "read_verify_warm", "read_sum_warm"]
    assert result["create_warm"].parameters["chunks"] == 4
    assert len(result["read_verify_warm"].times) == 2
    assert len(result["read_sum_warm"].traffic) == 2  # the worker's I/O in each run
    assert events == [
        "create run 1/2",
        "read+verify run 1/2",
        "read+sum run 1/2",
        "create run 2/2",
        "read+verify run 2/2",
        "read+sum run 2/2",
    ]


def test_cold_spill_on_numpy(client: Any) -> None:
    events: list[str] = []
    result = workloads.run_spill(
        client,
        module="numpy",
        total=2**20,
        chunk_size=2**18,
        steps=measure.schedule("cold", warmup=0, repeat=1, warm_runs=1),
        progress=events.append,
    )
    assert list(result) == [
        "create",
        "read_verify",
        "read_sum",
        "create_warm",
        "read_verify_warm",
        "read_sum_warm",
    ]
    assert all(len(m.times) == 1 and m.check for m in result.values())
    assert events == [
        "create cold",
        "read+verify cold",
        "read+sum cold",
        "create warm 1/1",
        "read+verify warm 1/1",
        "read+sum warm 1/1",
    ]


def test_chunk_sums_match_their_closed_form() -> None:
    base = workloads.spill_base(2, 5, 10)
    chunk = tasks.make_chunk("numpy", base, 1 << 20)
    assert tasks.sum_chunk(chunk, "numpy") == tasks.expected_sum(base, 1 << 20)
    assert tasks.sum_chunk(chunk, "numpy") == int(chunk.astype(object).sum()) % 2**64
    chunk[3] += np.uint64(1)
    assert tasks.sum_chunk(chunk, "numpy") != tasks.expected_sum(base, 1 << 20)


@pytest.mark.timeout(300)
def test_spill_counts_the_disk_io_of_a_worker_spilling_to_disk(tmp_path: Any) -> None:
    """A worker whose store holds 8 MiB in host memory and the rest on disk: creating
    32 MiB writes most of it to disk, reading it back reads it from there."""
    import dask.config
    from distributed import Client, LocalCluster

    from cudask.testing.stores import fake_store

    store = {"device_memory_limit": None, "memory_limit": 8 << 20}
    with (
        dask.config.set({"distributed.worker.memory.spill-compression": False}),
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit=0,
            data=(fake_store, store),
            local_directory=str(tmp_path),
        ) as cluster,
        Client(cluster) as client,
    ):
        result = workloads.run_spill(
            client,
            module="numpy",
            total=32 << 20,
            chunk_size=1 << 20,
            steps=measure.schedule("cold", warmup=0, repeat=1, warm_runs=0),
            progress=lambda label: None,
        )
    (create,), (verify,), (summed,) = (
        result[k].traffic for k in ("create", "read_verify", "read_sum")
    )
    assert create["written_bytes"] >= 20 << 20, create
    assert verify["read_bytes"] >= 20 << 20 and summed["read_bytes"] >= 20 << 20, verify
    disk = result["create"].to_json()["disk"]
    assert disk["written_bytes"] == create["written_bytes"] and disk["write_GBps"] > 0
