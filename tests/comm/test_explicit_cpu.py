"""cudask.comm.explicit on host frames (pandas), two worker processes over TCP:
every row kept, each key in one output partition, same rows as dask's task
shuffle, nothing left in the workers' buffers; bad input named before any work;
a failing split raises ShuffleError and leaves no buffer behind; a failed send holds
only its own staging slots."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pandas")

import dask.dataframe as dd
from distributed import Client, LocalCluster

from cudask.comm.explicit import NAME, ExplicitComms, ShuffleError, shuffle
from cudask.testing import wait_for, workers_info
from cudask_bench.shuffle import _distinct_keys, _partition


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def _frame(partitions: int = 4, rows: int = 5000) -> Any:
    return dd.from_map(
        _partition, range(partitions), rows=rows, module="pandas", meta=_partition(0, 0, "pandas")
    )


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
    theirs = (
        df.shuffle(on="key", shuffle_method="tasks")
        .compute()
        .sort_values("value")
        .reset_index(drop=True)
    )
    assert ours.equals(theirs) and len(ours) == 20000
    assert all(b == {} for b in client.run(_buffers).values())


def test_bad_input_is_named_before_any_work(client: Any) -> None:
    df = _frame()
    with pytest.raises(
        ValueError,
        match=r"on='nope': \['nope'\] not among the DataFrame's columns \['key', 'value'\]",
    ):
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


def _pause(dask_worker: Any) -> None:
    from distributed.core import Status

    dask_worker.status = Status.paused  # as the memory monitor does past its pause threshold


def _resume(dask_worker: Any) -> None:
    from distributed.core import Status

    dask_worker.status = Status.running


def _held(dask_worker: Any) -> int:
    plugin = dask_worker.plugins.get(NAME)  # None until the shuffle has registered it
    return 0 if plugin is None else sum(len(p) for b in plugin.buffers.values() for p in b.values())


def _run_in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_paused_owner_builds_its_partitions_once_resumed() -> None:
    """Output partitions are strictly bound to the worker holding their pieces: a
    paused owner delays them (it is not skipped for a worker without the pieces)."""
    # memory_limit=0: no memory monitor to resume the paused worker on its own
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit=0,
        ) as cluster,
        Client(cluster) as c,
    ):
        _, b = sorted(workers_info(c))
        c.run(_pause, workers=[b])
        thread, result = _run_in_thread(lambda: shuffle(_frame(), "key", client=c).compute())
        assert wait_for(lambda: c.run(_held, workers=[b])[b] > 0, timeout=120)
        c.run(_resume, workers=[b])
        thread.join(timeout=300)
        assert not thread.is_alive() and "error" not in result, result
        assert len(result["value"]) == 20000


def test_an_owner_leaving_is_a_clear_error_not_a_hang() -> None:
    # memory_limit=0: no memory monitor to resume the paused worker on its own
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit=0,
        ) as cluster,
        Client(cluster) as c,
    ):
        _, b = sorted(workers_info(c))
        c.run(_pause, workers=[b])  # b holds its pieces and builds nothing while paused
        thread, result = _run_in_thread(lambda: shuffle(_frame(), "key", client=c))
        assert wait_for(lambda: c.run(_held, workers=[b])[b] > 0, timeout=120)
        c.restart_workers([b])  # its process ends; a new one starts at another address
        thread.join(timeout=300)
        assert not thread.is_alive()
        assert isinstance(result.get("error"), ShuffleError), result
        assert f"worker(s) {b} left before building their output partitions" in str(result["error"])
        assert all(n == 0 for n in c.run(_held).values())


def test_pieces_of_a_dropped_shuffle_are_discarded() -> None:
    plugin = ExplicitComms()
    plugin.drop("s1")
    plugin.put("s1", {(0, 0): "late"})  # a send still under way when the shuffle failed
    assert plugin.buffers == {}


def test_missing_pieces_are_a_clear_error() -> None:
    plugin = ExplicitComms()
    plugin.put("s1", {(1, 0): "b", (0, 0): "a", (0, 1): "c"})
    assert plugin.take("s1", 0) == ["a", "b"]  # in input order
    with pytest.raises(ShuffleError, match="pieces of output partition 0 are not on this worker"):
        plugin.take("s1", 0)
    assert plugin.take("s1", 1) == ["c"] and plugin.buffers == {}


def _orders(i: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(i)
    return pd.DataFrame({"key": rng.integers(0, 3000, 2000), "amount": rng.random(2000)})


def _customers(i: int) -> Any:
    import numpy as np
    import pandas as pd

    keys = np.arange(
        i * 1000, (i + 1) * 1000
    )  # 0..2999: some orders have no customer, some customers no order
    return pd.DataFrame({"key": keys, "name": [f"c{k}" for k in keys]}).iloc[::2]


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_merge_matches_pandas(client: Any, how: str) -> None:
    from cudask.comm.explicit import merge

    orders = dd.from_map(_orders, range(4), meta=_orders(0).iloc[:0])
    customers = dd.from_map(_customers, range(3), meta=_customers(0).iloc[:0])
    out = merge(orders, customers, "key", how=how, client=client)
    assert out.npartitions == 4
    ours = out.compute().sort_values(["key", "amount"]).reset_index(drop=True)
    theirs = orders.compute().merge(customers.compute(), on="key", how=how)
    assert ours.equals(theirs.sort_values(["key", "amount"]).reset_index(drop=True))
    assert all(b == {} for b in client.run(_buffers).values())


def test_merge_bad_input_is_named(client: Any) -> None:
    from cudask.comm.explicit import merge

    orders = dd.from_map(_orders, range(2), meta=_orders(0).iloc[:0])
    customers = dd.from_map(_customers, range(2), meta=_customers(0).iloc[:0])
    with pytest.raises(ValueError, match="how='cross'; accepted: inner, left, right, outer"):
        merge(orders, customers, "key", how="cross", client=client)
    with pytest.raises(ValueError, match=r"\['name'\] not among the left DataFrame's columns"):
        merge(orders, customers, "name", client=client)
    as_float = customers.astype({"key": "f8"})
    with pytest.raises(ValueError, match=r"on='key': dtypes differ \(left int64, right float64\)"):
        merge(orders, as_float, "key", client=client)


class _Peer:
    """A peer's `cudask_shuffle_receive`: the send takes a staging slot, as serializing a
    device frame into the area does, and fails when the peer is `lost`."""

    def __init__(self, area: Any, lost: bool) -> None:
        self.area, self.lost = area, lost

    async def cudask_shuffle_receive(self, shuffle_id: str, pieces: Any, serializers: Any) -> None:
        import asyncio

        from cudask.comm import ipc

        ipc._staged.get().add(self.area.take(1024))
        await asyncio.sleep(0)  # the other send is under way meanwhile
        if self.lost:
            raise OSError("connection to the peer lost")


def test_a_failed_send_holds_only_its_own_staging_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two peers: the send to the lost one holds its slot (staging.FAILED_HOLD); the
    other's slot is free once its peer has answered."""
    import asyncio
    import types

    from cudask.comm import explicit, staging

    area = staging.Staging(4096, 1 << 16)
    monkeypatch.setattr(staging, "_area", area)
    peers = {"tcp://b": _Peer(area, lost=False), "tcp://c": _Peer(area, lost=True)}
    worker = types.SimpleNamespace(
        address="tcp://a",
        data={"x": _partition(0, 100, "pandas")},
        rpc=peers.__getitem__,
        plugins={NAME: ExplicitComms()},
    )
    with pytest.raises(OSError, match="lost"):
        asyncio.run(
            explicit._send(
                "s", {"tcp://a": {"x": 0}}, ["key"], 3, ["tcp://a", *peers], set(), worker
            )
        )
    assert area.in_use() == 1024
