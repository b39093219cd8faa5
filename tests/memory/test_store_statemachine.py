"""A random walk over TieredStore with fake device objects: every value reads
back byte-identical and the device tier's count matches its contents."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cudask.memory import handlers
from cudask.memory.accounting import union_bytes
from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.memory.tiers.names import Linked
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, as_numpy

KEYS = st.sampled_from([0, 1, 2, 3, 4, 5, ("x", 0), "y"])
DTYPES = st.sampled_from(["u1", "i2", "<f4", ">f8", "c8", "?", "<u8"])
LIMIT = 1024


def same(a: Any, b: Any) -> bool:
    """Byte-identical, with the same types, dtypes, shapes and container shapes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@st.composite
def device_arrays(draw: st.DrawFn) -> FakeDeviceArray:
    dtype = np.dtype(draw(DTYPES))
    n = draw(st.integers(0, 640)) // dtype.itemsize
    data = np.frombuffer(
        draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize)), dtype=dtype
    )
    base = FakeDeviceArray.from_numpy(data)
    layout = draw(st.sampled_from(["whole", "strided", "reversed", "2d-T", "slice"]))
    if layout == "strided" and n > 2:
        return base[:: draw(st.integers(2, 4))]
    if layout == "reversed":
        return base[::-1]
    if layout == "2d-T" and n >= 4:
        rows = draw(st.integers(1, n // 2))
        return FakeDeviceArray.from_numpy(data[: rows * (n // rows)].reshape(rows, -1)).T
    if layout == "slice" and n > 3:
        return base[1 : n - 1]
    return base


host_values = st.one_of(
    st.binary(max_size=300),
    st.integers(),
    st.lists(st.integers(0, 9), max_size=5).map(lambda x: np.asarray(x, dtype="i4")),
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict[Any, Any] = {}
        self.held: list[Any] = []
        self.last_read: Any = None
        self.tmp = tempfile.mkdtemp(prefix="cudask-sm-")

    @initialize(lag=st.sampled_from([0, 0, 2, 50]), disk=st.booleans())
    def make(self, lag: int, disk: bool) -> None:
        self.backend = FakeCopyBackend(lag=lag)
        memory_limit = 1500 if disk else None
        self.store = TieredStore(
            device_memory_limit=LIMIT,
            memory_limit=memory_limit,
            local_directory=self.tmp,
            backend=self.backend,
            settings=store_settings(
                LIMIT,
                memory_limit,
                pinned_pool_size=6000,
                pinned_slab_size=2048,
                pinned_preallocate=False,
                background=False,
            ),
        )

    def _put(self, key: Any, value: Any) -> None:
        self.store[key] = value
        self.model[key] = as_numpy(value)
        if handlers.is_device_object(value):
            self.last_read = None  # a device write brings the tier back within its limit

    def _read(self, key: Any) -> Any:
        """store[key]; the entry a read brought back to the device may sit over the limit
        (`last_read`: an entry's name, which a linked key shares with its source)."""
        value = self.store[key]
        if key in self.store.keys_on("device"):
            self.last_read = self.store._names.entry(key)
        return value

    @rule(key=KEYS, value=device_arrays())
    def put_array(self, key: Any, value: FakeDeviceArray) -> None:
        self._put(key, value)

    @rule(
        key=KEYS,
        values=st.lists(st.one_of(device_arrays(), host_values), min_size=1, max_size=3),
        kind=st.sampled_from(["list", "tuple", "dict"]),
    )
    def put_container(self, key: Any, values: list[Any], kind: str) -> None:
        value: Any = (
            values
            if kind == "list"
            else tuple(values)
            if kind == "tuple"
            else {f"k{i}": v for i, v in enumerate(values)}
        )
        self._put(key, value)

    @rule(key=KEYS, value=host_values)
    def put_host(self, key: Any, value: Any) -> None:
        self._put(key, value)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), key=KEYS, view=st.booleans())
    def put_alias(self, data: st.DataObject, key: Any, view: bool) -> None:
        source = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        value = self.store[source]
        if (
            isinstance(value, FakeDeviceArray)
            and view
            and len(value.shape) == 1
            and value.shape[0] > 1
        ):
            value = value[1:]
        self._put(key, value)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), key=KEYS, spilled=st.booleans())
    def put_link(self, data: st.DataObject, key: Any, spilled: bool) -> None:
        """What cudask's GPUWorker stores for an alias of a spilled key:
        `key` becomes a second name of the source's entry, nothing moves."""
        keys = sorted(self.model, key=repr)
        moved = [k for k in keys if self.store.is_spilled_device_object(k)]
        source = data.draw(st.sampled_from(moved if spilled and moved else keys))
        read_before = self.store.cumulative_metrics["host-to-device", "bytes"]
        self.store[key] = Linked(source)
        self.model[key] = self.model[source]
        assert self.store.cumulative_metrics["host-to-device", "bytes"] == read_before  # no read

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        assert same(as_numpy(self._read(key)), self.model[key]), key

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def get_again(self, data: st.DataObject) -> None:
        self.get(data)

    @rule(key=KEYS)
    def delete(self, key: Any) -> None:
        if key in self.model:
            del self.store[key]
            del self.model[key]
        else:
            assert key not in self.store

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        self.held.append(self._read(key))

    @precondition(lambda self: self.held)
    @rule()
    def release(self) -> None:
        self.held.pop(0)

    @rule(keys=st.lists(KEYS, max_size=4))
    def prefetch(self, keys: list[Any]) -> None:
        self.store.prefetch(keys)

    @rule()
    def evict_to_disk(self) -> None:
        self.store.evict()

    @rule()
    def drain(self) -> None:
        self.backend.drain()

    @invariant()
    def same_keys(self) -> None:
        if not hasattr(self, "store"):
            return
        assert set(self.store) == set(self.model)
        assert len(self.store) == len(self.model)

    @invariant()
    def one_tier_per_key(self) -> None:
        if not hasattr(self, "store"):
            return
        tiers = [self.store.keys_on(t) for t in ("device", "host", "disk")]
        assert sum(len(t) for t in tiers) == len(self.model)
        assert set().union(*tiers) == set(self.model)

    @invariant()
    def device_accounting(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        with store.lock:
            store._buffer.reap()
            objects = list(store._device.values())
            objects += [v for v, _, _ in store._buffer.prefetched.values()]
            for _, refs, _ in store._buffer.inflight.ghosts.values():
                objects += [r() for r in refs if r() is not None]
            expected = union_bytes(r for obj in objects for r in handlers.allocations(obj))
            assert store._ledger.total == expected
            if not self.held and not store._buffer.inflight.ghosts:
                assert store._ledger.total <= LIMIT or set(store._device) <= {self.last_read}, (
                    store._ledger.total,
                    list(store._device),
                )

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStoreMachine = StoreMachine.TestCase
