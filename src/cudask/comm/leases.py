"""CuPy allocations sent by CUDA IPC, kept mappable by their receivers for a while.

Covers: `Chunks`, the record of the allocations (chunks, one cudaMalloc each) a
CuPy memory pool takes through `Chunks.malloc`; `install`, which makes such a
pool (`LeasingPool`) CuPy's allocator in a worker whose CuPy still allocates
from its default pool (no RMM resource set for it); `current_pool`, the pool
CuPy allocates from; `sending` and `extend`, which cudask.comm.ipc calls for
what it sends by handle; `sweep`; `stats`.

A chunk sent by handle is leased for `lease` seconds from the moment its sender
has the receiver's answer (`extend`). The pool may drop the chunk meanwhile
(`free_all_blocks`, or its own retry when CUDA is out of memory), but its
cudaFree then waits until the lease has run out (`sweep`: before each new chunk,
periodically from the worker plugin, and when CUDA refuses a chunk; an allocation
refused again after the pool gave its cached chunks back waits for a lease to end,
at most the lease, where the retired chunks could hold it). A receiver keeps its
mapping of a leased chunk for a quarter of the lease after each use and closes it
then (cudask.comm.lifetimes.Mappings), so no process frees memory another still
maps, which CUDA leaves undefined. A dropped chunk still leased counts in the
pool's `total_bytes` (so in the device limit). Reasons and costs:
docs/design/comm.md.

Does not cover: RMM pools (their slabs last as long as the pool:
cudask.comm.lifetimes.Slabs), what is sent and how (cudask.comm.ipc).

Threading: `malloc` runs in any thread that allocates; the pool drops a chunk in
any thread, holding its own lock, so what runs then (`_dropped`) calls nothing of
the pool and changes the record one dictionary operation at a time (each atomic
under the GIL); `sending` and `extend` run in serialization threads and the
event loop, `sweep` in the event loop and allocating threads.
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

# cudaErrorMemoryAllocation: the status of a CUDARuntimeError raised by a cudaMalloc that found
# no memory (CuPy's Python runtime module does not export the enum).
CUDA_ERROR_MEMORY_ALLOCATION = 2
# Two refusals this close together are one allocation's tries (CuPy's pool frees its cached
# chunks between them): only the second waits for a lease to end.
RETRY_WINDOW = 1.0


class _Owner:
    """What the pool's record of a chunk holds: its end is the pool dropping the chunk."""

    __slots__ = ("__weakref__",)


class Chunks:
    """The chunks of one pool: `allocate(nbytes)` makes an allocation (an object with
    `ptr` that frees it when the last reference goes: cupy.cuda.Memory),
    `wrap(allocation, nbytes, owner)` what the pool keeps for it (a MemoryPointer
    to memory holding `owner`), `out_of_memory(error)` whether `allocate` failed
    for lack of memory."""

    def __init__(
        self,
        lease: float,
        allocate: Callable[[int], Any],
        wrap: Callable[[Any, int, _Owner], Any],
        out_of_memory: Callable[[BaseException], bool],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if lease <= 0:
            raise ValueError(f"lease={lease!r}: give a positive number of seconds")
        self.lease = lease
        self._allocate, self._wrap, self._out_of_memory = allocate, wrap, out_of_memory
        self._clock, self._sleep = clock, sleep
        self._memory: dict[int, Any] = {}  # base -> allocation, live or retired
        self._sizes: dict[int, int] = {}
        self._until: dict[int, float] = {}  # base -> end of the lease of a sent live chunk
        self._retired: dict[int, float] = {}  # base -> end of its lease, dropped by the pool
        self.counts = {"chunks-freed-late": 0}
        self._refused_at = -math.inf  # when CUDA last refused a chunk

    def malloc(self, nbytes: int) -> Any:
        """A new chunk of `nbytes` (the pool's allocator)."""
        self.sweep()
        try:
            memory = self._allocate(nbytes)
        except Exception as exc:
            if not (self._out_of_memory(exc) and self._wait_for_retired(nbytes)):
                raise
            memory = self._allocate(nbytes)
        base = int(memory.ptr)
        self._sizes[base] = nbytes
        self._memory[base] = memory
        owner = _Owner()
        weakref.finalize(owner, self._dropped, base).atexit = False
        return self._wrap(memory, nbytes, owner)

    def _dropped(self, base: int) -> None:
        until = self._until.pop(base, 0.0)
        if until > self._clock():
            self._retired[base] = until
        else:
            self._free(base)

    def _free(self, base: int) -> None:
        self._sizes.pop(base, None)
        self._memory.pop(base, None)  # the last reference: the allocation is freed

    def _wait_for_retired(self, nbytes: int) -> bool:
        """CUDA refused `nbytes`: free the retired chunks whose lease has ended. When none
        had, the retired ones could hold `nbytes` and the last refusal came just before
        (the pool gives its cached chunks back between two tries, as CuPy's does), wait
        for the first lease to end. False: let the refusal through."""
        now = self._clock()
        previous, self._refused_at = self._refused_at, now
        if self.sweep() > 0:
            return True
        ends = list(self._retired.values())
        if not ends or now - previous > RETRY_WINDOW or self.retired_bytes() < nbytes:
            return False
        self._sleep(max(0.0, min(ends) - now))
        return self.sweep() > 0

    def sending(self, base: int) -> bool:
        """Whether the allocation at `base`, about to go by handle, is a live chunk of
        this pool (leased once the send has ended: `extend`)."""
        return base in self._memory and base not in self._retired

    def extend(self, bases: Iterable[int]) -> None:
        """The sends of the chunks at `bases` have ended (their receivers answered):
        lease each for `lease` seconds from now."""
        until = self._clock() + self.lease
        for base in bases:
            if self.sending(base):
                self._until[base] = max(until, self._until.get(base, 0.0))

    def sweep(self) -> int:
        """Free the dropped chunks whose lease has ended; how many."""
        now = self._clock()
        freed = 0
        for base, until in list(self._retired.items()):
            if until <= now and self._retired.pop(base, None) is not None:
                self._free(base)
                freed += 1
        self.counts["chunks-freed-late"] += freed
        return freed

    def retired_bytes(self) -> int:
        """Bytes of the chunks the pool dropped whose lease runs still."""
        return sum(self._sizes.get(base, 0) for base in list(self._retired))

    def live(self) -> int:
        """Chunks the pool holds."""
        return len(self._memory) - len(self._retired)


_installed: Chunks | None = None
_pool: Any = None  # the LeasingPool CuPy allocates from, once installed


@functools.cache
def _pool_type() -> type:
    import cupy

    class LeasingPool(cupy.cuda.MemoryPool):  # type: ignore[misc,name-defined]
        """A CuPy memory pool over `Chunks.malloc`; its total counts the dropped
        chunks still leased (device memory this process holds)."""

        def total_bytes(self) -> int:
            chunks = getattr(self, "chunks", None)
            return int(super().total_bytes()) + (chunks.retired_bytes() if chunks else 0)

    return LeasingPool


def _cupy_chunks(lease: float) -> Chunks:
    import cupy

    runtime = cupy.cuda.runtime
    device = cupy.cuda.runtime.getDevice()

    def wrap(memory: Any, nbytes: int, owner: _Owner) -> Any:
        return cupy.cuda.MemoryPointer(
            cupy.cuda.UnownedMemory(int(memory.ptr), nbytes, owner, device), 0
        )

    def out_of_memory(exc: BaseException) -> bool:
        return (
            isinstance(exc, runtime.CUDARuntimeError) and exc.status == CUDA_ERROR_MEMORY_ALLOCATION
        )

    return Chunks(lease, cupy.cuda.Memory, wrap, out_of_memory)


def install(lease: float) -> Chunks | None:
    """Make a LeasingPool whose chunks are leased `lease` seconds after each send
    CuPy's allocator, when CuPy allocates from its default pool (nothing else was
    set); the chunks' record, or None when another allocator is set. Once per
    process: later calls return the first one's record."""
    global _installed, _pool
    import cupy

    if _installed is not None:
        return _installed
    if getattr(cupy.cuda.get_allocator(), "__self__", None) is not cupy.get_default_memory_pool():
        return None
    chunks = _cupy_chunks(lease)
    pool = _pool_type()(chunks.malloc)
    pool.chunks = chunks
    cupy.cuda.set_allocator(pool.malloc)
    _installed, _pool = chunks, pool
    return chunks


def current_pool() -> Any:
    """The memory pool CuPy allocates from in this process when it allocates from a
    pool of its own: the leasing pool once installed, else CuPy's default pool."""
    import cupy

    return _pool if _pool is not None else cupy.get_default_memory_pool()


def sending(base: int) -> float:
    """The lease, in seconds, of the allocation at `base` about to go by handle: 0
    when it is not a chunk of the leasing pool."""
    chunks = _installed
    return chunks.lease if chunks is not None and chunks.sending(base) else 0.0


def extend(bases: Iterable[int]) -> None:
    """Lease the chunks at `bases` from now (their sends have ended)."""
    if _installed is not None:
        _installed.extend(bases)


def stats() -> dict[str, float]:
    """This process's leasing pool: its lease in seconds (0: not installed), the chunks it
    holds, the bytes of dropped chunks still leased, and the chunks freed at a lease's end."""
    chunks = _installed
    if chunks is None:
        return {
            "lease-seconds": 0.0,
            "chunks-live": 0,
            "chunks-retired-bytes": 0,
            "chunks-freed-late": 0,
        }
    return {
        "lease-seconds": chunks.lease,
        "chunks-live": chunks.live(),
        "chunks-retired-bytes": chunks.retired_bytes(),
        **chunks.counts,
    }


def sweep() -> int:
    """Free the dropped chunks whose lease has ended (the worker runs this periodically)."""
    return _installed.sweep() if _installed is not None else 0


__all__ = ["Chunks", "current_pool", "extend", "install", "sending", "stats", "sweep"]
