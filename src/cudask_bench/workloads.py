"""The benchmark workloads, written against a dask Client and an array module.

Covers: the `spill` workload (create N device chunks with a deterministic fill, then
read every chunk back and compare every element on the device with the value it must
hold, then read every chunk back again and sum it; each pass with the worker's disk
I/O during it, from its /proc/self/io counters) and the `cupy` dask.array operations (cudask_bench.cupy_cases), each run as the
`Step`s of one runner process (cudask_bench.measure.schedule). The same code runs on
every backend (cudask, dask-cuda, a plain dict store): it imports no cluster, only dask,
distributed, NumPy and, on the worker, the array module by name.

Timing rule: a timed region is submit -> every result done -> device synchronized;
building graphs before it and checking results after it are not timed. Progress is
reported only between timed regions. Before the next run the workload waits until the
scheduler forgot the last results and the worker holds no key.

Does not cover: starting clusters (one per cold cupy operation) or writing results
(cudask_bench.run); the task functions (cudask_bench.tasks). Threading: called from the
runner's main thread; the client's own threads do the rest.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from cudask_bench.cupy_cases import Case, cupy_case
from cudask_bench.measure import BenchFailure, Measurement, Step, traffic_between
from cudask_bench.spec import INPUT_SUFFIX, TOTAL_SUFFIX
from cudask_bench.tasks import (
    expected_sum,
    io_counters,
    make_chunk,
    sum_chunk,
    synchronize,
    verify_chunk,
)

ProgressFn = Callable[[str], None]


def _wait_device(client: Any, module: str) -> None:
    client.run(synchronize, module)


def _known_to_scheduler(dask_scheduler: Any, keys: list[Any]) -> int:
    return sum(1 for key in keys if key in dask_scheduler.tasks)


def _await_forgotten(client: Any, keys: list[Any], timeout: float = 60.0) -> None:
    """Wait until the scheduler has forgotten `keys` (results just released).

    The next repetition builds the same keys; a release still in flight would let
    it find them in memory and time nothing (docs/design/benchmarks.md)."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_known_to_scheduler, keys=keys):
        if time.monotonic() > deadline:
            raise BenchFailure(f"the scheduler still holds results {timeout:.0f} s after release")
        time.sleep(0.005)


def _drain(client: Any, timeout: float = 120.0) -> None:
    """Wait until the worker holds no keys, so one repetition cannot overlap the next."""
    deadline = time.monotonic() + timeout
    while True:
        held = client.run(lambda dask_worker: len(dask_worker.data))
        if not any(held.values()):
            return
        if time.monotonic() > deadline:
            raise BenchFailure(f"workers still hold {held} keys {timeout:.0f} s after release")
        time.sleep(0.05)


# --------------------------------------------------------------------------- spill


def spill_base(repetition: int, index: int, chunks: int) -> int:
    """The fill base of chunk `index` in repetition `repetition`; distinct per chunk."""
    return (repetition * chunks + index + 1) << 32


def _io(client: Any) -> dict[str, int]:
    """The workers' I/O counters, summed (cudask_bench.tasks.io_counters)."""
    total: dict[str, int] = {}
    for counters in client.run(io_counters).values():
        for key, value in counters.items():
            total[key] = total.get(key, 0) + value
    return total


def _timed(
    client: Any, module: str, submit: Callable[..., Any], *args: Any
) -> tuple[float, Any, dict[str, int]]:
    """Seconds from `submit(*args)` to its results (device synchronized), the results,
    and the workers' I/O meanwhile (counters read before and after, outside the time)."""
    before = _io(client)
    start = time.perf_counter()
    results = submit(*args)
    _wait_device(client, module)
    seconds = time.perf_counter() - start
    return seconds, results, traffic_between(before, _io(client))


def _create(client: Any, module: str, bases: list[int], elements: int, rep: int) -> list[Any]:
    from distributed import wait

    futures = [
        client.submit(make_chunk, module, base, elements, key=f"bench-chunk-{rep}-{i}")
        for i, base in enumerate(bases)
    ]
    wait(futures)
    return futures


def _verify(
    client: Any, module: str, futures: list[Any], bases: list[int], elements: int, rep: int
) -> list[str | None]:
    """What is wrong with each chunk (None: every element right)."""
    checks = [
        client.submit(verify_chunk, fut, module, base, elements, key=f"bench-verify-{rep}-{i}")
        for i, (fut, base) in enumerate(zip(futures, bases, strict=True))
    ]
    return [
        None if n == 0 else "wrong shape/dtype" if n < 0 else f"{n} of {elements} differ"
        for n in client.gather(checks)
    ]


def _sum(
    client: Any, module: str, futures: list[Any], bases: list[int], elements: int, rep: int
) -> list[str | None]:
    """What is wrong with each chunk's sum (None: its closed form)."""
    sums = client.gather(
        [
            client.submit(sum_chunk, fut, module, key=f"bench-sum-{rep}-{i}")
            for i, fut in enumerate(futures)
        ]
    )
    return [
        None
        if got == expected_sum(base, elements)
        else f"sum {got}, expected {expected_sum(base, elements)}"
        for got, base in zip(sums, bases, strict=True)
    ]


def _check(what: str, problems: list[str | None]) -> None:
    bad = [(i, why) for i, why in enumerate(problems) if why is not None]
    if bad:
        shown = ", ".join(f"chunk {i}: {why}" for i, why in bad[:5])
        raise BenchFailure(f"spill {what} failed in {len(bad)} of {len(problems)} chunks ({shown})")


def run_spill(
    client: Any,
    *,
    module: str,
    total: int,
    chunk_size: int,
    steps: Sequence[Step],
    progress: ProgressFn,
) -> dict[str, Measurement]:
    """Per step, create total/chunk_size chunks, read them all back and verify every
    element, then read them all back again and sum each: `create<suffix>`,
    `read_verify<suffix>` and `read_sum<suffix>` per step's suffix, each with the
    worker's disk I/O during it."""
    chunks = total // chunk_size
    elements = chunk_size // 8
    nbytes = chunks * elements * 8
    params = {"chunks": chunks, "chunk_size": elements * 8, "total": nbytes, "dtype": "uint64"}
    measured: dict[str, Measurement] = {}

    def record(name: str, step: Step, seconds: float, traffic: dict[str, int]) -> None:
        m = measured.setdefault(
            name + step.suffix, Measurement(nbytes=nbytes, parameters=dict(params))
        )
        m.record(seconds, step.warmup, traffic)

    for rep, step in enumerate(steps):
        bases = [spill_base(rep, i, chunks) for i in range(chunks)]
        seconds, futures, traffic = _timed(
            client, module, _create, client, module, bases, elements, rep
        )
        record("create", step, seconds, traffic)
        progress(f"create {step.label}")
        for name, what, label, passed in (
            ("read_verify", "read-back verification", "read+verify", _verify),
            ("read_sum", "read-back sum", "read+sum", _sum),
        ):
            seconds, problems, traffic = _timed(
                client, module, passed, client, module, futures, bases, elements, rep
            )
            record(name, step, seconds, traffic)
            progress(f"{label} {step.label}")
            _check(what, problems)
        del futures
        _drain(client)
    for m in measured.values():
        m.check = (
            f"all {chunks} chunks x {elements} elements equal base+index, and each "
            "chunk's sum its closed form, in every run"
        )
    return measured


# --------------------------------------------------------------------------- cupy


def run_cupy(
    client: Any,
    *,
    module: str,
    operations: Sequence[str],
    shapes: dict[str, dict[str, Any]],
    steps: Sequence[Step],
    progress: ProgressFn,
    time_input: bool = False,
) -> dict[str, Measurement]:
    """The operations one after the other in one cluster (`run_operation` each)."""
    results: dict[str, Measurement] = {}
    for op in operations:
        results.update(
            run_operation(
                client,
                module=module,
                op=op,
                shape=shapes[op],
                steps=steps,
                progress=progress,
                time_input=time_input,
            )
        )
    return results


def _metric_names(op: str, steps: Sequence[Step], time_input: bool) -> list[str]:
    names = list(dict.fromkeys(op + step.suffix for step in steps))
    if time_input and names:
        names[1:1] = [op + TOTAL_SUFFIX]
        names.insert(0, op + INPUT_SUFFIX)
    return names


def _random_input(module: str, op: str, shape: dict[str, Any]) -> list[Any]:
    """The operation's random input arrays, as graphs (nothing submitted yet)."""
    import dask.array as da

    xp = importlib.import_module(module)
    rs = da.random.RandomState(seed=1234, RandomState=xp.random.RandomState)
    if shape.get("second"):
        dims = (shape["size"], shape["second"])
        chunks: Any = (shape["chunk"], shape["second"])
    else:
        dims = (shape["size"], shape["size"])
        chunks = shape["chunk"]
    return [rs.random(dims, chunks=chunks) for _ in range(2 if op == "dot" else 1)]


def run_operation(
    client: Any,
    *,
    module: str,
    op: str,
    shape: dict[str, Any],
    steps: Sequence[Step],
    progress: ProgressFn,
    time_input: bool = False,
) -> dict[str, Measurement]:
    """Time one dask.array operation on persisted random input, once per step; check
    the last result once, untimed.

    The input is created and persisted first, untimed, or with `time_input` timed
    from its first submit as `<op>_input` (counted as the first step's warm-up or
    not), with `<op>_total` = `<op>_input` + the first step's time. A failure
    fails every metric of the operation and is not raised: the next operation runs.
    """
    import dask
    from distributed import futures_of, wait

    results = {
        name: Measurement(parameters={"expression": op, **shape, "dtype": "float64"})
        for name in _metric_names(op, steps, time_input)
    }
    inputs: list[Any] = []
    case: Case | None = None
    persisted: tuple[Any, ...] = ()
    expr: Any = None
    try:
        arrays = _random_input(module, op, shape)
        start = time.perf_counter()
        inputs = [array.persist() for array in arrays]
        wait(inputs)
        _wait_device(client, module)
        if time_input:
            results[op + INPUT_SUFFIX].record(time.perf_counter() - start, steps[0].warmup)
            progress(f"{op} input")
        case = cupy_case(op, inputs, shape)
        check = ""
        for rep, step in enumerate(steps):
            expr = case.build()
            start = time.perf_counter()
            persisted = dask.persist(*expr) if isinstance(expr, tuple) else (expr.persist(),)
            wait([f for p in persisted for f in futures_of(p)])
            _wait_device(client, module)
            results[op + step.suffix].record(time.perf_counter() - start, step.warmup)
            if rep == len(steps) - 1:
                check = case.check(persisted if isinstance(expr, tuple) else persisted[0])
            keys = [f.key for p in persisted for f in futures_of(p)]
            persisted, expr = (), None
            _await_forgotten(client, keys)
            progress(f"{op} {step.label}")
        for m in results.values():
            m.check = check
        if time_input:
            _add_total(results, op, op + steps[0].suffix)
    except Exception as exc:  # noqa: BLE001 - one failing operation must not hide the rest
        _fail_all(results, f"{type(exc).__name__}: {exc}")
        progress(f"{op} failed")
    finally:
        # drop every reference to futures before waiting for the worker to empty
        inputs, case, persisted, expr = [], None, (), None
        try:
            _drain(client)
        except Exception as exc:  # noqa: BLE001
            _fail_all(results, f"{type(exc).__name__}: {exc}")
    return results


def _add_total(results: dict[str, Measurement], op: str, first: str) -> None:
    """`<op>_total`: each process's input time plus its first run's time."""
    total, parts = results[op + TOTAL_SUFFIX], (results[op + INPUT_SUFFIX], results[first])
    total.times = [a + b for a, b in zip(parts[0].times, parts[1].times, strict=True)]
    total.warmup_times = [
        a + b for a, b in zip(parts[0].warmup_times, parts[1].warmup_times, strict=True)
    ]


def _fail_all(results: dict[str, Measurement], error: str) -> None:
    for m in results.values():
        if m.status == "ok":
            m.fail(error)


__all__ = ["run_cupy", "run_operation", "run_spill", "spill_base"]
