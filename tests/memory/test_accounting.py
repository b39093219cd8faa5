"""AllocationLedger: the union of owners' ranges, checked against brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cudask.memory.accounting import AllocationLedger, union_bytes


def brute(owners: dict[int, list[tuple[int, int]]]) -> int:
    covered: set[int] = set()
    for ranges in owners.values():
        for a, b in ranges:
            covered.update(range(a, b))
    return len(covered)


ranges_st = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans(), ranges_st), max_size=40))
def test_ledger_matches_brute_force(ops: list[tuple[int, bool, list[tuple[int, int]]]]) -> None:
    ledger = AllocationLedger()
    model: dict[int, list[tuple[int, int]]] = {}
    for owner, add, ranges in ops:
        if add:
            ledger.add(owner, ranges)
            model[owner] = [r for r in ranges if r[1] > r[0]]
        else:
            ledger.discard(owner)
            model.pop(owner, None)
        assert ledger.total == brute(model)
        for o in model:
            others = {k: v for k, v in model.items() if k != o}
            assert ledger.exclusive_bytes(o) == brute(model) - brute(others)
    for owner in list(model):
        ledger.discard(owner)
    assert ledger.total == 0
    assert ledger._points == []  # compacted back to nothing


def test_aliases_count_once() -> None:
    ledger = AllocationLedger()
    ledger.add("a", [(1000, 2000)])
    ledger.add("b", [(1000, 2000)])  # same allocation under another key
    ledger.add("c", [(1500, 1600)])  # a view inside it
    assert ledger.total == 1000
    ledger.discard("a")
    assert ledger.total == 1000  # still held by b and c
    ledger.discard("b")
    assert ledger.total == 100
    assert "c" in ledger and len(ledger) == 1


def test_add_replaces_previous_ranges() -> None:
    ledger = AllocationLedger()
    ledger.add("a", [(0, 10)])
    ledger.add("a", [(100, 105)])
    assert ledger.total == 5
    assert ledger.ranges("a") == [(100, 105)]


def test_union_bytes() -> None:
    assert union_bytes([(0, 10), (5, 20), (30, 31)]) == 21
    assert union_bytes([]) == 0
