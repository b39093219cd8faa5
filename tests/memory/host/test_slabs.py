"""Slab bookkeeping alone: first fit, coalescing, bytes in use, idle slabs, wider slabs."""

from __future__ import annotations

import time

from cudask.memory.host.slabs import WIDEST, Slab, Slabs, wider


def test_a_slab_carves_first_fit_and_coalesces_both_ways() -> None:
    slab = Slab(ptr=4096, size=1000, registered=True)
    assert slab.idle_since is not None and slab.free_bytes == 1000
    a, b, c = slab.take(100), slab.take(200), slab.take(300)
    assert (a, b, c) == (0, 100, 300) and slab.idle_since is None
    assert slab.free_bytes == 400 and slab.largest_free == 400
    slab.give(100, 200)  # a hole between a and c
    assert slab.take(250) == 600  # first fit skips the 200-byte hole
    assert slab.take(150) == 100  # and fills it later
    slab.give(0, 100)
    slab.give(100, 150)  # joins [0, 100) and the 50 bytes left at [250, 300)
    assert slab.free_offsets == [0, 850] and slab.free_sizes == [300, 150]
    slab.give(300, 300)  # joins the range before it only
    assert slab.free_offsets == [0, 850] and slab.free_sizes == [600, 150]
    slab.give(600, 250)
    assert slab.free_offsets == [0] and slab.free_sizes == [1000]
    assert slab.idle_since is not None  # wholly free again
    assert slab.take(1001) is None


def test_slabs_take_from_the_first_slab_with_room_and_count_bytes_in_use() -> None:
    slabs = Slabs()
    first, second = Slab(0, 256, True), Slab(1 << 20, 512, False)
    slabs.add(first)
    slabs.add(second)
    assert len(slabs) == 2 and slabs.size == 768 and list(slabs) == [first, second]
    taken = slabs.take(256)
    assert taken == (first, 0) and slabs.in_use == 256
    assert slabs.take(256) == (second, 0)
    assert slabs.take(512) is None and slabs.in_use == 512
    slabs.give(first, 0, 256)
    assert slabs.in_use == 256 and first.free_bytes == 256
    assert slabs.clear() == [first, second] and len(slabs) == 0 and slabs.in_use == 0


def test_idle_slabs_go_newest_first_keeping_a_floor() -> None:
    slabs = Slabs()
    old, mid, new = Slab(0, 100, True), Slab(1000, 100, True), Slab(2000, 100, True)
    for slab in (old, mid, new):
        slabs.add(slab)
    assert slabs.take_idle(None, keep=0) == ([], None)  # no timer, no trim
    busy = slabs.take(10)
    assert busy is not None and busy[0] is old
    # mid and new are idle since just now: not yet due after 60 s
    idle, wait = slabs.take_idle(60.0, keep=0)
    assert idle == [] and wait is not None and 59 < wait <= 60
    # due at once: newest first, never below `keep` bytes of slabs
    idle, wait = slabs.take_idle(0.0, keep=200)
    assert idle == [new] and wait is None and list(slabs) == [old, mid]
    slabs.give(old, busy[1], 10)
    idle, _ = slabs.take_idle(3600.0, keep=0, trim=True)  # trim: every free one now
    assert idle == [mid, old] and len(slabs) == 0


def test_a_slab_wholly_freed_is_idle_from_then() -> None:
    slab = Slab(0, 64, True)
    slab.take(64)
    before = time.monotonic()
    slab.give(0, 64)
    assert slab.idle_since is not None and slab.idle_since >= before


def test_later_slabs_widen_to_hold_two_blocks_up_to_the_widest() -> None:
    MiB, GiB = 1 << 20, 1 << 30
    base = 256 * MiB
    assert WIDEST == GiB
    assert wider(480 * 10**6, base, base) == GiB  # two 480 MB frames
    assert wider(320 * 10**6, base, base) == 768 * MiB
    assert wider(320 * 10**6, base, GiB) == GiB  # never narrower than before
    assert wider(600 * MiB, base, base) == GiB  # two would pass 1 GiB: one
    assert wider(1536 * MiB, base, base) == base  # past 1 GiB: a slab of its own, no widening
    assert wider(1536 * MiB, 2 * GiB, 2 * GiB) == 2 * GiB  # a base past 1 GiB is the widest
