"""TieredStore keys that hold the very same device object (dask-expr's Alias tasks),
or a `Linked` value naming another key, share one entry: counted, spilled and read
back once; each key reads, deletes and overwrites on its own. CPU, fake device
objects."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cudask.memory.store import TieredStore
from cudask.memory.tiers.names import Linked
from cudask.testing.fake_cuda import filled

MakeStore = Callable[..., TieredStore]
MB = 1 << 20


def _moved(store: TieredStore) -> tuple[float, float]:
    m = store.cumulative_metrics
    return m["device-to-host", "bytes"], m["host-to-device", "bytes"]


def test_an_alias_shares_the_entry_of_its_source(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=4 * MB)
    store["a"] = filled(MB, 1)
    store["b"] = store["a"]  # what an Alias task does
    assert len(store) == 2 and set(store) == {"a", "b"} and "b" in store
    assert store.device_bytes == MB and len(store._device) == 1
    assert store.keys_on("device") == {"a", "b"} and store.where("b") == "device"

    store.spill_device(MB)
    assert store.keys_on("host") == {"a", "b"} and store.where("a") == "host"
    assert _moved(store) == (MB, 0)  # one copy for both keys
    assert store.is_spilled_device_object("b")
    assert store.peek_host_copy("b") is store.peek_host_copy("a") is not None

    b = store["b"]
    assert store["a"] is b and (b.get() == 1).all()
    assert _moved(store) == (MB, MB)  # read back once


def test_each_key_deletes_and_overwrites_on_its_own(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=4 * MB)
    store["a"] = filled(MB, 1)
    store["b"] = store["a"]
    del store["a"]
    assert "a" not in store and set(store) == {"b"} and len(store) == 1
    with pytest.raises(KeyError):
        store["a"]
    with pytest.raises(KeyError):
        store.where("a")
    assert (store["b"].get() == 1).all() and store.device_bytes == MB

    store["a"] = filled(MB, 2)  # a new value while the old entry is kept for "b"
    assert (store["a"].get() == 2).all() and (store["b"].get() == 1).all()
    assert set(store) == {"a", "b"} and store.device_bytes == 2 * MB
    store.spill_device(2 * MB)
    assert store.keys_on("host") == {"a", "b"}
    assert (store["a"].get() == 2).all() and (store["b"].get() == 1).all()

    del store["b"]  # the old entry goes with its last key
    assert set(store) == {"a"} and store.device_bytes == MB
    store["a"] = b"host value"
    assert store.device_bytes == 0 and store.where("a") == "host" and len(store) == 1
    del store["a"]
    assert len(store) == 0 and list(store) == [] and len(store._device) == 0


def test_overwriting_an_alias_leaves_its_source(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=4 * MB)
    store["a"] = filled(MB, 1)
    store["b"] = store["a"]
    store["b"] = filled(MB, 3)
    assert (store["a"].get() == 1).all() and (store["b"].get() == 3).all()
    assert store.device_bytes == 2 * MB and len(store._device) == 2
    store["b"] = store["a"]  # back to the same object: one entry again
    assert store.device_bytes == MB and len(store._device) == 1
    del store["a"], store["b"]
    assert len(store) == 0 and store.device_bytes == 0


def test_a_key_storing_its_own_value_again_keeps_its_entry(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=4 * MB)
    value = filled(MB, 1)
    store["a"] = value
    store["b"] = value
    del store["a"]
    store["a"] = store["b"]  # the kept entry is named by its own key again
    assert set(store) == {"a", "b"} and len(store._device) == 1
    del store["b"]
    assert set(store) == {"a"} and store["a"] is value
    store["a"] = value
    assert len(store) == 1 and store.device_bytes == MB


def test_shared_entries_are_spilled_last(make_store: MakeStore) -> None:
    """Alias tasks run ahead of their consumers: the entries they named are about
    to be read, so the device tier spills entries named by one key first (the
    value just written too), then the most recently shared."""
    store = make_store(device_memory_limit=2 * MB)
    store[("p", 0)] = filled(MB, 0)
    store[("p", 1)] = filled(MB, 1)
    store[("alias", 0)] = store[("p", 0)]
    store[("alias", 1)] = store[("p", 1)]
    store[("out", 0)] = filled(MB, 2)
    assert store.keys_on("device") == {("p", 0), ("p", 1), ("alias", 0), ("alias", 1)}
    store[("p", 2)] = store[("out", 0)]  # read back: shared now, the last one linked
    assert store.where(("p", 2)) == "device" and store.where(("alias", 1)) == "host"
    del store[("alias", 0)]  # its consumer ran: p0 is an ordinary entry again
    store[("out", 1)] = filled(MB, 3)
    assert store.where(("p", 0)) == "host" and store.where(("out", 1)) == "device"
    assert store.where(("p", 2)) == "device"
    assert (store[("alias", 1)].get() == 1).all()


def test_a_linked_value_names_the_entry_of_a_spilled_key(make_store: MakeStore) -> None:
    """What cudask's worker stores for an Alias task of a spilled key
    (cudask.worker.gpu_worker): the key joins the entry, and nothing moves."""
    store = make_store(device_memory_limit=4 * MB)
    store["a"] = filled(MB, 5)
    store.spill_device(MB)
    moved = _moved(store)
    store["b"] = Linked("a")
    assert _moved(store) == moved and store.keys_on("host") == {"a", "b"}
    assert store.peek_host_copy("b") is store.peek_host_copy("a") is not None
    del store["a"]
    assert (store["b"].get() == 5).all() and set(store) == {"b"}
    assert _moved(store) == (moved[0], moved[1] + MB)  # read back once, for "b"


def test_a_linked_value_of_a_missing_key_changes_nothing(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=4 * MB)
    store["b"] = filled(MB, 1)
    with pytest.raises(KeyError):
        store["b"] = Linked("absent")
    assert (store["b"].get() == 1).all() and set(store) == {"b"}
    from cudask.memory.unlimited import UnlimitedStore

    unlimited = make_store(UnlimitedStore)  # no device limit: a dict
    with pytest.raises(KeyError):
        unlimited["x"] = Linked("absent")
    assert len(unlimited) == 0
