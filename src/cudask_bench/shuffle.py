"""DataFrame shuffles between workers, for `cudask bench transfer`.

Covers: `frame_shuffle(client, rows, partitions, method, module)`: a DataFrame of `rows`
rows (an int64 key drawn from `KEYS` values, a float64 value 0 .. rows-1) made on the
workers in `partitions` partitions and held there, then shuffled on the key by `method`
(one of `METHODS`: dask's task-based shuffle, distributed's P2P shuffle, or cudask's
explicit-comms shuffle, cudask.comm.explicit), timed from the submit of the shuffle
until every output partition is held, and checked: every row kept (count and sum of
values) and every key in one output partition only; with the worker counters that moved
while it ran (cudask_bench.counters). `module` is "cudf" (dask-cuDF frames, the
benchmark) or "pandas" (host frames, for the CPU tests). A method that fails is recorded
with its error.

Does not cover: the clusters and the report (cudask_bench.transfer), which method dask
picks when none is named. Threading: called from the command's thread.
"""

from __future__ import annotations

import time
from typing import Any

from cudask_bench.counters import difference, worker_counters

KEYS = 1 << 20
METHODS = ("tasks", "p2p", "explicit")
MODULES = ("cudf", "pandas")


def _partition(i: int, rows: int, module: str) -> Any:
    if module == "cudf":
        import cudf as frames
        import cupy as xp
    else:
        import numpy as xp
        import pandas as frames
    keys = xp.random.RandomState(i).randint(0, KEYS, size=rows).astype("i8")
    values = xp.arange(i * rows, (i + 1) * rows, dtype="f8")
    return frames.DataFrame({"key": keys, "value": values})


def _distinct_keys(frame: Any) -> int:
    return int(frame["key"].nunique())


def _moved(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per worker, how much each counter that changed went up or down from `before` to
    `after` (rates, "-gbps", are left out: their difference means nothing)."""
    out = {}
    for worker, now in after.items():
        moved = difference(before.get(worker, {}), now)
        if moved:
            out[worker] = moved
    return out


def frame_shuffle(
    client: Any, rows: int, partitions: int, method: str, module: str = "cudf"
) -> dict[str, Any]:
    """Shuffle `rows` rows in `partitions` partitions on `client`'s workers by `method`."""
    if method not in METHODS or module not in MODULES:
        raise ValueError(f"method={method!r}, module={module!r}; accepted: {METHODS} and {MODULES}")
    import dask
    import dask.dataframe as dd
    from distributed import wait

    per = rows // partitions
    total = per * partitions
    out: dict[str, Any] = {
        "method": method,
        "rows": total,
        "partitions": partitions,
        "bytes": total * 16,
    }
    try:
        frame = client.persist(
            dd.from_map(
                _partition,
                range(partitions),
                rows=per,
                module=module,
                meta=_partition(0, 0, module),
                enforce_metadata=False,
            )
        )
        wait(frame)
        before = client.run(worker_counters)
        start = time.perf_counter()
        if method == "explicit":
            from cudask.comm.explicit import shuffle

            shuffled = shuffle(
                frame, "key", client=client
            )  # eager: returns with the partitions held
        else:
            shuffled = client.persist(frame.shuffle(on="key", shuffle_method=method))
            wait(shuffled)
        out["seconds"] = time.perf_counter() - start
        out["workers"] = _moved(before, client.run(worker_counters))
        out["GBps"] = total * 16 / out["seconds"] / 1e9
        count, value_sum, distinct = dask.compute(
            shuffled.shape[0], shuffled["value"].sum(), frame["key"].nunique()
        )
        held = client.compute(
            [dask.delayed(_distinct_keys)(p) for p in shuffled.to_delayed()], sync=True
        )
    except Exception as exc:  # noqa: BLE001 - recorded; the run goes on to the next method
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    expected = total * (total - 1) / 2
    out["rows_ok"] = int(count) == total and abs(float(value_sum) - expected) <= 1e-9 * max(
        expected, 1
    )
    out["keys_ok"] = sum(held) == int(distinct)
    return out
