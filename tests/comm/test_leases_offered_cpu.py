"""Leased chunks of CuPy's pool offered to this host's workers ahead of any message
(cudask.comm.leases.offered, cudask.comm.ipc.offer and map_ahead, the renewal in
cudask.comm.lifetimes.Mappings) on CPU, with a fake clock: an offer leases every
live chunk from then; the receiver maps what it offers and keeps each mapping for
a quarter of the lease from the offer's arrival, each later offer renewing it; the
next message finds the chunk mapped. The exchange's loop over real TCP comms is in
test_ahead_cpu.py; the GPU proof is
tests/comm/test_ipc_gpu.py::test_leased_chunks_are_mapped_ahead."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from distributed.protocol.serialize import deserialize, serialize
from test_leases_cpu import LOCAL, REPLY, Clock, Device, Mapper, _chunk_array, _chunks, wired

from cudask.comm import ipc, leases, lifetimes

__all__ = ["wired"]  # the fixture, shared with test_leases_cpu.py


def test_an_offer_leases_every_live_chunk_from_then() -> None:
    device, clock = Device(), Clock()
    chunks = _chunks(device, clock)  # a 10 s lease
    first, second = chunks.malloc(4096), chunks.malloc(4096)
    assert chunks.allocated == 2
    assert sorted(chunks.offer()) == sorted([first.ptr, second.ptr])  # leased until 110
    assert chunks.counts["chunks-offered"] == 2
    clock.now = 104.0
    base = first.ptr
    del first  # the pool gives it back within the lease: retired, not freed
    gc.collect()
    assert chunks.retired_bytes() == 4096 and chunks.offer() == [second.ptr]  # a retired one is not offered
    clock.now = 110.0
    assert chunks.sweep() == 1 and base in device.freed
    del second  # offered again at 104: leased until 114
    gc.collect()
    assert chunks.retired_bytes() == 4096
    clock.now = 114.0
    assert chunks.sweep() == 1 and device.used == 0


def test_a_mapping_offered_ahead_is_kept_for_a_quarter_of_the_lease_from_the_offer() -> None:
    clock, mapper = Clock(), Mapper()
    mappings = lifetimes.Mappings(clock=clock)
    me = lifetimes.this_process()
    assert mappings.map_ahead(mapper, b"h", me, lease=20.0, since=99.0)  # kept until 104
    assert not mappings.map_ahead(mapper, b"h", me, lease=20.0, since=100.0)  # mapped already
    assert not mappings.renew(b"other", me, 20.0, 100.0)  # not mapped here
    clock.now = 103.0
    assert mappings.renew(b"h", me, 20.0, 103.0)  # offered again: kept until 108
    clock.now = 107.0
    assert mappings.sweep(mapper) == 0
    with mappings.use(mapper, b"h", me, lease=20.0):  # a message: kept until 112
        pass
    clock.now = 111.0
    assert mappings.sweep(mapper) == 0 and mapper.opened == [b"h"]
    clock.now = 112.0
    assert mappings.sweep(mapper) == 1 and len(mappings) == 0
    assert not mappings.renew(b"h", me, 20.0, 112.0)  # ended: the next offer maps it anew
    assert mappings.counts == {"mappings-opened": 0, "mappings-opened-ahead": 1, "mappings-reused": 1,
                               "mappings-closed-late": 0}


def test_an_offer_keeps_a_mapping_a_message_opened_for_itself_and_leaves_lasting_ones() -> None:
    clock, mapper = Clock(), Mapper()
    mappings = lifetimes.Mappings(clock=clock)
    me = lifetimes.this_process()
    with mappings.use(mapper, b"once", None):  # a chunk sent without a lease: closed after use ...
        assert mappings.renew(b"once", me, 20.0, 100.0)  # ... unless offered meanwhile
    assert len(mappings) == 1 and mapper.closed == []
    clock.now = 105.0
    assert mappings.sweep(mapper) == 1
    with mappings.use(mapper, b"slab", me):  # lasting: kept while its sender runs
        pass
    assert mappings.renew(b"slab", me, 20.0, 105.0)
    clock.now = 200.0
    assert mappings.sweep(mapper) == 0 and mappings.kept() == 1


@pytest.fixture
def another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offers from this process are taken as a peer's (a process cannot map its own
    memory): `ipc._accepted` names this process's record."""
    monkeypatch.setattr(ipc, "_accepted", lambda peer: lifetimes.this_process() if peer else None)


def test_the_offer_carries_the_leased_chunks_and_the_next_message_finds_them_mapped(
        wired: Any, another_process: None) -> None:
    backend, chunks, clock = wired
    block, array = _chunk_array(backend, chunks)
    offer = ipc.offer()
    assert offer is not None and offer["handles"] == [] and offer["leased"] == [b"chunk"]
    assert offer["lease"] == 10.0 and chunks._until[block.ptr] == 110.0
    assert ipc.map_ahead(offer) == 1 and backend.opened == [b"chunk"]
    clock.now = 102.0
    assert ipc.map_ahead(ipc.offer()) == 0  # renewed: kept until 104.5
    with ipc.keep_alive():
        header, frames = serialize(array, serializers=REPLY, context=LOCAL)
        out = deserialize(header, frames, deserializers=REPLY)
    assert out._array.tobytes() == array._array.tobytes()
    stats = ipc.stats()
    assert backend.opened == [b"chunk"] and stats["mappings-opened"] == 0
    assert stats["mappings-opened-ahead"] == 1 and stats["mappings-reused"] == 1
    assert leases.stats()["chunks-offered"] == 2


def test_a_chunk_that_cannot_be_exported_is_left_out_of_the_offer(wired: Any) -> None:
    _, chunks, _ = wired
    block = chunks.malloc(4096)  # not among the backend's allocations: export fails
    assert ipc.offer() is None and block.ptr in chunks._until
