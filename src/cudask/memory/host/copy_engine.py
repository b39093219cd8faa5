"""Copies between device memory and host blocks, on dedicated CUDA streams.

Covers: `TransferEngine`, which issues device -> host copies into blocks of a
`PinnedPool` on a non-blocking stream without waiting for them, and host ->
device copies on a second stream. Each copy is ordered after the work that
produced its source: before a device -> host copy the copy stream waits on
an event recorded on the legacy default stream (which every blocking stream
and the per-thread default streams synchronise with) and, when the object's
`__cuda_array_interface__` names another stream, on that stream too. Each
host -> device copy is ordered after the legacy default stream as well, where
the destination was allocated (a stream-ordered pool may reuse memory that
queued work still reads).

Does not cover: the CUDA calls themselves (`cudask.memory.backend`), how the
pool is carved (`cudask.memory.host.pool`), which objects live on the device
or how they are rebuilt (the handlers), or when to spill (the store).

Threading: every method may be called from any thread; the streams are
created once under a lock and only used to enqueue work.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cudask.memory.backend import Copy, CopyBackend
from cudask.memory.host.blocks import HostBlock
from cudask.memory.host.pool import PinnedPool


class TransferEngine:
    """Issue copies between device memory and host blocks of a `PinnedPool`.

    `to_host` allocates a host block from the pool (pinned, or pageable when the
    pool is exhausted), enqueues the copy on the device -> host stream and returns
    at once with a `Copy` whose event the caller keeps; the source must stay
    alive until `Copy.ready()` (the store keeps it in its in-flight list).
    `to_device` enqueues a host -> device copy on the other stream.
    """

    def __init__(self, backend: CopyBackend, pool: PinnedPool) -> None:
        self.backend = backend
        self.pool = pool
        self._lock = threading.Lock()
        self._streams: dict[str, Any] = {}

    def _stream(self, which: str) -> Any:
        stream = self._streams.get(which)
        if stream is None:
            with self._lock:
                stream = self._streams.get(which)
                if stream is None:
                    stream = self._streams[which] = self.backend.new_stream()
        return stream

    def order_after_producers(self, producer_streams: tuple[int, ...] = ()) -> None:
        """Make the device -> host stream wait for work already enqueued on the
        legacy default stream and on the given raw stream handles."""
        stream = self._stream("d2h")
        self.backend.wait_event(stream, self.backend.record(None))
        for handle in producer_streams:
            if handle in (0, 1, 2):  # legacy / per-thread defaults: covered above
                continue
            self.backend.wait_event(
                stream, self.backend.record(self.backend.external_stream(handle))
            )

    def to_host(self, src: int, nbytes: int) -> tuple[HostBlock, Copy]:
        """Copy `nbytes` at device address `src` into a new host block (async)."""
        block = self.pool.allocate(nbytes)
        stream = self._stream("d2h")
        start = self.backend.record(stream)
        if nbytes:
            self.backend.copy_d2h(block.ptr, src, nbytes, stream)
        done = self.backend.record(stream)
        return block, Copy(nbytes, start, done, self.backend)

    def to_device(self, dst: int, src_host: int, nbytes: int, after: Copy | None = None) -> Copy:
        """Copy `nbytes` from host address `src_host` to device address `dst`
        (async; ordered after `after`, the copy that filled the host block)."""
        stream = self._stream("h2d")
        # `dst` was just allocated, on the legacy default stream for CuPy and RMM:
        # stream-ordered pools may hand out memory that work queued there still
        # reads, so the copy must not overtake that work.
        self.backend.wait_event(stream, self.backend.record(None))
        if after is not None and not after.ready():
            self.backend.wait_event(stream, after.done)
        start = self.backend.record(stream)
        if nbytes:
            self.backend.copy_h2d(dst, src_host, nbytes, stream)
        done = self.backend.record(stream)
        return Copy(nbytes, start, done, self.backend)

    def order_default_after(self, copies: list[Copy]) -> None:
        """Make the legacy default stream wait for `copies` (no host wait): work
        enqueued there afterwards, and on every stream that synchronises with it,
        reads what they copied."""
        for copy in copies:
            self.backend.wait_event(None, copy.done)

    def stream_seconds(self, copy: Copy) -> float:
        """Seconds a completed copy took on its stream, between its own events:
        what the bus took, without the wait for producers or for copies queued
        before it (wall time since it was enqueued where events carry no timing)."""
        try:
            return self.backend.elapsed(copy.start, copy.done)
        except Exception:  # noqa: BLE001 - events without timing
            return time.perf_counter() - copy.wall_start


__all__ = ["TransferEngine"]
