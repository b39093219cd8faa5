"""The device tier through the store: least recently used keys spill first, a
value larger than the tier goes straight to the host, aliases and views count
once, a key that cannot be copied stays on the device."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


def test_spills_least_recently_used_and_reads_back(make_store: MakeStore) -> None:
    backend = FakeCopyBackend()
    store = make_store(device_memory_limit=300, backend=backend)
    for i in range(3):
        store[i] = dev(100, i)
    store[0]  # 0 is now the most recently used
    store[3] = dev(100, 3)
    assert store.keys_on("device") == {0, 2, 3}
    assert store.where(1) == "host" and store.is_spilled_device_object(1)
    assert store.device_bytes == 300
    out = store[1]
    assert type(out) is FakeDeviceArray and (out.get() == 1).all()
    assert store.where(1) == "device" and store.device_bytes == 300
    assert backend.copies.count(("h2d", 100)) == 1


def test_value_larger_than_the_limit_goes_to_host(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=100)
    store["small"] = dev(50, 1)
    store["big"] = dev(500, 2)
    assert store.where("big") == "host" and store.where("small") == "device"
    assert (store["big"].get() == 2).all()


def test_aliases_are_counted_once(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=10_000)
    a = dev(1000, 7)
    store["a"] = a
    store["view"] = a.view(slice(10, 20))
    store["same"] = a
    assert store.device_bytes == 1000
    del a
    del store["a"]
    assert store.device_bytes == 1000  # the view and the alias still hold it
    del store["same"], store["view"]
    assert store.device_bytes == 0


def test_spilling_an_alias_frees_nothing_until_the_last_holder_goes(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=1500)
    a = dev(1000, 7)
    store["a"] = a
    store["view"] = a.view(slice(0, 10))
    del a
    store["b"] = dev(1000, 8)
    # "a" and "view" (oldest) had to go for "b" to fit
    assert store.keys_on("device") == {"b"} and store.device_bytes == 1000
    assert (store["view"].get() == 7).all() and store["view"].shape == (10,)


class Unspillable:
    __cuda_array_interface__: ClassVar[dict[str, Any]] = {
        "shape": (100,),
        "typestr": "|u1",
        "data": (1 << 40, False),
        "version": 3,
        "mask": object(),
    }


def test_unspillable_object_stays_on_device(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=150)
    u = Unspillable()
    store["u"] = u
    with caplog.at_level(logging.WARNING, logger="cudask.memory"):
        store["a"] = dev(100, 1)
        store["b"] = dev(40, 2)
    assert "stays on the device" in caplog.text
    assert store.where("u") == "device" and store["u"] is u
    assert (store["a"].get() == 1).all()


def test_device_tier_alone_orders_and_evicts() -> None:
    """The part on its own: reads move a key last, eviction hands the least
    recently used spillable key to `spill` until the ledger is at the target,
    and a failed spill that puts the key back first in line stops the loop."""
    from cudask.memory.accounting import AllocationLedger
    from cudask.memory.tiers.device import DeviceTier

    tier = DeviceTier(AllocationLedger(), limit=300)
    for i, key in enumerate("abc"):
        tier.add(key, f"value-{key}", [(i * 100, i * 100 + 100)])
    assert list(tier) == ["a", "b", "c"] and tier.ledger.total == 300
    assert tier.touch("a") == "value-a" and tier.touch("missing") is None
    assert list(tier) == ["b", "c", "a"]
    tier.unspillable.add("b")
    assert tier.victim() == "c" and tier.victim(keep="c") == "a"

    spilled: list[str] = []

    def spill(key: str) -> int:
        before = tier.ledger.total
        tier.take(key)
        spilled.append(key)
        return before - tier.ledger.total

    tier.evict_until(150, spill)
    assert spilled == ["c", "a"] and list(tier) == ["b"] and tier.ledger.total == 100

    def refuse(key: str) -> int:
        value, ranges = tier.take(key)
        tier.restore(key, value, ranges, front=True)
        return -1

    tier.unspillable.clear()
    tier.add("d", "value-d", [(500, 600)])
    tier.evict_until(0, refuse)
    assert list(tier) == ["b", "d"] and tier.ledger.total == 200
    tier.remove("b")
    tier.remove("b")
    assert list(tier) == ["d"] and tier.ledger.total == 100
