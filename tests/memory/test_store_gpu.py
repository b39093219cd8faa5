"""The store on a real GPU: CuPy, PyTorch, Numba and RMM objects spill and come
back identical; copies land in pinned memory; a shorter random walk.

Run on a GPU machine:  python -m pytest tests/memory/test_store_gpu.py -v
Each library is skipped when it is not installed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from cudask.memory import handlers
from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def make(
    tmp_path: Any, device_memory_limit: int, memory_limit: int | None, **overrides: Any
) -> TieredStore:
    """A store spilling under `tmp_path`, with these `cudask.memory.*` overrides."""
    return TieredStore(
        device_memory_limit,
        memory_limit,
        local_directory=str(tmp_path),
        settings=store_settings(device_memory_limit, memory_limit, **overrides),
    )


@pytest.fixture
def store(tmp_path: Any) -> Iterator[TieredStore]:
    pytest.importorskip("cupy")
    s = make(
        tmp_path,
        64 * MiB,
        96 * MiB,
        pinned_pool_size=128 * MiB,
        pinned_slab_size=32 * MiB,
        pinned_preallocate=False,
    )
    yield s
    s.close()


def test_cupy_spill_beyond_limit_and_read_back(
    store: TieredStore, wait_for: Callable[..., bool]
) -> None:
    cp = pytest.importorskip("cupy")
    n = 24  # 24 x 8 MiB = 192 MiB through a 64 MiB device tier and 96 MiB host tier
    for i in range(n):
        store[i] = cp.full(MiB, i, dtype="f8")
    assert store.device_bytes <= 64 * MiB
    assert store.keys_on("disk") and store.keys_on("host")
    for i in range(n):
        got = store[i]
        assert isinstance(got, cp.ndarray) and got.dtype == cp.float64 and got.shape == (MiB,)
        assert bool((got == i).all())
    m = store.metrics()
    assert m["spill-device-to-host-count"] >= n - 8
    assert m["unspill-host-to-device-count"] > 0
    assert wait_for(lambda: store.metrics()["pinned-reserved-bytes"] > 0, timeout=60)


def test_cupy_views_strides_and_dtypes(store: TieredStore) -> None:
    cp = pytest.importorskip("cupy")
    base = cp.arange(4 * MiB, dtype="f4").reshape(1024, -1)
    values = {
        "T": base.T,
        "strided": base[::3, 5::7],
        "reversed": base[::-1, ::-2],
        "c16": (cp.arange(1000) + 1j).astype("c16"),
        "bool": cp.arange(1001) % 3 == 0,
        "scalar": cp.asarray(3.5),
        "empty": cp.empty((0, 4), dtype="i2"),
    }
    expected = {k: cp.asnumpy(v) for k, v in values.items()}
    # a sparse view (its elements fill at most half its extent) comes back C-contiguous
    strides = {
        k: cp.empty(v.shape, v.dtype).strides if _sparse(v) else v.strides
        for k, v in values.items()
    }
    assert _sparse(values["strided"]) and not _sparse(values["T"])
    for k, v in values.items():
        store[k] = v
    del values, base
    for i in range(10):  # push everything out
        store[("filler", i)] = cp.zeros(8 * MiB, dtype="u1")
    for k, host in expected.items():
        got = store[k]
        assert isinstance(got, cp.ndarray)
        assert got.dtype == host.dtype and got.shape == host.shape
        if host.size:
            assert got.strides == strides[k]
        np.testing.assert_array_equal(cp.asnumpy(got), host)


def _sparse(v: Any) -> bool:
    low, high, _ = handlers.interface_extent(v.__cuda_array_interface__)
    return not v.flags.c_contiguous and 2 * v.nbytes <= high - low


def test_a_column_of_a_chunk_moves_only_the_column(store: TieredStore) -> None:
    """What map_overlap slices off a neighbouring chunk: 2 KiB of elements spread over
    4 MiB. Spilling it copies the 2 KiB, unspilling allocates them."""
    cp = pytest.importorskip("cupy")
    chunk = cp.arange(512 * 2048, dtype="f4").reshape(512, 2048)
    column = chunk[:, 2047:]
    host = handlers.to_host(column, store.engine)
    host.wait()
    assert host.nbytes == column.nbytes == 2048 and host.copies[0].source is None
    got, copies = handlers.to_device(host, store.engine)
    for c in copies:
        c.wait()
    assert got.shape == (512, 1) and got.flags.c_contiguous and got.data.mem.size < 64 * 1024
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(column))


def test_copies_land_in_memory_pinned_ahead(
    store: TieredStore, wait_for: Callable[..., bool]
) -> None:
    cp = pytest.importorskip("cupy")
    store["a"] = cp.ones(16 * MiB, dtype="u1")
    store["c"] = cp.ones(20 * MiB, dtype="u1")  # past half the limit: pinned ahead
    assert wait_for(lambda: store.metrics().get("pinned-reserved-bytes", 0) >= 16 * MiB, timeout=60)
    assert store.engine.pool.method == "register"  # registered anonymous memory
    store["b"] = cp.ones(40 * MiB, dtype="u1")  # evicts "a"
    copy = store._host["a"]
    assert isinstance(copy, handlers.HostCopy) and copy.pinned()
    assert store.engine.backend.is_pinned(copy.blocks[0].ptr)
    assert store.metrics()["pageable-fallback-count"] == 0
    assert bool((store["a"] == 1).all())


def test_fallback_blocks_are_registered_later(tmp_path: Any, wait_for: Callable[..., bool]) -> None:
    cp = pytest.importorskip("cupy")
    s = make(
        tmp_path,
        8 * MiB,
        None,
        pinned_pool_size=64 * MiB,
        pinned_slab_size=32 * MiB,
        pinned_preallocate=False,
    )
    try:
        s[0] = cp.full(MiB, 0.5, dtype="f8")
        s[1] = cp.full(MiB, 1.5, dtype="f8")  # spills 0 at once: nothing pinned yet
        copy = s.peek_host_copy(0)
        assert isinstance(copy, handlers.HostCopy)
        copy.wait()
        assert (np.frombuffer(copy.blocks[0].view, dtype="f8") == 0.5).all()
        # the fallback block's own memory is registered by the pool's thread
        assert wait_for(copy.pinned, timeout=60)
        assert s.engine.backend.is_pinned(copy.blocks[0].ptr)
        assert s.metrics()["pageable-registered-bytes"] >= 8 * MiB
        del copy
        assert bool((s[0] == 0.5).all()) and bool((s[1] == 1.5).all())
    finally:
        s.close()


def test_a_block_larger_than_a_slab_widens_the_slabs_that_follow(
    tmp_path: Any, wait_for: Callable[..., bool]
) -> None:
    cp = pytest.importorskip("cupy")
    s = make(
        tmp_path,
        32 * MiB,
        None,
        pinned_pool_size=256 * MiB,
        pinned_slab_size=8 * MiB,
        pinned_preallocate=32 * MiB,
    )
    try:
        pool = s.engine.pool
        assert pool.provisioner.wait_ready(timeout=120)
        assert pool.slabs == 4  # 8 MiB slabs, all free
        s[0] = cp.full(3 * MiB, 0.5, dtype="f8")  # 24 MiB blocks
        s[1] = cp.full(3 * MiB, 1.5, dtype="f8")  # spills 0: no 24 MiB range in any slab
        assert wait_for(lambda: s.peek_host_copy(0) is not None, timeout=60)
        assert pool.provisioner.slab_size == 48 * MiB
        assert s.metrics()["pageable-fallback-fragmented-bytes"] >= 24 * MiB
        assert wait_for(lambda: pool.slabs >= 5 and pool.reserved >= 80 * MiB, timeout=60)
        s[2] = cp.full(3 * MiB, 2.5, dtype="f8")  # spills 1 into a registered 48 MiB slab
        assert wait_for(lambda: s.peek_host_copy(1) is not None, timeout=60)
        copy = s.peek_host_copy(1)
        assert isinstance(copy, handlers.HostCopy) and copy.pinned()
        slab = copy.blocks[0]._slab
        assert slab is not None and slab.size == 48 * MiB  # in a wide slab, not a fallback
        assert s.engine.backend.is_pinned(copy.blocks[0].ptr)
        del copy
        for i in range(3):
            assert bool((s[i] == i + 0.5).all())
    finally:
        s.close()


def test_pinned_pool_exhaustion_falls_back(tmp_path: Any) -> None:
    cp = pytest.importorskip("cupy")
    from cudask.memory.host.fallback import PinnedMemoryWarning

    s = make(
        tmp_path,
        8 * MiB,
        None,
        pinned_pool_size=8 * MiB,
        pinned_slab_size=8 * MiB,
        pinned_preallocate=True,
    )
    try:
        assert s.engine.pool.provisioner.wait_ready(timeout=60)

        def fill() -> None:
            for i in range(4):
                s[i] = cp.full(MiB, i, dtype="f8")

        with pytest.warns(PinnedMemoryWarning):
            fill()
        for i in range(4):
            assert bool((s[i] == i).all())
        assert s.metrics()["pageable-fallback-count"] > 0
    finally:
        s.close()


def test_referenced_elsewhere_is_not_pretended_freed(store: TieredStore) -> None:
    cp = pytest.importorskip("cupy")
    held = cp.ones(40 * MiB, dtype="u1")
    store["held"] = held
    store["other"] = cp.ones(40 * MiB, dtype="u1")
    assert store.where("held") == "host"
    # the spilled object is alive here, so its memory still counts (and against the
    # limit: "other" is spilled too once the copy of "held" is done, which may be already)
    other = 40 * MiB if store.where("other") == "device" else 0
    assert store.device_bytes >= 40 * MiB + other
    assert store["held"] is held
    del held
    gc.collect()


def test_torch_tensors(store: TieredStore) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(3 * MiB, dtype=torch.bfloat16, device="cuda").reshape(3, -1)
    values = {
        "t": t,
        "T": t.T,
        "slice": t[:, 1::3],
        "grad": torch.ones(10, device="cuda", requires_grad=True),
    }
    expected = {k: v.detach().cpu().clone() for k, v in values.items()}
    strides = {k: v.stride() for k, v in values.items()}
    for k, v in values.items():
        store[k] = v
    del values, t
    for i in range(10):
        store[("filler", i)] = torch.zeros(8 * MiB, dtype=torch.uint8, device="cuda")
    for k, host in expected.items():
        got = store[k]
        assert isinstance(got, torch.Tensor) and got.is_cuda
        assert got.dtype == host.dtype and got.shape == host.shape
        assert got.stride() == strides[k]
        assert torch.equal(got.detach().cpu(), host)
    assert store["grad"].requires_grad


def test_numba_device_arrays(store: TieredStore) -> None:
    pytest.importorskip("numba")
    from numba import cuda

    host = np.arange(2 * MiB, dtype="i4").reshape(2, -1)
    store["n"] = cuda.to_device(host)
    store["nT"] = cuda.to_device(host).T
    for i in range(10):
        store[("filler", i)] = cuda.device_array(8 * MiB, dtype="u1")
    got = store["n"]
    assert type(got).__name__ == "DeviceNDArray"
    np.testing.assert_array_equal(got.copy_to_host(), host)
    np.testing.assert_array_equal(store["nT"].copy_to_host(), host.T)


def test_rmm_device_buffers(store: TieredStore) -> None:
    rmm = pytest.importorskip("rmm")
    payload = bytes(range(256)) * 4096
    store["buf"] = rmm.DeviceBuffer.to_device(payload)
    for i in range(10):
        store[("filler", i)] = rmm.DeviceBuffer(size=8 * MiB)
    got = store["buf"]
    assert isinstance(got, rmm.DeviceBuffer) and got.size == len(payload)
    assert got.tobytes() == payload


def test_cudf_frames(store: TieredStore) -> None:
    cudf = pytest.importorskip("cudf")
    df = cudf.DataFrame({"a": range(100_000), "b": ["x", "yy"] * 50_000})
    expected = df.to_pandas()
    store["df"] = df
    del df
    for i in range(10):
        store[("filler", i)] = cudf.Series(np.zeros(MiB, dtype="u8"))
    got = store["df"]
    assert isinstance(got, cudf.DataFrame)
    assert got.to_pandas().equals(expected)


def test_random_walk_on_gpu(store: TieredStore) -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(0)
    model: dict[int, np.ndarray] = {}
    for step in range(300):
        key = int(rng.integers(0, 30))
        action = rng.choice(["put", "put", "get", "del", "alias"])
        if action == "put":
            n = int(rng.integers(0, 4 * MiB))
            dtype = rng.choice(["u1", "f4", "f8", "i2"])
            arr = cp.asarray(rng.integers(0, 100, n // np.dtype(dtype).itemsize).astype(dtype))
            if rng.random() < 0.3 and arr.size > 4:
                arr = arr[::-2]
            store[key] = arr
            model[key] = cp.asnumpy(arr)
        elif action == "alias" and model:
            src = int(rng.choice(list(model)))
            store[key] = store[src]
            model[key] = model[src]
        elif action == "get" and key in model:
            np.testing.assert_array_equal(cp.asnumpy(store[key]), model[key])
        elif action == "del" and key in model:
            del store[key]
            del model[key]
    assert set(store) == set(model) and model  # the loop below checks something
    for key, host in model.items():
        got = store[key]
        assert got.dtype == host.dtype
        np.testing.assert_array_equal(cp.asnumpy(got), host)


def test_in_flight_copy_counts_until_done(store: TieredStore) -> None:
    cp = pytest.importorskip("cupy")
    store["a"] = cp.ones(40 * MiB, dtype="u1")
    store["b"] = cp.ones(40 * MiB, dtype="u1")  # spills "a": copy may still run
    # 80 MiB while the copy of "a" runs, 40 MiB once it is done (no one else holds it)
    assert 40 * MiB <= store.device_bytes <= 80 * MiB
    assert store.committed_device_bytes == 40 * MiB
    store.spill_device(1)  # waits for every copy
    assert store.device_bytes <= 64 * MiB
    assert bool((store["a"] == 1).all())


def test_background_pinning_then_pinned_copies(tmp_path: Any) -> None:
    cp = pytest.importorskip("cupy")
    s = make(
        tmp_path,
        64 * MiB,
        None,
        pinned_pool_size=128 * MiB,
        pinned_slab_size=32 * MiB,
        pinned_preallocate=64 * MiB,
    )
    try:
        assert s.engine.pool.provisioner.wait_ready(timeout=120)  # pinned in the background
        m = s.metrics()
        assert m["pinned-ready"] == 1 and m["pinned-reserved-bytes"] >= 64 * MiB
        for i in range(4):
            s[i] = cp.full(4 * MiB, i, dtype="f8")  # 4 x 32 MiB: two spill
        copy = s.peek_host_copy(0)
        assert copy is not None and copy.pinned()
        assert s.metrics()["pageable-fallback-count"] == 0
        for i in range(4):
            assert bool((s[i] == i).all())
    finally:
        s.close()


def test_spill_device_and_peek_on_gpu(store: TieredStore) -> None:
    cp = pytest.importorskip("cupy")
    for i in range(4):
        store[i] = cp.full(MiB, i, dtype="f8")  # 4 x 8 MiB
    assert store.spill_device(16 * MiB) >= 16 * MiB
    copy = store.peek_host_copy(0)
    assert copy is not None
    copy.wait()
    host = np.frombuffer(copy.blocks[0].view, dtype="f8")
    assert (host == 0).all() and store.where(0) == "host"
    assert bool((store[0] == 0).all())


def test_idle_pinned_slabs_go_back_and_copy_times_come_from_events(
    tmp_path: Any, wait_for: Callable[..., bool]
) -> None:
    cp = pytest.importorskip("cupy")
    s = make(
        tmp_path,
        64 * MiB,
        512 * MiB,
        pinned_pool_size=256 * MiB,
        pinned_slab_size=32 * MiB,
        pinned_preallocate=False,
        pinned_release_after=0.2,
    )
    try:
        for i in range(16):  # 16 x 16 MiB through a 64 MiB device tier
            s[i] = cp.full(2 * MiB, i, dtype="f8")
        assert wait_for(lambda: s.metrics()["pinned-reserved-bytes"] >= 64 * MiB, timeout=60)
        assert all(bool((s[i] == i).all()) for i in range(16))
        m = s.metrics()
        # the copies' own time between their CUDA events
        assert m["spill-device-to-host-seconds"] > 0 and m["unspill-host-to-device-seconds"] > 0
        assert m["unspill-host-to-device-wait-seconds"] > 0
        for i in range(16):
            del s[i]
        wait_for(lambda: not s.metrics()["pinned-reserved-bytes"])
        m = s.metrics()
        assert m["pinned-reserved-bytes"] == 0 and m["pinned-released-bytes"] >= 64 * MiB
        for i in range(8):  # pinned again on demand, values intact
            s[i] = cp.full(2 * MiB, i, dtype="f8")
        assert all(bool((s[i] == i).all()) for i in range(8))
        assert wait_for(lambda: s.metrics()["pinned-reserved-bytes"] > 0, timeout=60)
    finally:
        s.close()
