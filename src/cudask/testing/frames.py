"""cuDF frames made and summarised on workers, for the tests that move them
between workers (tests/comm/test_ipc_cudf_gpu.py).

Covers: `random_frame(seed, rows)`, a deterministic frame with integer, float,
boolean and string columns; `frame_summary(frame)`, its length and column sums;
`orders(i)` and `customers(i)`, the two sides of a merge test (orders' keys
drawn at random, customers' keys even numbers in a range per partition).

They live in the package, not in a test module, because a task graph names its
functions by reference and a worker process cannot import a test module.
cuDF and CuPy are imported when a function runs. Does not cover: checking results
(the tests compare summaries). Threading: pure functions, run in worker threads.
"""

from __future__ import annotations

from typing import Any


def random_frame(seed: int, rows: int) -> Any:
    """A cuDF frame of `rows` rows (same seed, same values)."""
    import cudf
    import cupy

    rng = cupy.random.RandomState(seed)
    return cudf.DataFrame(
        {
            "key": rng.randint(0, 1000, size=rows).astype("i8"),
            "value": rng.standard_normal(rows),
            "flag": rng.randint(0, 2, size=rows) > 0,
            "text": cudf.Series(["x"] * rows),
        }
    )


def frame_summary(frame: Any) -> tuple[int, float, int, int]:
    """(rows, sum of value, sum of key, count of flag) of a `random_frame`."""
    return (
        len(frame),
        float(frame["value"].sum()),
        int(frame["key"].sum()),
        int(frame["flag"].sum()),
    )


def orders(i: int) -> Any:
    """Partition `i` of the left side of the merge test: 200,000 random keys."""
    import cudf
    import cupy

    rng = cupy.random.RandomState(i)
    return cudf.DataFrame(
        {
            "key": rng.randint(0, 300_000, size=200_000).astype("i8"),
            "amount": rng.standard_normal(200_000),
        }
    )


def customers(i: int) -> Any:
    """Partition `i` of the right side: the even keys of [100,000 i, 100,000 (i + 1))."""
    import cudf
    import cupy

    keys = cupy.arange(i * 100_000, (i + 1) * 100_000, 2, dtype="i8")
    return cudf.DataFrame({"key": keys, "score": keys.astype("f8") / 7})
