"""The container walk and the functions over values: what counts as a container,
leaves in order, rebuilds that keep unchanged containers; recognition,
allocations, host copies and rebuilds of containers holding device objects."""

from __future__ import annotations

import weakref
from collections import OrderedDict, namedtuple
from typing import Any

import numpy as np
import pytest
from handler_testing import arange, roundtrip

from cudask.memory import handlers
from cudask.memory.handlers import ContainerCopy, UnspillableError
from cudask.memory.handlers.values import CONTAINERS, leaves, rebuild, split
from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend, ForeignDeviceObject, as_numpy


def _ints(x: Any) -> int | None:
    return x if type(x) is int else None


def test_only_exact_lists_tuples_and_dicts_are_containers() -> None:
    Pair = namedtuple("Pair", "a b")
    assert CONTAINERS == {list, tuple, dict}
    assert not any(type(c) in CONTAINERS for c in (Pair(1, 2), OrderedDict(a=1), {1}, "ab"))
    assert list(leaves([Pair(1, 2), OrderedDict(a=3)], lambda x: x)) == [
        (Pair(1, 2), Pair(1, 2)),
        (OrderedDict(a=3), OrderedDict(a=3)),
    ]


def test_leaves_are_depth_first_in_order_and_picked() -> None:
    value = {"b": [1, ("s", 2)], "a": 3, "c": {"d": [4.0, 5]}}
    assert list(leaves(value, _ints)) == [(1, 1), (2, 2), (3, 3), (5, 5)]
    assert list(leaves(7, _ints)) == [(7, 7)] and list(leaves("x", _ints)) == []
    assert split({"y": 1, "x": 2}) == (["y", "x"], [1, 2])
    assert split((1, 2)) == (None, [1, 2])


def test_rebuild_keeps_unchanged_containers_and_their_kinds() -> None:
    untouched = ["a", ("b",)]
    value = {"n": [1, (2, "t")], "s": untouched}
    out = rebuild(value, lambda x: x * 10 if type(x) is int else x)
    assert out == {"n": [10, (20, "t")], "s": untouched}
    assert out["s"] is untouched and type(out["n"][1]) is tuple
    assert rebuild(value, lambda x: x) is value
    made: list[tuple[str, Any]] = []

    def make(container: Any, keys: list[Any] | None, items: list[Any]) -> Any:
        made.append((type(container).__name__, keys))
        return items

    rebuild([1, ["x"], {"k": 2}], lambda x: -x if type(x) is int else x, make)
    assert made == [("dict", ["k"]), ("list", None)]


def test_leaves_stop_at_the_limit() -> None:
    seen: list[Any] = []

    def pick(x: Any) -> int | None:
        seen.append(x)
        return _ints(x)

    assert leaves([["a", 1], 2, 3], pick, limit=1) == [(1, 1)]
    assert seen == ["a", 1]
    assert leaves([1, 2, 3], _ints, limit=2) == [(1, 1), (2, 2)]


def test_recognises_device_objects() -> None:
    a = arange(4)
    assert handlers.is_device_object(a)
    assert handlers.is_device_object(ForeignDeviceObject(a))
    assert handlers.is_device_object([1, (2, {"x": a})])
    for host in (np.arange(3), b"x", 3, None, [], (1, 2), {"a": np.zeros(2)}, "s"):
        assert not handlers.is_device_object(host)


def test_a_host_object_is_unspillable(engine: TransferEngine) -> None:
    with pytest.raises(UnspillableError, match="ndarray is not a device object"):
        handlers.to_host(np.zeros(3), engine)


def test_views_count_their_whole_allocation() -> None:
    a = arange(100)
    view = a.view(slice(10, 20))
    assert (
        handlers.allocations(view)
        == handlers.allocations(a)
        == [(a.allocation[0], a.allocation[0] + 800)]
    )
    assert handlers.allocations([a, view]) == handlers.allocations(a) * 2


def test_device_leaves_weak_leaves_and_producer_streams() -> None:
    a, b = arange(3), arange(4)
    value = {"x": [a, 1, (b, "s")], "y": np.zeros(2)}
    assert [(leaf, h.name) for leaf, h in handlers.device_leaves(value)] == [
        (a, "fake"),
        (b, "fake"),
    ]
    refs = handlers.weak_leaves(value)
    assert refs is not None and [r() for r in refs] == [a, b]
    dead: list[weakref.ref[Any]] = []
    refs = handlers.weak_leaves([arange(2)], dead.append)  # the leaf dies at once
    assert refs is not None and len(dead) == 1
    foreign = ForeignDeviceObject(a)
    foreign.__cuda_array_interface__ = {**a.__cuda_array_interface__, "stream": 7}
    assert handlers.producer_streams([foreign, a, foreign]) == (7, 7)


def test_containers_keep_their_shape_and_host_items(engine: TransferEngine) -> None:
    a, b = arange(3), arange(4, "i4")
    value = {"a": a, "rest": [b, "label", (a, 5)], "n": np.arange(2)}
    copy = handlers.to_host(value, engine)
    assert isinstance(copy, ContainerCopy)
    assert copy.nbytes == a.nbytes * 2 + b.nbytes
    out = roundtrip(value, engine)
    assert type(out["rest"]) is list and type(out["rest"][2]) is tuple
    assert out["rest"][1] == "label" and out["rest"][2][1] == 5
    np.testing.assert_array_equal(out["n"], value["n"])
    assert out["n"] is value["n"]  # host objects are kept, not copied
    np.testing.assert_equal(as_numpy(out["rest"][0]), b.get())


def test_container_images_nest_only_where_device_objects_are(engine: TransferEngine) -> None:
    """Inner containers holding device objects become ContainerCopy of their kind;
    inner containers of host objects are kept as they are (the same objects); the
    outer one is always an image, even of host objects only."""
    hosts = [1, (2, "x")]
    value = ({"k": arange(2)}, hosts, [arange(1)])
    copy = handlers.to_host(value, engine)
    assert isinstance(copy, ContainerCopy) and copy.kind == "tuple" and copy.keys is None
    first, second, third = copy.items
    assert isinstance(first, ContainerCopy) and (first.kind, first.keys) == ("dict", ["k"])
    assert second is hosts
    assert isinstance(third, ContainerCopy) and third.kind == "list"
    only_hosts = handlers.to_host([1, "a"], engine)
    assert isinstance(only_hosts, ContainerCopy) and only_hosts.items == [1, "a"]


def test_copy_is_ordered_after_producers(engine: TransferEngine) -> None:
    backend = engine.backend
    assert isinstance(backend, FakeCopyBackend)
    lagging = FakeCopyBackend(lag=1000)
    eng = TransferEngine(lagging, PinnedPool(lagging, 1 << 16, slab_size=1 << 16))
    eng.order_after_producers((12345,))
    d2h = eng._stream("d2h")
    assert [op[0] for op in d2h.ops] == ["wait", "wait"]


def test_host_to_device_copies_wait_for_the_default_stream() -> None:
    backend = FakeCopyBackend(lag=10_000)
    engine = TransferEngine(backend, PinnedPool(backend, 0, slab_size=0))
    src, dst = HostBlock.pageable(8), HostBlock.pageable(8)
    engine.to_device(dst.ptr, src.ptr, 8)
    h2d = engine._stream("h2d")
    # the destination may be memory freed by work queued on the default stream
    assert h2d.ops[0][0] == "wait" and h2d.ops[0][1].stream is backend.null
