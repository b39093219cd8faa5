"""A clean end on a GPU: LocalCUDACluster runs CuPy (and cuDF) workloads past its
device limit and closes, and no process logs an ERROR line or a traceback: with and
without disk spilling, with the default store, with JIT-unspill and with cuDF's
spilling (where cuDF is installed). The CPU twin is test_clean_end_cpu.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from clean_end import LOG_ENV, LogWatch, check_clean, leftovers, remote_logs
from distributed import Client, wait

from cudask import LocalCUDACluster
from cudask.testing import wait_for

pytestmark = pytest.mark.gpu

# Functions defined here run on LocalCUDACluster workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20
CHUNK = 128 * MiB
CHUNKS = 48  # 6 GiB: past the 256 MB device limit; past the 4.8 GB host tier with a disk


def _chunk(i: int, nbytes: int) -> Any:
    import cupy

    x = cupy.arange(nbytes // 8, dtype=cupy.uint64)
    x += cupy.uint64(i)
    return x


def _mismatches(x: Any, i: int, nbytes: int) -> int:
    import cupy

    expected = cupy.arange(nbytes // 8, dtype=cupy.uint64) + cupy.uint64(i)
    return int(cupy.count_nonzero(x != expected))


def _combine(a: Any, b: Any) -> Any:
    return a + b


def _total(x: Any) -> int:
    return int(x.sum())


def _frame(i: int, rows: int) -> Any:
    import cudf
    import cupy

    return cudf.DataFrame(
        {"k": cupy.arange(rows, dtype="int64") % 97, "v": cupy.full(rows, i, dtype="int64")}
    )


def _grouped(df: Any) -> int:
    return int(df.groupby("k").v.sum().sum())


def _stored(dask_worker: Any) -> int:
    return len(dask_worker.data)


def _disk_keys(dask_worker: Any) -> float:
    return float(dask_worker.data.metrics().get("disk-keys", 0))


def _arrays(client: Client, on_disk: bool) -> list[Any]:
    """Chunks past the device limit, read back and checked, added in pairs and summed,
    a dask.array expression over a persisted array past the limit; the first half of
    the chunks are returned, still held."""
    import cupy
    import dask.array as da

    chunks = [client.submit(_chunk, i, CHUNK, pure=False) for i in range(CHUNKS)]
    wait(chunks)
    assert (sum(client.run(_disk_keys).values()) > 0) == on_disk
    assert (
        client.gather(
            [client.submit(_mismatches, c, i, CHUNK, pure=False) for i, c in enumerate(chunks)]
        )
        == [0] * CHUNKS
    )
    n = CHUNK // 8
    pairs = [client.submit(_combine, a, b, pure=False) for a, b in zip(chunks[0::2], chunks[1::2])]
    sums = client.gather([client.submit(_total, p, pure=False) for p in pairs])
    # (element j of chunk i is i + j) summed over j and the pair i, i + 1, modulo 2**64
    assert sums == [(n * (2 * i + 1) + n * (n - 1)) % 2**64 for i in range(0, CHUNKS, 2)]
    rs = da.random.RandomState(seed=0, RandomState=cupy.random.RandomState)
    x = rs.random((16000, 16000), chunks=4000).persist()  # 2 GB of float64
    total = client.compute((x + x.T).sum())  # a CuPy scalar: made a float on the worker
    assert 0 < client.submit(float, total, pure=False).result() < 2 * 16000**2
    del x, pairs, total
    return chunks[: CHUNKS // 2]


def _frames(client: Client, on_disk: bool) -> list[Any]:
    """cuDF frames past the device limit (and the host tier, `on_disk`), grouped and
    summed; half returned, still held."""
    rows = 16 << 20  # 256 MiB per frame, 6 GiB in all
    frames = [client.submit(_frame, i, rows, pure=False) for i in range(24)]
    wait(frames)
    assert (sum(client.run(_disk_keys).values()) > 0) == on_disk
    assert client.gather([client.submit(_grouped, f, pure=False) for f in frames]) == [
        i * rows for i in range(24)
    ]
    return frames[:12]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("store", ["default", "jit", "cudf"])
@pytest.mark.parametrize("on_disk", [False, True], ids=["no-disk", "disk"])
def test_a_gpu_workload_and_its_close_log_no_error(
    store: str,
    on_disk: bool,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("cupy")
    if store == "cudf":
        pytest.importorskip("cudf", reason="cuDF spilling needs cuDF")
    for name, value in LOG_ENV.items():
        monkeypatch.setenv(name, value)
    # host tier: 0.6 x 8 GB (distributed's target); with 6 GiB of chunks about 1.2 GB
    # reach disk, and the worker stays under the pause (80%) and terminate (95%) lines
    with (
        LogWatch().watching() as parent,
        LocalCUDACluster(
            n_workers=1,
            threads_per_worker=2,
            device_memory_limit="256MB",
            memory_limit="8GB" if on_disk else 0,
            jit_unspill=store == "jit",
            enable_cudf_spill=store == "cudf",
            local_directory=str(tmp_path),
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        held = _frames(client, on_disk) if store == "cudf" else _arrays(client, on_disk)
        assert wait_for(lambda: sum(client.run(_stored).values()) == len(held), timeout=120)
        remote = remote_logs(client)
    out, err = capfd.readouterr()
    check_clean({"test process": parent.text, **remote, "worker processes (stderr)": out + err})
    assert "Worker process still alive" not in parent.text
    assert leftovers(tmp_path) == []
