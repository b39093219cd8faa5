"""cudask_bench.shuffle on host frames (pandas) in a local cluster: both methods keep
every row and put each key in one partition; a failing method is recorded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")  # distributed's P2P shuffle moves arrow tables

from distributed import Client, LocalCluster

from cudask_bench.shuffle import METHODS, frame_shuffle


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.mark.parametrize("method", METHODS)
def test_a_shuffle_keeps_rows_and_groups_keys(client: Any, method: str) -> None:
    out = frame_shuffle(client, 100_003, 4, method, module="pandas")
    assert "error" not in out, out
    assert out["rows"] == 100_000 and out["bytes"] == 1_600_000 and out["seconds"] > 0
    assert out["rows_ok"] and out["keys_ok"], out
    assert isinstance(out["workers"], dict), (
        out
    )  # what moved per worker: nothing by IPC on host frames
    assert not any(k.startswith("ipc-") for moved in out["workers"].values() for k in moved), out


def test_keys_split_across_partitions_are_found(client: Any) -> None:
    """The check can fail: repartitioning without a shuffle leaves keys in several partitions."""
    import dask.dataframe as dd

    from cudask_bench.shuffle import _distinct_keys, _partition

    frame = dd.from_map(
        _partition, range(4), rows=50_000, module="pandas", meta=_partition(0, 0, "pandas")
    )
    held = client.compute(
        [client.submit(_distinct_keys, p) for p in client.compute(frame.to_delayed())], sync=True
    )
    assert sum(held) > frame["key"].nunique().compute(scheduler=client.get)


def test_a_failing_method_is_recorded(client: Any) -> None:
    out = frame_shuffle(client, 1000, 2, "tasks", module="cudf")  # no cuDF on this machine
    assert out["error"].startswith("ModuleNotFoundError") and "seconds" not in out, out
    with pytest.raises(ValueError, match="accepted"):
        frame_shuffle(client, 1000, 2, "sort")


def test_moved_counters_are_differences() -> None:
    from cudask_bench.shuffle import _moved

    before = {"a": {"ipc-received": 2.0, "ipc-mappings-open": 1.0}, "b": {"ipc-received": 0.0}}
    after = {
        "a": {
            "ipc-received": 5.0,
            "ipc-mappings-open": 1.0,
            "spill-device-to-host-count": 1.0,
            "pinned-provision-gbps": 12.0,
        },  # a rate: no difference taken
        "b": {"ipc-received": 0.0},
    }
    assert _moved(before, after) == {"a": {"ipc-received": 3.0, "spill-device-to-host-count": 1.0}}


def test_difference_leaves_rates_out() -> None:
    from cudask_bench.counters import difference

    before = {"device-to-host/bytes": 10.0, "pinned-provision-gbps": 8.0, "same": 1.0}
    after = {"device-to-host/bytes": 25.0, "pinned-provision-gbps": 3.0, "same": 1.0, "new": 2.0}
    # a rate's difference (here -5 GB/s) means nothing; unchanged counters are left out
    assert difference(before, after) == {"device-to-host/bytes": 15.0, "new": 2.0}
