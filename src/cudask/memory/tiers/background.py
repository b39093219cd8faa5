"""The background spilling thread of a store.

Covers: `start`, which runs `step(owner)` in a daemon thread for as long as it
reports more to do, then `idle(owner)` (which waits a little and returns
False once the owner is closed), again and again. The thread holds its owner
only weakly, between steps, so a store dropped without `close()` is still
collected and the thread ends.

Does not cover: what a step spills or how long idling waits (the store's
`_background_step` and `_background_idle`).

Threading: `step` and `idle` run in the new thread and take the owner's lock
themselves.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def start(
    owner: T, step: Callable[[T], bool], idle: Callable[[T], bool], name: str
) -> threading.Thread:
    """Start the thread; `step(owner)`: one step, whether there is more to do;
    `idle(owner)`: wait for more, False to stop."""
    thread = threading.Thread(
        target=_loop, args=(weakref.ref(owner), step, idle), name=name, daemon=True
    )
    thread.start()
    return thread


def _loop(ref: weakref.ref[T], step: Callable[[T], bool], idle: Callable[[T], bool]) -> None:
    while True:
        owner = ref()
        if owner is None:
            return
        if not step(owner) and not idle(owner):
            return
        del owner


__all__ = ["start"]
