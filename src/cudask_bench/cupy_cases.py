"""The cupy operations of `cudask bench cupy`: how each is built and how its result is checked.

Covers: `cupy_case(op, inputs, shape)`, the `Case` of one operation of
spec.CUPY_OPERATIONS on its persisted random input: `build()` returns the dask
expression the workload times, `check(result)` verifies the result once after the
timed runs (untimed) and returns what was checked, raising BenchFailure when it is
wrong. Checks bring only small pieces to the client (`host`). Does not cover: creating
the input, timing, clusters (cudask_bench.workloads). Threading: a case is used by the
runner's main thread only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cudask_bench.measure import BenchFailure
from cudask_bench.tasks import stencil, to_numpy


def host(array: Any) -> np.ndarray:
    """Compute a small dask array and bring it to the client as NumPy."""
    meta = np.empty((0,) * array.ndim, dtype=array.dtype)
    return np.asarray(array.map_blocks(to_numpy, meta=meta).compute())


def _close(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)


@dataclasses.dataclass
class Case:
    build: Callable[[], Any]
    check: Callable[[Any], str]


def _uniform_check(op: str, value: float, count: int, what: str) -> str:
    mean = value / count if what == "sum" else value
    tol = max(1e-6, 6 * math.sqrt(1 / 12) / math.sqrt(count))
    if not abs(mean - 0.5) <= tol:
        raise BenchFailure(
            f"{op}: mean of uniform [0, 1) data is {mean}, expected 0.5 +- {tol:.2g}"
        )
    return f"{what} consistent with uniform [0, 1) data (mean {mean:.6f})"


def _transpose_sum(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x = inputs[0]

    def check(res: Any) -> str:
        got = float(host(res))
        want = 2 * float(host(x.sum()))
        if not _close(got, want, 1e-9):
            raise BenchFailure(
                f"transpose_sum: (x + x.T).sum() = {got}, expected 2 * x.sum() = {want}"
            )
        return "equals 2 * x.sum()"

    return Case(lambda: (x + x.T).sum(), check)


def _sum(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x, n = inputs[0], shape["size"]
    return Case(lambda: x.sum(), lambda res: _uniform_check("sum", float(host(res)), n * n, "sum"))


def _mean(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x, n = inputs[0], shape["size"]
    return Case(
        lambda: x.mean(), lambda res: _uniform_check("mean", float(host(res)), n * n, "mean")
    )


def _dot(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x, y, n = inputs[0], inputs[1], shape["size"]

    def check(res: Any) -> str:
        i, j = n // 2, n // 3
        got = float(host(res[i, j]))
        want = float(np.dot(host(x[i, :]), host(y[:, j])))
        if not _close(got, want, 1e-9):
            raise BenchFailure(f"dot: result[{i}, {j}] = {got}, expected {want}")
        return f"result[{i}, {j}] equals row . column"

    return Case(lambda: x.dot(y), check)


def _svd(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    import dask.array as da

    x, n = inputs[0], shape["size"]

    def check(res: Any) -> str:
        u, s, v = res
        m = shape["second"]
        if u.shape != (n, m) or s.shape != (m,) or v.shape != (m, m):
            raise BenchFailure(f"svd: shapes {u.shape}, {s.shape}, {v.shape} for x of {x.shape}")
        frob = float(host((x**2).sum()))
        ssq = float((host(s) ** 2).sum())
        if not _close(frob, ssq, 1e-8):
            raise BenchFailure(f"svd: sum(s**2) = {ssq}, expected ||x||_F**2 = {frob}")
        return "sum(s**2) equals ||x||_F**2"

    return Case(lambda: da.linalg.svd(x), check)


def _slice(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x = inputs[0]

    def check(res: Any) -> str:
        want = host(x[: 3 * 4 : 3, : 2 * 4 : 2])
        got = host(res[:4, :4])
        if res.shape != x[::3, ::2].shape or not np.array_equal(got, want):
            raise BenchFailure("slice: x[::3, ::2] does not hold x's strided elements")
        return "strided elements equal x's"

    return Case(lambda: x[::3, ::2], check)


def _map_overlap(inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    x, n = inputs[0], shape["size"]

    def check(res: Any) -> str:
        c = shape["chunk"]
        i, j = min(c, n - 2), min(c, n - 2)  # on a chunk boundary where one exists
        window = host(x[i - 1 : i + 2, j - 1 : j + 2])
        want = 4 * window[1, 1] - window[0, 1] - window[2, 1] - window[1, 0] - window[1, 2]
        got = float(host(res[i, j]))
        if not _close(got, float(want), 1e-9):
            raise BenchFailure(f"map_overlap: stencil at [{i}, {j}] = {got}, expected {want}")
        return f"stencil at chunk boundary [{i}, {j}] correct"

    return Case(lambda: x.map_overlap(stencil, depth=1, boundary="reflect"), check)


#: How each operation of spec.CUPY_OPERATIONS is built and checked.
CASES: dict[str, Callable[[Sequence[Any], dict[str, Any]], Case]] = {
    "transpose_sum": _transpose_sum,
    "dot": _dot,
    "svd": _svd,
    "sum": _sum,
    "mean": _mean,
    "slice": _slice,
    "map_overlap": _map_overlap,
}


def cupy_case(op: str, inputs: Sequence[Any], shape: dict[str, Any]) -> Case:
    """The case of operation `op` on `inputs` (persisted dask arrays) of `shape`."""
    make = CASES.get(op)
    if make is None:
        raise BenchFailure(f"unknown cupy operation {op!r}")
    return make(inputs, shape)


__all__ = ["CASES", "Case", "cupy_case", "host"]
