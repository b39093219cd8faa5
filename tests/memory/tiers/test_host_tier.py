"""The host tier through the store: distributed's SpillBuffer over disk,
ManualEvictProto, max-spill and disk failures that keep keys, reads when the
disk is full, host copies that pickle."""

from __future__ import annotations

import logging
import pickle
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from distributed.spill import SpillBuffer

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeDeviceArray, as_numpy, filled

MakeStore = Callable[..., TieredStore]


dev = filled  # a fake device array of n elements, each `fill`


def test_disk_tier_roundtrip_and_protocols(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=200, memory_limit=300)
    ref = {i: np.arange(100, dtype="f4") * i for i in range(10)}
    for i, arr in ref.items():
        store[i] = FakeDeviceArray.from_numpy(arr)
    assert store.keys_on("disk")
    assert store.spilled_total.disk > 0 and store.spilled_total.memory > 0
    for i, arr in ref.items():
        np.testing.assert_array_equal(store[i].get(), arr)
    cm = store.cumulative_metrics
    assert {unit for _, unit in cm} <= {"bytes", "count", "seconds"}
    for label in ("device-to-host", "host-to-device", "disk-write", "disk-read"):
        assert cm[label, "count"] > 0 and cm[label, "bytes"] > 0
    m = store.metrics()
    assert m["spill-host-to-disk-count"] == cm["disk-write", "count"]
    assert m["unspill-host-to-device-bytes"] == cm["host-to-device", "bytes"]


def test_manual_evict_protocol(make_store: MakeStore) -> None:
    store = make_store(memory_limit=10_000)
    assert not store.fast and store.evict() == -1  # nothing to evict yet
    store["x"] = b"x" * 1000
    store["d"] = dev(100, 5)
    assert store.fast
    assert store.evict() >= 1000
    assert store.where("x") == "disk" and store["x"] == b"x" * 1000
    without_disk = make_store()
    without_disk["x"] = b"x"
    assert not without_disk.fast and without_disk.evict() == -1


def test_max_spill_keeps_keys_in_host_memory(make_store: MakeStore, caplog: Any) -> None:
    store = make_store(device_memory_limit=100, memory_limit=150, max_spill=250)
    for i in range(6):
        store[i] = dev(100, i)
    assert len(store) == 6
    assert store.metrics()["disk-bytes"] <= 250
    for i in range(6):
        assert (store[i].get() == i).all()


def test_disk_failure_keeps_keys(make_store: MakeStore, tmp_path: Any) -> None:
    directory = tmp_path / "gone"
    store = make_store(device_memory_limit=100, memory_limit=150, local_directory=str(directory))
    store[0] = dev(100, 0)
    shutil.rmtree(directory)  # every write to disk now fails with OSError
    for i in range(1, 5):
        store[i] = dev(100, i)  # distributed.spill logs "Spill to disk failed"
    assert store.keys_on("disk") == set() and len(store) == 5
    for i in range(5):
        assert (store[i].get() == i).all()


def test_host_tier_is_distributed_spillbuffer(make_store: MakeStore) -> None:
    assert isinstance(make_store(memory_limit=100)._host.data, SpillBuffer)


def test_host_copies_pickle_through_the_store(make_store: MakeStore) -> None:
    store = make_store(device_memory_limit=10)
    store["a"] = dev(100, 4)
    copy = store._host["a"]
    loaded = pickle.loads(pickle.dumps(copy))
    assert loaded.blocks[0].view.tobytes() == bytes([4]) * 100
    assert as_numpy([store["a"]])[0].sum() == 400


def test_reads_go_on_when_the_disk_tier_is_full(
    make_store: MakeStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Reading a key back from disk moves older keys to disk; when max-spill (or a
    full disk) refuses them, the read still returns the key, from host memory."""
    store = make_store(device_memory_limit=4000, memory_limit=6000, max_spill=4000)
    for i in range(30):
        store[i] = dev(1000, i)
    assert store.keys_on("disk") and store.keys_on("host")
    with caplog.at_level(logging.WARNING, logger="cudask.memory"):
        for i in range(30):
            assert (as_numpy(store[i]) == i).all(), i
    assert "disk tier is full" in caplog.text


def test_pickled_host_copies_hand_out_numpy_buffers(make_store: MakeStore) -> None:
    """Out-of-band pickle buffers of a host copy are NumPy arrays, never memoryviews:
    a memoryview exported to a PickleBuffer and caught in a reference cycle (the
    traceback of a failed disk write) crashes Python 3.12's garbage collector."""
    store = make_store(device_memory_limit=1000)
    store["a"] = dev(800, 3)
    store["b"] = dev(800, 4)  # spills "a"
    copy = store.peek_host_copy("a")
    assert copy is not None
    buffers: list[pickle.PickleBuffer] = []
    pickle.dumps(copy, protocol=5, buffer_callback=buffers.append)
    assert buffers and all(isinstance(b.raw().obj, np.ndarray) for b in buffers)
    back = pickle.loads(pickle.dumps(copy, protocol=5))
    assert bytes(back.blocks[0].view) == bytes(copy.blocks[0].view)


def test_full_disk_tier_with_garbage_collection_in_a_fresh_process(tmp_path: Any) -> None:
    """Spills refused by max-spill, reads and deletes, with the garbage collector run
    after every step: the process neither crashes nor loses a key."""
    script = f"""
import gc, numpy as np
from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray, as_numpy
s = TieredStore(device_memory_limit=4000, memory_limit=6000, max_spill=4000,
                backend=FakeCopyBackend(), local_directory={str(tmp_path)!r},
                settings=store_settings(4000, 6000, pinned_pool_size=2000, pinned_slab_size=1000))
for i in range(40):
    s[i] = FakeDeviceArray.from_numpy(np.full(1000, i, dtype="u1"))
    gc.collect()
    if i % 3 == 0:
        del s[i // 2]
        gc.collect()
for i in range(40):
    if i in s:
        assert (as_numpy(s[i]) == i).all(), i
    gc.collect()
print("ok")
"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_host_tier_alone_with_and_without_a_disk(tmp_path: Any) -> None:
    """The part on its own: without a host limit an LRU that never goes to disk;
    with one, SpillBuffer in `<directory>/storage`, or in a temporary directory
    that `close()` removes."""
    import os

    from cudask.memory.tiers.host import HostTier

    memory = HostTier(None)
    memory["a"] = b"x" * 100
    assert memory.keys_on("host") == {"a"} and memory.keys_on("disk") == set()
    assert memory.tier_of("a") == "host" and memory.tier_of("b") is None
    assert memory.keys_on("gpu") is None
    assert not memory.fast and memory.evict() == -1 and memory.spilled_total.disk == 0
    assert memory.sizes()[1:] == (1, 0, 0.0) and not memory.cumulative_metrics

    disk = HostTier(150, directory=str(tmp_path))
    for i in range(3):
        disk[i] = b"y" * 100
    assert disk.keys_on("disk") and disk.tier_of(0) == "disk"
    assert os.path.isdir(tmp_path / "storage") and disk[0] == b"y" * 100
    disk.close()

    temporary = HostTier(150)
    directory = temporary._tmpdir
    assert directory is not None and os.path.isdir(directory)
    temporary.close()
    assert not os.path.exists(directory)
