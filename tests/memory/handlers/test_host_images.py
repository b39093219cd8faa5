"""Host images: pickling out of band and giving pinned blocks back."""

from __future__ import annotations

import pickle

import numpy as np
from handler_testing import arange

from cudask.memory import handlers
from cudask.memory.handlers import HostCopy
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.testing import wait_for
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray


def test_host_copy_pickles_out_of_band_and_rebuilds(engine: TransferEngine) -> None:
    a = FakeDeviceArray.from_numpy(np.arange(50, dtype="f4").reshape(5, 10))[:, 1::2]
    copy = handlers.to_host(a, engine)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(copy, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(data) < 1000  # the bytes travel out of band
    loaded = pickle.loads(data, buffers=[bytes(b.raw()) for b in buffers])
    assert isinstance(loaded, HostCopy) and not loaded.pinned()
    value, copies = handlers.to_device(loaded, engine)
    for c in copies:
        c.wait()
    np.testing.assert_array_equal(value.get(), a.get())
    # protocol < 5 still works (in-band bytes)
    value2, _ = handlers.to_device(pickle.loads(pickle.dumps(copy, protocol=4)), engine)
    np.testing.assert_array_equal(value2.get(), a.get())


def test_host_copy_returns_its_pinned_block_when_it_dies() -> None:
    backend = FakeCopyBackend(lag=1000)
    pool = PinnedPool(backend, 1 << 16, slab_size=1 << 16)
    pool.provisioner.preallocate()
    engine = TransferEngine(backend, pool)
    copy = handlers.to_host(arange(100), engine)
    assert copy.pinned() and pool.in_use == 1024
    del copy  # copy still in flight: the block waits for it
    assert pool.in_use == 1024
    backend.drain()
    pool.allocate(10).release()
    # given back by this thread's allocate or by the pool's own thread, whichever collects it
    assert wait_for(lambda: pool.in_use == 0)
