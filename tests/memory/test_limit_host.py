"""The fault matrix's "task exhausts device memory" case at small scale, on a CPU:
the store holds half of a fake GPU and a task asks for 60% of it. Whatever it
spills to make room, host memory resident (host blocks alive plus the pinned
pool's slabs, free or not) never passes the host tier's limit plus one chunk:
copies still in flight do not keep their host copies alive once the host tier
moved them to disk, and free pinned memory counts against the host tier."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import pytest

from cudask.memory.host.blocks import HostBlock
from cudask.memory.store import TieredStore
from cudask.testing import fake_allocators as fakes
from cudask.testing.fake_cuda import FakeCopyBackend, as_numpy, filled

MakeStore = Callable[..., TieredStore]
CHUNK = 64 << 10


class Sampling(FakeCopyBackend):
    """Copies stay in flight until waited for; host memory resident is sampled
    whenever a copy to the host is issued."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(lag=10_000, **kwargs)
        self.store: TieredStore | None = None
        self.samples: list[int] = []

    def copy_d2h(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        super().copy_d2h(dst, src, nbytes, stream)
        if self.store is not None:
            self.samples.append(resident(self.store))


def resident(store: TieredStore) -> int:
    """Host bytes held: live unpooled blocks not given back, plus the pool's slabs."""
    blocks = sum(
        o.nbytes
        for o in gc.get_objects()
        if isinstance(o, HostBlock) and not o.released and o._slab is None
    )
    engine = store._lazy.current
    return blocks + (engine.pool.reserved if engine is not None else 0)


@pytest.mark.parametrize("at_limit", [True, False], ids=["spill-at-limit", "on-oom-only"])
def test_host_memory_stays_within_its_limit_while_the_device_makes_room(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, at_limit: bool
) -> None:
    holder: list[TieredStore] = []
    device = fakes.FakeDevice(32 * CHUNK, held=lambda: holder[0].device_bytes if holder else 0)
    cupy = fakes.cupy_module(device)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    backend = Sampling(device_memory=device.mem_get_info)
    host_limit = 8 * CHUNK
    store = make_store(
        device_memory_limit=16 * CHUNK,
        memory_limit=host_limit,
        backend=backend,
        pinned_pool_size="auto",
        pinned_slab_size=CHUNK,
        spill_at_limit=at_limit,
    )
    holder.append(store)
    for i in range(18):  # the device tier full, two keys already on the host
        store[i] = filled(CHUNK, i % 251)
    backend.store = store
    ask = int(32 * CHUNK * 0.6)
    assert cupy.cuda.get_allocator()(ask) == ask
    backend.drain()
    gc.collect()
    assert backend.samples, "nothing was spilled"
    assert max(backend.samples) <= host_limit + CHUNK, [s / CHUNK for s in backend.samples]
    assert resident(store) <= host_limit + CHUNK
    m = store.metrics()
    if at_limit:  # room for all of it within the limit: the whole tier goes, half to disk
        assert store.keys_on("device") == set() and m["spill-at-limit-count"] == 1
        assert store.keys_on("disk")
    else:  # only what the device lacks
        assert len(store.keys_on("device")) >= 12 and m["spill-on-demand-count"] == 1
    assert all((as_numpy(store[i]) == i % 251).all() for i in range(18))


def test_free_pinned_memory_counts_against_the_host_tier(make_store: MakeStore) -> None:
    """A host tier full of host values: the pinned memory made ready ahead of the
    device tier's spills must fit in what the host tier has left (nothing here)."""
    host_limit = 8 * CHUNK
    store = make_store(
        device_memory_limit=4 * CHUNK,
        memory_limit=host_limit,
        backend=FakeCopyBackend(),
        pinned_pool_size=8 * CHUNK,
        pinned_slab_size=CHUNK,
        pinned_headroom=8 * CHUNK,
    )
    for i in range(8):
        store[f"host-{i}"] = bytes(CHUNK - 64)  # host values fill the host tier
    for i in range(3):  # past half the device limit: pinned memory is made ready ahead
        store[i] = filled(CHUNK, i)
    pool = store.engine.pool
    pool.provisioner.wait_ready(timeout=30)
    free_pinned = pool.reserved - pool.in_use
    assert store._host.memory_bytes + free_pinned <= host_limit + CHUNK, free_pinned / CHUNK
    for i in range(8):  # the device tier spills: its copies push host values to disk
        store[f"more-{i}"] = filled(CHUNK, 100 + i)
    pool.provisioner.wait_ready(timeout=30)
    assert store._host.memory_bytes + pool.reserved - pool.in_use <= host_limit + CHUNK
    assert all((as_numpy(store[f"more-{i}"]) == 100 + i).all() for i in range(8))
    assert all(store[f"host-{i}"] == bytes(CHUNK - 64) for i in range(8))
