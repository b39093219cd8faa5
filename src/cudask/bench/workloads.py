"""The benchmark workloads, written against a dask Client and an array module.

Covers: the `spill` workload (create N device chunks with a deterministic
fill, then read every chunk back and compare every element on the device with
the value it must hold), the `cupy` dask.array operations (transpose_sum, dot,
svd, sum, mean, slice, map_overlap) with a result check after the timed runs,
and the task functions both submit to workers. The same code runs on every
backend (cudask, dask-cuda, a plain dict store): it imports no cluster, only
dask, distributed, NumPy and, on the worker, the array module by name
("cupy", or "numpy" to exercise the harness without a GPU).

Timing rule: a timed region is submit -> every result done -> device
synchronized; building graphs before it and checking results after it are
not timed. Progress is reported only between timed regions.

A runner process runs a workload as a list of `Step`s (`schedule`): in warm
mode its warm-ups and measured repetitions, all recorded as `<metric>_warm`; in
cold mode the first run on its fresh cluster (`<metric>`), then the warm runs
in the same cluster (`<metric>_warm`). Cold cupy runs also time the input
(`<op>_input`) and report `<op>_total` = `<op>_input` + `<op>`.

Does not cover: starting clusters (one per cold cupy operation) or writing
results (cudask.bench.run).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cudask.bench.spec import INPUT_SUFFIX, MODES, TOTAL_SUFFIX, WARM_SUFFIX

ProgressFn = Callable[[str], None]


class BenchFailure(RuntimeError):
    """A workload produced a wrong result or could not run; the message says which."""


# --------------------------------------------------------------------------- worker side


def _xp(name: str) -> Any:
    return importlib.import_module(name)


def make_chunk(module: str, base: int, elements: int) -> Any:
    """A uint64 chunk whose element j holds base + j (runs on the worker)."""
    xp = _xp(module)
    chunk = xp.arange(elements, dtype=xp.uint64)
    chunk += xp.uint64(base)
    return chunk


def first_array_task(module: str) -> int:
    """The first array a fresh worker computes: sum(0..1023) on its device (runs on
    the worker; `startup` times it, imports included)."""
    xp = _xp(module)
    return int(xp.arange(1024, dtype=xp.int64).sum())


def verify_chunk(chunk: Any, module: str, base: int, elements: int) -> int:
    """How many elements of `chunk` differ from base + j; -1 for a wrong shape or dtype."""
    xp = _xp(module)
    if tuple(chunk.shape) != (elements,) or str(chunk.dtype) != "uint64":
        return -1
    expected = xp.arange(elements, dtype=xp.uint64)
    expected += xp.uint64(base)
    return int(xp.count_nonzero(chunk != expected))


def synchronize(module: str) -> None:
    """Wait for every kernel and copy queued on the worker's device."""
    if module == "cupy":
        _xp("cupy").cuda.Device().synchronize()


def to_numpy(block: Any) -> np.ndarray:
    """A host copy of a device block (identity for NumPy blocks)."""
    if isinstance(block, np.ndarray):
        return block
    if hasattr(block, "__cuda_array_interface__") and hasattr(block, "get"):
        return np.asarray(block.get())
    return np.asarray(block)


def stencil(block: Any) -> Any:
    """Five-point Laplacian of a 2-D block (dispatches to CuPy through NumPy's protocols)."""
    return (
        4 * block
        - np.roll(block, 1, axis=0)
        - np.roll(block, -1, axis=0)
        - np.roll(block, 1, axis=1)
        - np.roll(block, -1, axis=1)
    )


def store_facts(dask_worker: Any) -> dict[str, Any]:
    """What the worker's data store is and what it counted (runs on the worker)."""
    import sys

    data = dask_worker.data
    facts: dict[str, Any] = {
        "data_type": f"{type(data).__module__}.{type(data).__qualname__}",
        "keys": len(data),
        "cudask_modules": sorted(m for m in sys.modules if m.split(".")[0] == "cudask"),
    }
    metrics = getattr(data, "cumulative_metrics", None)
    if metrics is not None:
        try:
            facts["cumulative_metrics"] = {
                "/".join(str(part) for part in (k if isinstance(k, tuple) else (k,))): v
                for k, v in dict(metrics).items()
            }
        except Exception as exc:  # noqa: BLE001 - a store's metrics must not fail the run
            facts["cumulative_metrics_error"] = repr(exc)
    return facts


def device_facts(module: str) -> dict[str, Any]:
    """The device the worker computes on (runs on the worker)."""
    import os

    facts: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if module == "cupy":
        cupy = _xp("cupy")
        device = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props.get("name", b"")
        facts.update(
            name=name.decode() if isinstance(name, bytes) else str(name),
            pci_bus_id=device.pci_bus_id,
            memory_total=int(device.mem_info[1]),
            cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
        )
    return facts


# --------------------------------------------------------------------------- results


@dataclasses.dataclass
class Measurement:
    """The timings of one metric of one variant, in seconds."""

    times: list[float] = dataclasses.field(default_factory=list)
    warmup_times: list[float] = dataclasses.field(default_factory=list)
    nbytes: int | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "ok"
    error: str | None = None
    check: str | None = None

    def record(self, seconds: float, warmup: bool) -> None:
        (self.warmup_times if warmup else self.times).append(seconds)

    def fail(self, error: str) -> None:
        self.status = "failed"
        self.error = error

    def to_json(self) -> dict[str, Any]:
        return summarize(
            {
                "unit": "s",
                "times": self.times,
                "warmup_times": self.warmup_times,
                "bytes": self.nbytes,
                "parameters": self.parameters,
                "status": self.status,
                "error": self.error,
                "check": self.check,
            }
        )


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """Add median/min/max (and GB/s where bytes are known) to a measurement entry."""
    times = [float(t) for t in entry.get("times") or []]
    entry["median"] = statistics.median(times) if times else None
    entry["min"] = min(times) if times else None
    entry["max"] = max(times) if times else None
    nbytes = entry.get("bytes")
    median = entry["median"]
    entry["gbps"] = nbytes / median / 1e9 if nbytes and median else None
    return entry


@dataclasses.dataclass(frozen=True)
class Step:
    """One run of a workload in a runner process.

    `suffix` is added to the workload's metric names ("" for a cold run, `_warm`
    for a steady-state one); `warmup` keeps the time out of every median;
    `label` is the progress text.
    """

    suffix: str
    warmup: bool
    label: str


def schedule(mode: str, *, warmup: int, repeat: int, warm_runs: int) -> list[Step]:
    """The runs one runner process makes of a spill or cupy workload.

    warm: `warmup` unmeasured then `repeat` measured repetitions, all `_warm`.
    cold: the first run of a fresh cluster, then `warm_runs` runs (`_warm`) in the
    same cluster; `repeat` is not used (the harness starts a process per
    repetition) and the whole process is a warm-up when `warmup` > 0, as for
    startup.
    """
    if mode == "warm":
        return [Step(WARM_SUFFIX, True, f"warm-up {i + 1}/{warmup}") for i in range(warmup)] + [
            Step(WARM_SUFFIX, False, f"run {i + 1}/{repeat}") for i in range(repeat)
        ]
    if mode == "cold":
        unmeasured = warmup > 0
        prefix = "warm-up process, " if unmeasured else ""
        return [Step("", unmeasured, f"{prefix}cold")] + [
            Step(WARM_SUFFIX, unmeasured, f"{prefix}warm {i + 1}/{warm_runs}")
            for i in range(warm_runs)
        ]
    raise BenchFailure(f"mode {mode!r} is not known; accepted: {', '.join(MODES)}")


def _wait_device(client: Any, module: str) -> None:
    client.run(synchronize, module)


def _known_to_scheduler(dask_scheduler: Any, keys: list[Any]) -> int:
    return sum(1 for key in keys if key in dask_scheduler.tasks)


def _await_forgotten(client: Any, keys: list[Any], timeout: float = 60.0) -> None:
    """Wait until the scheduler has forgotten `keys` (results just released).

    The next repetition builds the same keys; a release still in flight would let
    it find them in memory and time nothing (seen on an H100: `dot` in 10 ms)."""
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


def run_spill(
    client: Any,
    *,
    module: str,
    total: int,
    chunk_size: int,
    steps: Sequence[Step],
    progress: ProgressFn,
) -> dict[str, Measurement]:
    """Per step, create total/chunk_size chunks, then read them all back and verify
    every element; `create<suffix>` and `read_verify<suffix>` per step's suffix."""
    from distributed import wait

    chunks = total // chunk_size
    elements = chunk_size // 8
    nbytes = chunks * elements * 8
    params = {"chunks": chunks, "chunk_size": elements * 8, "total": nbytes, "dtype": "uint64"}
    measured: dict[str, Measurement] = {}

    def metric(name: str) -> Measurement:
        return measured.setdefault(name, Measurement(nbytes=nbytes, parameters=dict(params)))

    for rep, step in enumerate(steps):
        bases = [spill_base(rep, i, chunks) for i in range(chunks)]

        start = time.perf_counter()
        futures = [
            client.submit(make_chunk, module, base, elements, key=f"bench-chunk-{rep}-{i}")
            for i, base in enumerate(bases)
        ]
        wait(futures)
        _wait_device(client, module)
        metric("create" + step.suffix).record(time.perf_counter() - start, step.warmup)
        progress(f"create {step.label}")

        start = time.perf_counter()
        checks = [
            client.submit(verify_chunk, fut, module, base, elements, key=f"bench-verify-{rep}-{i}")
            for i, (fut, base) in enumerate(zip(futures, bases))
        ]
        mismatches = client.gather(checks)
        metric("read_verify" + step.suffix).record(time.perf_counter() - start, step.warmup)
        progress(f"read+verify {step.label}")

        bad = [(i, n) for i, n in enumerate(mismatches) if n != 0]
        if bad:
            shown = ", ".join(
                f"chunk {i}: " + ("wrong shape/dtype" if n < 0 else f"{n} of {elements} differ")
                for i, n in bad[:5]
            )
            raise BenchFailure(
                f"spill read-back verification failed in {len(bad)} of {chunks} chunks ({shown})"
            )
        del futures, checks
        _drain(client)
    for m in measured.values():
        m.check = f"all {chunks} chunks x {elements} elements equal base+index in every run"
    return measured


# --------------------------------------------------------------------------- cupy


def _host(array: Any) -> np.ndarray:
    """Compute a small dask array and bring it to the client as NumPy."""
    meta = np.empty((0,) * array.ndim, dtype=array.dtype)
    return np.asarray(array.map_blocks(to_numpy, meta=meta).compute())


def _close(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)


@dataclasses.dataclass
class _Case:
    build: Callable[[], Any]
    check: Callable[[Any], str]


def _cupy_case(op: str, inputs: Sequence[Any], shape: dict[str, Any]) -> _Case:
    import dask.array as da

    x = inputs[0]
    n = shape["size"]

    def uniform_check(value: float, count: int, what: str) -> str:
        mean = value / count if what == "sum" else value
        tol = max(1e-6, 6 * math.sqrt(1 / 12) / math.sqrt(count))
        if not abs(mean - 0.5) <= tol:
            raise BenchFailure(
                f"{op}: mean of uniform [0, 1) data is {mean}, expected 0.5 +- {tol:.2g}"
            )
        return f"{what} consistent with uniform [0, 1) data (mean {mean:.6f})"

    if op == "transpose_sum":

        def check(res: Any) -> str:
            got = float(_host(res))
            want = 2 * float(_host(x.sum()))
            if not _close(got, want, 1e-9):
                raise BenchFailure(
                    f"transpose_sum: (x + x.T).sum() = {got}, expected 2 * x.sum() = {want}"
                )
            return "equals 2 * x.sum()"

        return _Case(lambda: (x + x.T).sum(), check)
    if op == "sum":
        return _Case(lambda: x.sum(), lambda res: uniform_check(float(_host(res)), n * n, "sum"))
    if op == "mean":
        return _Case(lambda: x.mean(), lambda res: uniform_check(float(_host(res)), n * n, "mean"))
    if op == "dot":
        y = inputs[1]

        def check(res: Any) -> str:
            i, j = n // 2, n // 3
            got = float(_host(res[i, j]))
            want = float(np.dot(_host(x[i, :]), _host(y[:, j])))
            if not _close(got, want, 1e-9):
                raise BenchFailure(f"dot: result[{i}, {j}] = {got}, expected {want}")
            return f"result[{i}, {j}] equals row . column"

        return _Case(lambda: x.dot(y), check)
    if op == "svd":

        def check(res: Any) -> str:
            u, s, v = res
            m = shape["second"]
            if u.shape != (n, m) or s.shape != (m,) or v.shape != (m, m):
                raise BenchFailure(
                    f"svd: shapes {u.shape}, {s.shape}, {v.shape} for x of {x.shape}"
                )
            frob = float(_host((x**2).sum()))
            ssq = float((_host(s) ** 2).sum())
            if not _close(frob, ssq, 1e-8):
                raise BenchFailure(f"svd: sum(s**2) = {ssq}, expected ||x||_F**2 = {frob}")
            return "sum(s**2) equals ||x||_F**2"

        return _Case(lambda: da.linalg.svd(x), check)
    if op == "slice":

        def check(res: Any) -> str:
            want = _host(x[: 3 * 4 : 3, : 2 * 4 : 2])
            got = _host(res[:4, :4])
            if res.shape != x[::3, ::2].shape or not np.array_equal(got, want):
                raise BenchFailure("slice: x[::3, ::2] does not hold x's strided elements")
            return "strided elements equal x's"

        return _Case(lambda: x[::3, ::2], check)
    if op == "map_overlap":

        def check(res: Any) -> str:
            c = shape["chunk"]
            i, j = min(c, n - 2), min(c, n - 2)  # on a chunk boundary where one exists
            window = _host(x[i - 1 : i + 2, j - 1 : j + 2])
            want = 4 * window[1, 1] - window[0, 1] - window[2, 1] - window[1, 0] - window[1, 2]
            got = float(_host(res[i, j]))
            if not _close(got, float(want), 1e-9):
                raise BenchFailure(f"map_overlap: stencil at [{i}, {j}] = {got}, expected {want}")
            return f"stencil at chunk boundary [{i}, {j}] correct"

        return _Case(lambda: x.map_overlap(stencil, depth=1, boundary="reflect"), check)
    raise BenchFailure(f"unknown cupy operation {op!r}")


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
            run_operation(client, module=module, op=op, shape=shapes[op], steps=steps,
                          progress=progress, time_input=time_input)
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

    xp = _xp(module)
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
    case: _Case | None = None
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
        case = _cupy_case(op, inputs, shape)
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


__all__ = [
    "BenchFailure",
    "Measurement",
    "Step",
    "device_facts",
    "make_chunk",
    "run_cupy",
    "run_operation",
    "run_spill",
    "schedule",
    "spill_base",
    "stencil",
    "store_facts",
    "summarize",
    "synchronize",
    "to_numpy",
    "verify_chunk",
]
