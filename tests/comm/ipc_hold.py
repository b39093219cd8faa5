"""A transfer caught in flight, for the tests that kill a worker in the middle of one.

Covers: `HoldNext`, a `cudask.comm.ipc_cuda.Backend` around a worker's own that,
on the first call of one of its methods, writes this process's pid to a marker
file and then waits (`seconds`, long enough for the test to kill the process),
before doing the call: "export" holds a sender while it makes the handle its
peer asked for (the peer is waiting for the answer), "open" holds a receiver
once the handle has arrived and before anything of the sender's is mapped,
"copy" holds a receiver before it copies from a mapping it has (a staging area
mapped ahead).
`hold_next(method, marker, seconds)`, run on a worker (`Client.run`), installs
it through `cudask.comm.ipc.enable`, the entry point the worker itself uses.
Does not cover: killing the process (the test) or which worker sends.
Threading: the hold blocks the calling thread (the worker's event loop, where
small messages are serialized); only the first call holds.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

METHODS = ("export", "open", "copy")


class HoldNext:
    def __init__(self, inner: Any, method: str, marker: str, seconds: float) -> None:
        if method not in METHODS:
            raise ValueError(f"method={method!r}; accepted: {', '.join(METHODS)}")
        self.inner = inner
        self.method = method
        self.marker = marker
        self.seconds = seconds
        self._first = threading.Lock()

    def _hold(self, method: str) -> None:
        if method != self.method or not self._first.acquire(blocking=False):
            return
        with open(f"{self.marker}.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(f"{self.marker}.tmp", self.marker)  # seen whole or not at all
        time.sleep(self.seconds)  # the test kills this process meanwhile

    def export(self, ptr: int) -> tuple[bytes, int]:
        self._hold("export")
        return self.inner.export(ptr)  # type: ignore[no-any-return]

    def open(self, handle: bytes) -> int:
        self._hold("open")
        return self.inner.open(handle)  # type: ignore[no-any-return]

    def copy(self, out: Any, src: int, strides: tuple[int, ...]) -> None:
        self._hold("copy")
        self.inner.copy(out, src, strides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def hold_next(method: str, marker: str, seconds: float = 120.0) -> None:
    """Hold this worker's next IPC `method` call (see the module docstring)."""
    from cudask.comm import ipc

    real = ipc._receiving_backend()  # the sending backend where there is one
    real = getattr(real, "inner", real)  # a hold of an earlier round, spent
    ipc.enable(HoldNext(real, method, marker, seconds), ipc._state.min_size)


__all__ = ["METHODS", "HoldNext", "hold_next"]
