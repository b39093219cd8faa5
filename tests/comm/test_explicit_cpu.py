"""cudask.comm.explicit on host frames (pandas), two worker processes over TCP:
every row kept, each key in one output partition, same rows as dask's task
shuffle, nothing left in the workers' buffers; bad input named before any work;
a failing split raises ShuffleError and leaves no buffer behind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pandas")

import dask.dataframe as dd
from distributed import Client, LocalCluster

from cudask.bench.shuffle import _distinct_keys, _partition
from cudask.comm.explicit import NAME, ExplicitComms, ShuffleError, shuffle


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as c:
        yield c


def _frame(partitions: int = 4, rows: int = 5000) -> Any:
    return dd.from_map(_partition, range(partitions), rows=rows, module="pandas",
                       meta=_partition(0, 0, "pandas"))


def _buffers(dask_worker: Any) -> dict:
    return dict(dask_worker.plugins[NAME].buffers)


@pytest.mark.parametrize("npartitions", [None, 5])
def test_rows_kept_and_keys_grouped(client: Any, npartitions: int | None) -> None:
    df = _frame()
    out = shuffle(df, "key", npartitions=npartitions, client=client)
    assert out.npartitions == (npartitions or 4)
    parts = client.compute(out.to_delayed(), sync=True)
    held = sum(_distinct_keys(p) for p in parts)
    assert held == df["key"].nunique().compute()  # no key in two partitions
    ours = out.compute().sort_values("value").reset_index(drop=True)
    theirs = df.shuffle(on="key", shuffle_method="tasks").compute().sort_values("value").reset_index(drop=True)
    assert ours.equals(theirs) and len(ours) == 20000
    assert all(b == {} for b in client.run(_buffers).values())


def test_bad_input_is_named_before_any_work(client: Any) -> None:
    df = _frame()
    with pytest.raises(ValueError, match=r"on='nope': \['nope'\] not among the DataFrame's columns \['key', 'value'\]"):
        shuffle(df, "nope", client=client)
    with pytest.raises(ValueError, match="npartitions=0; accepted: a positive integer"):
        shuffle(df, ["key"], npartitions=0, client=client)


def _broken(i: int) -> Any:
    frame = _partition(i, 1000, "pandas")
    return frame.rename(columns={"key": "other"}) if i == 3 else frame


def test_a_failing_split_raises_and_leaves_no_buffer(client: Any) -> None:
    df = dd.from_map(_broken, range(4), meta=_partition(0, 0, "pandas"), enforce_metadata=False)
    with pytest.raises(ShuffleError, match="explicit-comms shuffle [0-9a-f]+ failed: KeyError"):
        shuffle(df, "key", client=client)
    assert all(b == {} for b in client.run(_buffers).values())


def test_missing_pieces_are_a_clear_error() -> None:
    plugin = ExplicitComms()
    plugin.put("s1", {(1, 0): "b", (0, 0): "a", (0, 1): "c"})
    assert plugin.take("s1", 0) == ["a", "b"]  # in input order
    with pytest.raises(ShuffleError, match="pieces of output partition 0 are not on this worker"):
        plugin.take("s1", 0)
    assert plugin.take("s1", 1) == ["c"] and plugin.buffers == {}
