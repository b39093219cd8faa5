"""Leased chunks of CuPy's pool (cudask.comm.leases) and the receiver's mappings of
them (cudask.comm.lifetimes) on CPU, with a fake clock: a chunk the pool drops is
freed at once unless a send leased it, then when its lease ends; receivers keep
the mapping for a quarter of the lease after each use and map anew after that. The GPU
proof is tests/comm/test_ipc_gpu.py::test_leased_chunks_stay_mapped."""

from __future__ import annotations

import gc
import itertools
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from distributed.protocol.serialize import deserialize, serialize

from cudask.comm import ipc, leases, lifetimes
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
LOCAL = {"recipient": {"address": "tcp://127.0.0.1:40000"}}


class OutOfMemory(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept = seconds
        self.now += seconds


class Device:
    """Allocations as NumPy buffers, up to `capacity` bytes; records what was freed."""

    def __init__(self, capacity: int = 1 << 30) -> None:
        self.capacity = capacity
        self.used = 0
        self.freed: list[int] = []
        self.buffers: dict[int, np.ndarray] = {}

    def allocate(self, nbytes: int) -> Any:
        if self.used + nbytes > self.capacity:
            raise OutOfMemory(nbytes)
        device = self

        class Allocation:
            def __init__(self) -> None:
                self.buffer = np.zeros(nbytes, dtype="u1")
                self.ptr = int(self.buffer.ctypes.data)
                device.used += nbytes
                device.buffers[self.ptr] = self.buffer

            def __del__(self) -> None:
                device.used -= nbytes
                device.freed.append(self.ptr)
                device.buffers.pop(self.ptr, None)

        return Allocation()


def _chunks(device: Device, clock: Clock, lease: float = 10.0) -> leases.Chunks:
    """A pool's record whose `wrap` gives what a pool keeps: an object holding the owner."""
    return leases.Chunks(
        lease,
        device.allocate,
        lambda memory, nbytes, owner: types.SimpleNamespace(ptr=int(memory.ptr), owner=owner),
        lambda exc: isinstance(exc, OutOfMemory),
        clock,
        clock.sleep,
    )


def test_a_chunk_never_sent_is_freed_when_the_pool_drops_it() -> None:
    device, clock = Device(), Clock()
    chunks = _chunks(device, clock)
    kept = chunks.malloc(4096)
    assert chunks.sending(kept.ptr) and chunks.live() == 1
    del kept
    gc.collect()
    assert device.used == 0 and len(device.freed) == 1 and chunks.live() == 0


def test_a_sent_chunk_is_freed_only_when_its_lease_ends() -> None:
    device, clock = Device(), Clock()
    chunks = _chunks(device, clock)
    kept = chunks.malloc(4096)
    base = kept.ptr
    chunks.extend([base])  # its send ended at t=100: leased until 110
    clock.now = 105.0
    del kept  # the pool gives it back (free_all_blocks)
    gc.collect()
    assert device.used == 4096 and chunks.retired_bytes() == 4096 and not chunks.sending(base)
    clock.now = 109.9
    assert chunks.sweep() == 0 and device.used == 4096
    clock.now = 110.0
    assert chunks.sweep() == 1 and device.used == 0 and chunks.retired_bytes() == 0
    assert chunks.counts["chunks-freed-late"] == 1


def test_each_send_extends_the_lease() -> None:
    device, clock = Device(), Clock()
    chunks = _chunks(device, clock)
    kept = chunks.malloc(4096)
    chunks.extend([kept.ptr])
    clock.now = 108.0
    chunks.extend([kept.ptr, 12345])  # 12345: not a chunk of this pool, ignored
    clock.now = 115.0
    del kept
    gc.collect()
    assert chunks.retired_bytes() == 4096 and chunks.sweep() == 0
    clock.now = 118.0
    assert chunks.sweep() == 1 and device.used == 0


def test_an_allocation_refused_twice_waits_for_a_retired_chunk() -> None:
    device, clock = Device(capacity=8192), Clock()
    chunks = _chunks(device, clock)
    first = chunks.malloc(8192)
    chunks.extend([first.ptr])
    del first
    gc.collect()
    with pytest.raises(
        OutOfMemory
    ):  # the first refusal goes through: the pool frees its cache first
        chunks.malloc(8192)
    clock.now += 0.5
    second = chunks.malloc(
        8192
    )  # refused again: the device is full of the retired chunk until t=110
    assert clock.slept == pytest.approx(9.5) and device.used == 8192 and len(device.freed) == 1
    assert chunks.live() == 1 and second.ptr in device.buffers


def test_a_refusal_that_retired_chunks_could_not_hold_does_not_wait() -> None:
    device, clock = Device(capacity=8192), Clock()
    chunks = _chunks(device, clock)
    first, other = chunks.malloc(4096), chunks.malloc(4096)
    chunks.extend([first.ptr])
    del first
    gc.collect()
    for _ in range(2):
        with pytest.raises(OutOfMemory):  # 8 KiB: more than the retired 4 KiB
            chunks.malloc(8192)
    assert (
        not hasattr(clock, "slept")
        and chunks.retired_bytes() == 4096
        and other.ptr in device.buffers
    )


def test_other_errors_and_a_full_device_without_retired_chunks_raise() -> None:
    device, clock = Device(capacity=4096), Clock()
    chunks = _chunks(device, clock)
    held = chunks.malloc(4096)
    with pytest.raises(OutOfMemory):
        chunks.malloc(4096)  # nothing retired to wait for
    broken = leases.Chunks(
        10.0, lambda n: 1 / 0, lambda m, n, o: m, lambda e: True, clock, clock.sleep
    )
    with pytest.raises(ZeroDivisionError):
        broken.malloc(16)
    assert held.ptr in device.buffers and not hasattr(clock, "slept")


def test_a_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lease=0"):
        leases.Chunks(0, Device().allocate, lambda m, n, o: m, lambda e: False)


class Mapper:
    def __init__(self) -> None:
        self.opened: list[bytes] = []
        self.closed: list[int] = []
        self.bases = itertools.count(1000)

    def open(self, handle: bytes) -> int:
        self.opened.append(handle)
        return next(self.bases)

    def close(self, base: int) -> None:
        self.closed.append(base)


def _used_once() -> tuple[Clock, Mapper, lifetimes.Mappings, int]:
    """Mappings in which handle b"h", leased for 20 s, was used once at t=100."""
    clock, mapper = Clock(), Mapper()
    mappings = lifetimes.Mappings(clock=clock)
    with mappings.use(mapper, b"h", lifetimes.this_process(), lease=20.0) as base:
        pass
    return clock, mapper, mappings, base


def test_a_leased_mapping_is_kept_for_a_quarter_of_the_lease_after_each_use() -> None:
    clock, mapper, mappings, base = _used_once()
    me = lifetimes.this_process()
    clock.now = 104.0
    with mappings.use(mapper, b"h", me, lease=20.0) as again:  # kept until 109 from now
        assert again == base
    clock.now = 108.0
    assert mappings.sweep(mapper) == 0 and mappings.kept() == 1
    clock.now = 109.0
    assert mappings.sweep(mapper) == 1 and mapper.closed == [base] and len(mappings) == 0
    assert mappings.counts == {
        "mappings-opened": 1,
        "mappings-opened-ahead": 0,
        "mappings-reused": 1,
        "mappings-closed-late": 0,
    }


def test_an_expired_mapping_is_mapped_anew_before_use() -> None:
    clock, mapper, mappings, base = _used_once()
    clock.now = 106.0  # not swept yet (kept until 105)
    with mappings.use(mapper, b"h", lifetimes.this_process(), lease=20.0) as fresh:
        assert fresh != base and mapper.closed == [base]
    assert mapper.opened == [b"h", b"h"] and mappings.kept() == 1


def test_a_mapping_closed_after_its_sender_may_free_it_is_counted_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, mapper, mappings, _ = _used_once()
    clock.now = 119.0  # a sweep that ran late, still within the lease
    assert mappings.sweep(mapper) == 1 and mappings.counts["mappings-closed-late"] == 0
    with mappings.use(mapper, b"h", lifetimes.this_process(), lease=20.0):
        pass
    clock.now = 139.5  # past the sender's earliest free (119 + 20)
    with caplog.at_level("WARNING", logger="cudask.comm"):
        assert mappings.sweep(mapper) == 1
    assert (
        mappings.counts["mappings-closed-late"] == 1
        and "give cudask.comm.device-ipc-lease" in caplog.text
    )


# ---------------------------------------------------------------- through ipc
@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeIPCBackend, leases.Chunks, Clock]:
    """ipc on with the fake backend; the leasing pool's record over buffers the
    backend exports; one clock for the sender's leases and the receiver's mappings."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeDeviceArray))
    clock = Clock()
    monkeypatch.setattr(ipc, "_state", ipc._State(mappings=lifetimes.Mappings(clock=clock)))
    backend = FakeIPCBackend()
    device = Device()
    chunks = _chunks(device, clock)
    monkeypatch.setattr(leases, "_installed", chunks)
    monkeypatch.setattr(lifetimes, "_pools", [])
    ipc.enable(backend, min_size=1024)
    return backend, chunks, clock


def _chunk_array(backend: FakeIPCBackend, chunks: leases.Chunks) -> tuple[Any, FakeDeviceArray]:
    block = chunks.malloc(1 << 16)
    buffer = next(b for b in chunks._memory.values() if b.ptr == block.ptr).buffer
    buffer[:] = np.arange(buffer.size) % 251
    backend.allocations[b"chunk"] = buffer
    return block, FakeDeviceArray(buffer)


def test_a_chunk_sent_inside_keep_alive_is_leased_and_stays_mapped(wired: Any) -> None:
    backend, chunks, clock = wired
    block, array = _chunk_array(backend, chunks)
    for _ in range(3):
        with ipc.keep_alive():
            header, frames = serialize(array, serializers=REPLY, context=LOCAL)
            assert header["lease"] == 10.0 and not header["lasting"]
            out = deserialize(header, frames, deserializers=REPLY)
        assert out._array.tobytes() == array._array.tobytes()
        assert chunks._until[block.ptr] == clock.now + 10.0  # leased from the end of the send
    assert backend.opened == [b"chunk"] and backend.closed == []
    stats = ipc.stats()
    assert (
        stats["mappings-opened"] == 1
        and stats["mappings-reused"] == 2
        and stats["mappings-kept"] == 1
    )
    clock.now += 2.5
    assert ipc.sweep() == 1 and ipc.mapped() == 0  # closed at a quarter of the lease
    assert ipc.stats()["mappings-closed-late"] == 0
    base = block.ptr
    del block  # the pool gives the chunk back: it stays allocated until its lease ends
    gc.collect()
    assert chunks.retired_bytes() == 1 << 16 and leases.sweep() == 0 and base in chunks._memory
    clock.now += 7.5
    assert leases.sweep() == 1 and base not in chunks._memory


def test_a_chunk_sent_outside_keep_alive_is_not_leased(wired: Any) -> None:
    backend, chunks, _ = wired
    block, array = _chunk_array(backend, chunks)
    header, frames = serialize(array, serializers=REPLY, context=LOCAL)
    assert header["lease"] == 0.0
    deserialize(header, frames, deserializers=REPLY)
    assert ipc.mapped() == 0 and len(backend.closed) == 1 and block.ptr not in chunks._until


# ---------------------------------------------------------------- install, with a fake CuPy
class FakeMemoryPool:
    """CuPy's MemoryPool as far as install and CupyHook use it: built over an allocator."""

    def __init__(self, allocator: Any = None) -> None:
        self.allocator = allocator
        self.blocks: list[Any] = []

    def malloc(self, nbytes: int) -> Any:
        block = self.allocator(nbytes)
        self.blocks.append(block)
        return block

    def total_bytes(self) -> int:
        return 0

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        self.blocks.clear()


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A `cupy` whose allocator is its default pool's malloc, over NumPy buffers."""
    device = Device()

    class Memory:
        def __init__(self, nbytes: int) -> None:
            self.inner = device.allocate(nbytes)
            self.ptr = self.inner.ptr

    default = FakeMemoryPool(Memory)
    state = {"allocator": default.malloc}
    cupy = types.ModuleType("cupy")
    cupy.get_default_memory_pool = lambda: default  # type: ignore[attr-defined]
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        MemoryPool=FakeMemoryPool,
        Memory=Memory,
        UnownedMemory=lambda ptr, size, owner, device_id: types.SimpleNamespace(
            ptr=ptr, owner=owner
        ),
        MemoryPointer=lambda memory, offset: types.SimpleNamespace(
            mem=memory, ptr=memory.ptr + offset
        ),
        get_allocator=lambda: state["allocator"],
        set_allocator=lambda a: state.__setitem__("allocator", a),
        runtime=types.SimpleNamespace(getDevice=lambda: 0, CUDARuntimeError=OutOfMemory),
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemory),
    )
    cupy.device = device  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(leases, "_installed", None)
    monkeypatch.setattr(leases, "_pool", None)
    leases._pool_type.cache_clear()
    yield cupy
    leases._pool_type.cache_clear()


def test_install_puts_a_leasing_pool_in_place_of_the_default_one(fake_cupy: Any) -> None:
    chunks = leases.install(20.0)
    assert chunks is not None and leases.install(30.0) is chunks  # once per process
    pool = leases.current_pool()
    assert pool is not fake_cupy.get_default_memory_pool() and isinstance(pool, FakeMemoryPool)
    assert fake_cupy.cuda.get_allocator() == pool.malloc
    block = fake_cupy.cuda.get_allocator()(4096)
    assert leases.sending(block.ptr) == 20.0 and leases.stats()["chunks-live"] == 1
    leases.extend([block.ptr])
    pool.free_all_blocks()
    del block
    gc.collect()
    assert leases.stats()["chunks-retired-bytes"] == 4096 and pool.total_bytes() == 4096
    assert fake_cupy.device.used == 4096  # held until the lease ends


def test_install_leaves_another_allocator_alone(fake_cupy: Any) -> None:
    fake_cupy.cuda.set_allocator(lambda nbytes: None)  # RMM's, say
    assert leases.install(20.0) is None
    assert leases.current_pool() is fake_cupy.get_default_memory_pool()
    assert leases.sending(12345) == 0.0 and leases.stats()["lease-seconds"] == 0.0


def test_the_on_demand_hook_reads_the_leasing_pool(fake_cupy: Any) -> None:
    from cudask.memory.allocators import CupyHook

    leases.install(20.0)
    pool = leases.current_pool()
    hook = CupyHook(lambda malloc, reserved: malloc)
    try:
        assert hook.reserved == pool.total_bytes and hook.release == pool.free_all_blocks
    finally:
        hook.remove()
