"""cuDF frames between two workers of one GPU by CUDA IPC, and the explicit-comms
shuffle and merge of dask-cuDF frames, on a real GPU with cuDF installed (scripts/gpu-proof's
`cudf` step runs this file with the cuDF bundle importable)."""

from __future__ import annotations

import sys
from typing import Any

import cloudpickle
import pytest

from cudask.testing.processes import worker_processes

# Functions below run on worker processes that cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.gpu


def _frame(seed: int, rows: int) -> Any:
    import cudf
    import cupy

    rng = cupy.random.RandomState(seed)
    return cudf.DataFrame({"key": rng.randint(0, 1000, size=rows).astype("i8"),
                           "value": rng.standard_normal(rows), "flag": rng.randint(0, 2, size=rows) > 0,
                           "text": cudf.Series(["x"] * rows)})


def _digest(frame: Any) -> tuple[int, float, int, int]:
    return (len(frame), float(frame["value"].sum()), int(frame["key"].sum()), int(frame["flag"].sum()))


def _ipc_stats() -> dict[str, float]:
    from cudask.comm import ipc

    return ipc.stats()


def test_cudf_frames_go_by_handle() -> None:
    pytest.importorskip("cudf")
    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        x = client.submit(_frame, 1, 4_000_000, workers=[a], pure=False)
        there = client.submit(_digest, x, workers=[a], pure=False).result(timeout=60)
        here = client.submit(_digest, x, workers=[b], pure=False).result(timeout=60)
        stats = client.run(_ipc_stats)
    assert there == here
    assert stats[a]["sent"] == stats[b]["received"] == 1, stats
    assert stats[b]["received-bytes"] >= 4_000_000 * (8 + 8 + 1), stats


def test_explicit_shuffle_of_dask_cudf_frames() -> None:
    pytest.importorskip("dask_cudf")
    import dask.dataframe as dd

    from cudask.bench.shuffle import _distinct_keys, _partition
    from cudask.comm.explicit import shuffle

    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        df = dd.from_map(_partition, range(8), rows=500_000, module="cudf", meta=_partition(0, 0, "cudf"))
        out = shuffle(df, "key", client=client)
        parts = client.compute(out.to_delayed(), sync=True)
        assert sum(_distinct_keys(p) for p in parts) == int(df["key"].nunique().compute())
        ours = out.compute().sort_values("value").reset_index(drop=True)
        theirs = df.shuffle(on="key", shuffle_method="tasks").compute().sort_values("value")
        assert ours.equals(theirs.reset_index(drop=True)) and len(ours) == 4_000_000
        stats = client.run(_ipc_stats)
    assert sum(s["received"] for s in stats.values()) >= 2, stats  # pieces crossed by handle


def _orders(i: int) -> Any:
    import cudf
    import cupy

    rng = cupy.random.RandomState(i)
    return cudf.DataFrame({"key": rng.randint(0, 300_000, size=200_000).astype("i8"),
                           "amount": rng.standard_normal(200_000)})


def _customers(i: int) -> Any:
    import cudf
    import cupy

    keys = cupy.arange(i * 100_000, (i + 1) * 100_000, 2, dtype="i8")
    return cudf.DataFrame({"key": keys, "score": keys.astype("f8") / 7})


def test_explicit_merge_of_dask_cudf_frames() -> None:
    pytest.importorskip("dask_cudf")
    import dask.dataframe as dd

    from cudask.comm.explicit import merge

    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        orders = dd.from_map(_orders, range(4), meta=_orders(0).iloc[:0])
        customers = dd.from_map(_customers, range(3), meta=_customers(0).iloc[:0])
        ours = merge(orders, customers, "key", how="left", client=client).compute()
        theirs = orders.compute().merge(customers.compute(), on="key", how="left")
    order = ["key", "amount"]
    assert ours.sort_values(order).reset_index(drop=True).equals(theirs.sort_values(order).reset_index(drop=True))
