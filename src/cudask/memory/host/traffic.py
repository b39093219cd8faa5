"""Device traffic between processes under way in this process, so that pinning
ahead of spills waits for a quiet moment.

Covers: marking a transfer of device memory with another process while it runs
(`moving()`: the comm layer wraps each CUDA IPC send and receive in it) and
telling whether the process has been quiet for a while (`quiet`). Pinning a slab
(cudaHostRegister, cudaHostAlloc) holds the CUDA driver for tens of
milliseconds, stalling the IPC mappings, allocations and copies of the same
process meanwhile; the pinned pool's thread (`cudask.memory.host.provision`) asks
`quiet` before each slab and defers it, within a bound, while transfers run.

Does not cover: what moves (`cudask.comm.ipc`), or pinning itself.

Threading: any thread; one lock guards the count and the time of the last end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A slab is deferred until no transfer has run for this long (transfers of one
# exchange come in bursts a few milliseconds apart) ...
QUIET_SECONDS = 0.1
# ... but for this long at most, so that spills under continuous traffic still
# find pinned memory (one slab then stalls the traffic once per this period).
MOST_DEFERRED_SECONDS = 1.0

_lock = threading.Lock()
_active = 0
_last_end = -float("inf")


@contextmanager
def moving() -> Iterator[None]:
    """Mark a transfer of device memory with another process as under way."""
    global _active, _last_end
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            _last_end = time.monotonic()


def quiet(seconds: float = QUIET_SECONDS) -> bool:
    """Whether no transfer runs now and none ended in the last `seconds`."""
    with _lock:
        return _active == 0 and time.monotonic() - _last_end >= seconds


def await_quiet(wake: threading.Condition, stop: Callable[[], bool]) -> float:
    """Wait on `wake` (its lock held by the caller) until `quiet()`, `stop()` or
    MOST_DEFERRED_SECONDS have passed; return the seconds waited (0.0 when quiet)."""
    if quiet():
        return 0.0
    started = time.monotonic()
    deadline = started + MOST_DEFERRED_SECONDS
    while not quiet() and not stop() and time.monotonic() < deadline:
        wake.wait(0.01)
    return time.monotonic() - started


__all__ = ["MOST_DEFERRED_SECONDS", "QUIET_SECONDS", "await_quiet", "moving", "quiet"]
