"""cuDF and dask-cuDF on a real GPU, through LocalCUDACluster: groupby, an
explicit task shuffle and a hash merge (dask.dataframe's hash, group-split and
concat dispatch) on frames spilled past a small device limit, with and without
JIT-unspill; a proxy of a cuDF frame used in place of the frame; and the cuDF
spilling options set on the workers. Skipped where cuDF / dask-cuDF are missing.
"""

from __future__ import annotations

import operator
import pickle
import sys
from typing import Any

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.gpu
pd = pytest.importorskip("pandas")  # cuDF needs it; the test extra does not

# Functions below run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _frames(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(0)
    left = pd.DataFrame(
        {"k": rng.integers(0, 1000, n), "x": rng.random(n), "y": rng.integers(0, 10**9, n)}
    )
    right = pd.DataFrame({"k": np.arange(1000), "w": rng.random(1000)})
    return left, right


def _store_metrics(dask_worker: Any) -> dict[str, Any]:
    return {"type": type(dask_worker.data).__name__, **dask_worker.data.metrics()}


def _sorted(df: Any, by: list[str]) -> pd.DataFrame:
    if hasattr(df, "to_pandas"):
        df = df.to_pandas()
    return df.sort_values(by).reset_index(drop=True)


@pytest.mark.parametrize("jit", [False, True])
def test_dask_cudf_groupby_shuffle_merge_past_the_limit(jit: bool) -> None:
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    import dask
    from distributed import Client, wait

    from cudask import LocalCUDACluster

    left, right = _frames(2_000_000)  # 48 MB on the device, 3x the limit
    # task shuffles: they go through dask's hash, group-split and concat dispatch
    with (
        dask.config.set({"dataframe.shuffle.method": "tasks"}),
        LocalCUDACluster(
            n_workers=1,
            threads_per_worker=1,
            device_memory_limit="16MB",
            jit_unspill=jit,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        ddf = dask_cudf.from_cudf(cudf.from_pandas(left), npartitions=16).persist()
        rdf = dask_cudf.from_cudf(cudf.from_pandas(right), npartitions=2).persist()
        wait([ddf, rdf])

        got = ddf.groupby("k").agg({"x": "sum", "y": "max"}).compute().to_pandas()
        expected = left.groupby("k").agg({"x": "sum", "y": "max"})
        pd.testing.assert_frame_equal(
            got.sort_index(), expected, check_dtype=False, check_exact=False, rtol=1e-9
        )

        shuffled = ddf.shuffle("k", shuffle_method="tasks").persist()
        wait(shuffled)
        parts = client.compute(shuffled.to_delayed())
        keys_per_part = [set(p.to_pandas()["k"]) for p in client.gather(parts)]
        for i, a in enumerate(keys_per_part):  # each key lives in one partition
            for b in keys_per_part[i + 1 :]:
                assert not a & b
        pd.testing.assert_frame_equal(
            _sorted(shuffled.compute(), ["y", "k", "x"]), _sorted(left, ["y", "k", "x"])
        )

        merged = ddf.merge(rdf, on="k", how="inner", shuffle_method="tasks", broadcast=False)
        pd.testing.assert_frame_equal(
            _sorted(merged.compute(), ["y", "k", "x"]),
            _sorted(left.merge(right, on="k"), ["y", "k", "x"]),
            check_like=True,
        )

        (metrics,) = client.run(_store_metrics).values()
        assert metrics["type"] == ("ProxyStore" if jit else "TieredStore")
        assert metrics["spill-device-to-host-count"] > 0
        if jit:
            assert metrics["proxies"] > 0


def test_proxy_of_a_cudf_frame(tmp_path: Any) -> None:
    cudf = pytest.importorskip("cudf")
    from dask.dataframe import methods
    from dask.dataframe.dispatch import hash_object_dispatch, make_meta
    from distributed.protocol import deserialize, serialize

    from cudask.memory.jit.proxy_store import ProxyStore
    from cudask.memory.settings import store_settings

    left, _ = _frames(10_000)
    store = ProxyStore(
        device_memory_limit=1 << 20,
        local_directory=str(tmp_path),
        settings=store_settings(1 << 20, None, pinned_pool_size="64MB", pinned_preallocate=False),
    )
    try:
        store["df"] = cudf.from_pandas(left)
        for i in range(4):  # push "df" off the device
            store[("filler", i)] = cudf.from_pandas(left)
        proxy = store["df"]
        assert store.where("df") != "device"
        # as sent to a client: pickled with out-of-band buffers, or through distributed's
        # serializers, and rebuilt where no store exists (a dask-cuDF result, say)
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(proxy, protocol=5, buffer_callback=buffers.append)
        back = pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])
        pd.testing.assert_frame_equal(back.to_pandas(), left)
        header, frames = serialize(proxy, serializers=("dask", "pickle"))
        pd.testing.assert_frame_equal(deserialize(header, frames).to_pandas(), left)
        assert store.where("df") != "device"  # sending did not unspill it
        assert isinstance(proxy, cudf.DataFrame)
        assert len(proxy) == len(left) and list(proxy.columns) == ["k", "x", "y"]
        assert int(proxy["y"].max()) == int(left["y"].max())
        assert np.isclose(float((proxy["x"] * 2).sum()), float((left["x"] * 2).sum()))
        both = methods.concat([proxy, proxy])
        assert isinstance(both, cudf.DataFrame) and len(both) == 2 * len(left)
        assert len(hash_object_dispatch(proxy, index=False)) == len(left)
        assert isinstance(make_meta(proxy), cudf.DataFrame)
    finally:
        store.close()


def _cudf_options() -> tuple[Any, Any, Any]:
    import cudf

    return (
        cudf.get_option("spill"),
        cudf.get_option("spill_stats"),
        cudf.get_option("spill_device_limit"),
    )


def test_cudf_spill_options_on_the_workers() -> None:
    pytest.importorskip("cudf")
    from distributed import Client

    from cudask import LocalCUDACluster

    with (
        LocalCUDACluster(
            n_workers=1,
            enable_cudf_spill=True,
            cudf_spill_stats=1,
            device_memory_limit="1GB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        # cuDF's failure callback is in place at start, before any cuDF object
        assert list(client.run(_failure_callbacks).values()) == [1]
        # the store's hooks first (a CuPy array), cuDF after: no "already registered"
        import cupy

        assert int(client.submit(cupy.arange, 10**6).result().sum()) == sum(range(10**6))
        frame = client.submit(lambda n: __import__("cudf").DataFrame({"x": range(n)}), 1000)
        assert len(frame.result()) == 1000
        assert list(client.run(_cudf_spilling_on).values()) == [True]
        # cuDF spills when an allocation fails; the store holds the device limit
        assert list(client.run(_cudf_options).values()) == [(True, 1, None)]
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["type"] == "TieredStore"
        limits = client.run(lambda dask_worker: dask_worker.data.device_memory_limit)
        assert list(limits.values()) == [10**9]


# A deep copy of a partition: with cuDF spilling on, frames a worker receives from a
# client arrive as buffers cuDF keeps spilled on the host until used; a copy is made on
# the device, so the store holds it. (A stdlib callable: `cudask worker` processes
# cannot import this module.)
_ON_DEVICE = operator.methodcaller("copy", deep=True)


def _failure_callbacks() -> int:
    """RMM failure-callback adaptors in this worker's current resource stack."""
    import rmm
    from cudf.core.buffer.spill_manager import get_rmm_memory_resource_stack

    stack = get_rmm_memory_resource_stack(rmm.mr.get_current_device_resource())
    return sum(isinstance(m, rmm.mr.FailureCallbackResourceAdaptor) for m in stack)


def _cudf_spilling_on() -> bool:
    from cudf.core.buffer.spill_manager import get_global_manager

    return get_global_manager() is not None


def _cudf_spill_everything() -> int:
    """Have cuDF spill every spillable buffer of this worker to host memory, as it
    does when an allocation fails; the bytes it spilled."""
    from cudf.core.buffer.spill_manager import get_global_manager

    manager = get_global_manager()
    assert manager is not None, "cuDF spilling is off on this worker"
    return int(manager.spill_device_memory(nbytes=1 << 62))


_SEPARATE_CLIENT = """
import sys
import cudf
import dask_cudf
import pandas as pd
from distributed import Client

assert not cudf.get_option("spill")
with Client(sys.argv[1]) as client:
    ddf = client.get_dataset("frames")
    got = ddf.groupby("k").x.sum().compute()
    whole = ddf.compute()
print(type(got).__name__, round(float(got.sum()), 6), len(whole))
"""


def test_cudf_spill_results_reach_clients_without_spilling(tmp_path: Any) -> None:
    """With enable_cudf_spill=True the workers' frames are spillable, and results
    reach a client that does not spill: the one in this process and one in a
    separate process. The store holds the device limit: it spills whole frames past
    it, including frames some of whose buffers cuDF had spilled itself."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    import subprocess

    from distributed import Client, wait

    from cudask import LocalCUDACluster

    assert not cudf.get_option("spill")
    left, _ = _frames(2_000_000)  # 48 MB on the device, 3x the limit
    with (
        LocalCUDACluster(
            n_workers=1,
            threads_per_worker=1,
            enable_cudf_spill=True,
            cudf_spill_stats=1,
            device_memory_limit="16MB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        ddf = dask_cudf.from_cudf(cudf.from_pandas(left), npartitions=16)
        ddf = ddf.map_partitions(_ON_DEVICE).persist()
        wait(ddf)
        assert list(client.run(_cudf_spilling_on).values()) == [True]
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["spill-device-to-host-count"] > 0
        # frames cuDF spilled itself (as on a failed allocation), then more frames put
        (by_cudf,) = client.run(_cudf_spill_everything).values()
        assert by_cudf > 0
        more = dask_cudf.from_cudf(cudf.from_pandas(left), npartitions=16)
        more = more.map_partitions(_ON_DEVICE).persist()
        wait(more)
        assert float(more.x.sum().compute()) == pytest.approx(left.x.sum(), rel=1e-9)
        got = ddf.groupby("k").x.sum().compute()
        assert isinstance(got, cudf.Series)
        pd.testing.assert_series_equal(
            got.to_pandas().sort_index(), left.groupby("k").x.sum(), check_names=False
        )
        pd.testing.assert_frame_equal(
            _sorted(ddf.compute(), ["y", "k", "x"]), _sorted(left, ["y", "k", "x"])
        )
        assert not cudf.get_option("spill")  # this process received them without spilling

        client.publish_dataset(frames=ddf)
        script = tmp_path / "separate_client.py"
        script.write_text(_SEPARATE_CLIENT)
        done = subprocess.run(
            [sys.executable, str(script), cluster.scheduler_address],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        name, total, rows = done.stdout.split()
        assert name == "Series" and int(rows) == len(left)
        assert float(total) == pytest.approx(left.x.sum(), rel=1e-9)


def test_cudf_spill_on_cli_workers(tmp_path: Any) -> None:
    """`cudask worker --enable-cudf-spill --device-memory-limit 16MB`: cuDF spilling
    is on, the store spills past the limit, and results reach this (non-spilling)
    client."""
    cudf = pytest.importorskip("cudf")
    dask_cudf = pytest.importorskip("dask_cudf")
    from distributed import wait

    from cudask.testing.processes import worker_processes

    left, _ = _frames(1_000_000)
    with worker_processes(
        ["0"], log_dir=tmp_path, args=["--enable-cudf-spill", "--device-memory-limit", "16MB"]
    ) as client:
        ddf = dask_cudf.from_cudf(cudf.from_pandas(left), npartitions=8)
        ddf = ddf.map_partitions(_ON_DEVICE).persist()
        wait(ddf)
        assert list(client.run(_cudf_options).values()) == [(True, 0, None)]
        (metrics,) = client.run(_store_metrics).values()
        assert metrics["type"] == "TieredStore" and metrics["spill-device-to-host-count"] > 0
        got = ddf.x.sum().compute()
        assert float(got) == pytest.approx(left.x.sum(), rel=1e-9)
        pd.testing.assert_frame_equal(
            _sorted(ddf.compute(), ["y", "k", "x"]), _sorted(left, ["y", "k", "x"])
        )


def _spill_without_the_portable_wire() -> None:
    import cudf

    cudf.set_option("spill", True)  # cuDF spilling turned on by hand, not by cudask


def test_a_spilling_worker_without_the_portable_wire_fails_a_plain_client() -> None:
    """The control for the test above: frames from a worker whose cuDF spilling was
    turned on by hand (no cudask.comm.cudf_wire) cannot be read by this client."""
    cudf = pytest.importorskip("cudf")
    pytest.importorskip("dask_cudf")
    from distributed import Client

    from cudask import LocalCUDACluster

    with (
        LocalCUDACluster(n_workers=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        client.run(_spill_without_the_portable_wire)
        future = client.submit(lambda n: cudf.DataFrame({"x": range(n)}), 1000)
        with pytest.raises(Exception, match="without a global spill manager"):
            future.result()
