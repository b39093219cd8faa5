"""The container walk: what counts as a container, leaves in order, rebuilds
that keep unchanged containers as they are."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

from cudask.memory.handlers.walk import CONTAINERS, leaves, rebuild, split


def _ints(x: Any) -> int | None:
    return x if type(x) is int else None


def test_only_exact_lists_tuples_and_dicts_are_containers() -> None:
    Pair = namedtuple("Pair", "a b")
    assert CONTAINERS == {list, tuple, dict}
    assert not any(type(c) in CONTAINERS for c in (Pair(1, 2), OrderedDict(a=1), {1}, "ab"))
    assert list(leaves([Pair(1, 2), OrderedDict(a=3)], lambda x: x)) == [
        (Pair(1, 2), Pair(1, 2)), (OrderedDict(a=3), OrderedDict(a=3))]


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
