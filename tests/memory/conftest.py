"""Fixtures of the memory tests: a fake copy backend and stores built on it."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.testing import wait_for as poll_until
from cudask.testing.fake_cuda import FakeCopyBackend


@pytest.fixture
def backend() -> FakeCopyBackend:
    return FakeCopyBackend()


# keywords of store_settings: the `cudask.memory.*` overrides and the parts' fixed parameters
_SETTINGS = set(inspect.signature(store_settings).parameters) - {
    "device_memory_limit",
    "memory_limit",
    "parts",
} | {"pinned_slab_size", "pinned_headroom", "pinned_headroom_from", "background", "spill_at_limit"}


def _factory(tmp_path: Any, default: type) -> Iterator[Callable[..., Any]]:
    """Stores with the fake copy backend and small pools, closed after the test.
    Keywords of `store_settings` (pinned_pool_size=..., background=...) go into
    the store's `settings`, unless the store class takes them itself."""
    stores: list[Any] = []

    def make(cls: type | None = None, **kwargs: Any) -> Any:
        cls = cls or default
        kwargs.setdefault("backend", FakeCopyBackend())
        kwargs.setdefault("background", False)
        kwargs.setdefault("pinned_preallocate", False)
        kwargs.setdefault("pinned_pool_size", 1 << 20)
        kwargs.setdefault("pinned_slab_size", 1 << 16)
        kwargs.setdefault("local_directory", str(tmp_path / f"spill{len(stores)}"))
        own = set(inspect.signature(cls).parameters)
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in _SETTINGS and k not in own}
        kwargs["settings"] = store_settings(
            kwargs.get("device_memory_limit"), kwargs.get("memory_limit"), **overrides
        )
        store = cls(**kwargs)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def make_store(tmp_path: Any) -> Iterator[Callable[..., TieredStore]]:
    yield from _factory(tmp_path, TieredStore)


@pytest.fixture
def make_proxy_store(tmp_path: Any) -> Iterator[Callable[..., Any]]:
    from cudask.memory.jit.proxy_store import ProxyStore

    yield from _factory(tmp_path, ProxyStore)


def _in_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


@pytest.fixture
def in_threads() -> Callable[[Callable[[int], None], int], list[BaseException]]:
    """`in_threads(work, count)`: run work(0) .. work(count - 1) at once, each in its own
    thread; returns what they raised."""
    return _in_threads


@pytest.fixture
def wait_for() -> Callable[..., bool]:
    """`wait_for(condition, timeout=60)`: poll until condition() holds or the time is up;
    returns its last value (for work a background thread finishes)."""
    return partial(poll_until, timeout=60.0, interval=0.01)


@contextlib.contextmanager
def _store_busy(store: Any) -> Iterator[None]:
    """Inside: a thread holds `store.lock` and waits for a lock this thread holds (as a
    thread spilling a cuDF buffer waits for the buffer's lock while the allocating thread,
    unspilling it, holds it). On exit that lock is let go and the thread has finished."""
    other, held = threading.Lock(), threading.Event()

    def holding() -> None:
        with store.lock:
            held.set()
            with other:
                pass

    with other:
        thread = threading.Thread(target=holding, daemon=True)
        thread.start()
        assert held.wait(30)
        yield
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def store_busy() -> Callable[[Any], contextlib.AbstractContextManager[None]]:
    """`with store_busy(store):` the store's lock held by a thread waiting for this one."""
    return _store_busy
