"""cuDF frames between two workers of one GPU by CUDA IPC, and the explicit-comms
shuffle and merge of dask-cuDF frames, on a real GPU with cuDF installed (skipped without it)."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from cudask.testing import workers_info
from cudask.testing.frames import customers, frame_summary, orders, random_frame
from cudask.testing.processes import worker_processes

# client.run pickles its function by value (the graphs' functions come from
# cudask.testing.frames: a worker process cannot import this module).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.gpu


def _ipc_stats() -> dict[str, float]:
    from cudask.comm import ipc

    return ipc.stats()


def test_cudf_frames_go_by_handle() -> None:
    pytest.importorskip("cudf")
    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        a, b = sorted(workers_info(client))
        x = client.submit(random_frame, 1, 4_000_000, workers=[a], pure=False)
        there = client.submit(frame_summary, x, workers=[a], pure=False).result(timeout=60)
        here = client.submit(frame_summary, x, workers=[b], pure=False).result(timeout=60)
        stats = client.run(_ipc_stats)
    assert there == here
    assert stats[a]["sent"] == stats[b]["received"] == 1, stats
    assert stats[b]["received-bytes"] >= 4_000_000 * (8 + 8 + 1), stats


def test_explicit_shuffle_of_dask_cudf_frames() -> None:
    pytest.importorskip("dask_cudf")
    import dask.dataframe as dd

    from cudask.comm.explicit import shuffle
    from cudask_bench.shuffle import _distinct_keys, _partition

    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        df = dd.from_map(
            _partition, range(8), rows=500_000, module="cudf", meta=_partition(0, 0, "cudf")
        )
        out = shuffle(df, "key", client=client)
        parts = client.compute(out.to_delayed(), sync=True)
        assert sum(_distinct_keys(p) for p in parts) == int(df["key"].nunique().compute())
        ours = out.compute().sort_values("value").reset_index(drop=True)
        theirs = df.shuffle(on="key", shuffle_method="tasks").compute().sort_values("value")
        assert ours.equals(theirs.reset_index(drop=True)) and len(ours) == 4_000_000
        stats = client.run(_ipc_stats)
    assert sum(s["received"] for s in stats.values()) >= 2, stats  # pieces crossed by handle


def test_explicit_merge_of_dask_cudf_frames() -> None:
    pytest.importorskip("dask_cudf")
    import dask.dataframe as dd

    from cudask.comm.explicit import merge

    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        left = dd.from_map(orders, range(4), meta=orders(0).iloc[:0])
        right = dd.from_map(customers, range(3), meta=customers(0).iloc[:0])
        ours = merge(left, right, "key", how="left", client=client).compute()
        theirs = left.compute().merge(right.compute(), on="key", how="left")
    order = ["key", "amount"]
    assert (
        ours.sort_values(order)
        .reset_index(drop=True)
        .equals(theirs.sort_values(order).reset_index(drop=True))
    )
