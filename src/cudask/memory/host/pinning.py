"""How host memory becomes page-locked, and what happens when the driver says no.

Covers: `Pinner`, which pins one slab at a time by the pool's `method` -
"register": an anonymous mapping faulted in by threads
(`cudask.memory.host.faulting`), then registered with the driver
(cudaHostRegister), the next slab optionally faulted in meanwhile by a helper
thread ("cudask-pinned-map"); "host-alloc": cudaHostAlloc - and the fallback
between them: a registration that fails for any reason other than memory
running out switches the pinner to "host-alloc" for good, with one warning.
Also freeing a slab by the way it was pinned, and registering the mapping
behind a fallback block. `METHODS`, `resolve_method("auto")`.

Does not cover: how much to pin or when (`cudask.memory.host.provision`), or the
costs of each method (docs/design/host-memory.md).

Threading: one caller at a time (the pool's thread, or the thread running
`Provisioner.preallocate`); the faulting-ahead state is not locked. Pinning
runs outside the pool's lock: cudaHostRegister holds the driver's locks for
as long as it takes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from cudask.memory.backend import CopyBackend, is_out_of_memory
from cudask.memory.host import faulting
from cudask.memory.host.blocks import FaultedMapping
from cudask.memory.host.slabs import Slab

METHODS = ("auto", "register", "host-alloc")


def resolve_method(method: str) -> str:
    """ "auto": "register" where anonymous mappings are available, else "host-alloc"."""
    if method == "auto":
        return "register" if faulting.available() else "host-alloc"
    return method


class Pinner:
    """Pins and frees slabs for one pool. `warn_once(reason, message)` reports
    the switch from "register" to "host-alloc"."""

    def __init__(
        self,
        backend: CopyBackend | None,
        method: str,
        *,
        populate_threads: int | None,
        warn_once: Callable[[str, str], None],
    ) -> None:
        self.backend = backend
        self.method = resolve_method(method)
        self.populate_threads = populate_threads
        self._warn_once = warn_once
        self._mapper: ThreadPoolExecutor | None = None  # faults the next slab in
        self._premapped: Future[int] | None = None
        self._premapped_size = 0

    def pin(self, nbytes: int, *, premap_next: int = 0) -> tuple[int, bool]:
        """Page-locked memory of `nbytes`: (address, registered), faulting the next
        slab's `premap_next` bytes in meanwhile (0: none). Registration failures switch
        the pool to cudaHostAlloc (one warning)."""
        assert self.backend is not None
        if self.method == "register":
            ptr = self._mapped_slab(nbytes)
            if premap_next:
                self._premap(premap_next)
            try:
                self.backend.register_host(ptr, nbytes)
                return ptr, True
            except Exception as exc:
                faulting.unmap(ptr, nbytes)
                if is_out_of_memory(exc):
                    self._drop_premapped()
                    raise  # the driver refuses to pin more: so would cudaHostAlloc
                self.method = "host-alloc"
                self._drop_premapped()
                self._warn_once(
                    "register",
                    f"registering host memory with the driver failed ({exc}); pinning "
                    "with cudaHostAlloc instead, which is several times slower",
                )
        return self.backend.alloc_pinned(nbytes), False

    def _mapped_slab(self, nbytes: int) -> int:
        """A faulted-in mapping of `nbytes`: the one faulted in ahead if it fits."""
        future, size = self._premapped, self._premapped_size
        self._premapped = None
        if future is not None:
            try:
                ptr = future.result()
            except faulting.HostMemoryError:
                ptr = 0
            if ptr and size == nbytes:
                return ptr
            if ptr:
                faulting.unmap(ptr, size)
        return faulting.map_populated(nbytes, threads=self.populate_threads)

    def _premap(self, nbytes: int) -> None:
        """Fault the next slab in while this one is being registered."""
        if self._mapper is None:
            self._mapper = ThreadPoolExecutor(1, thread_name_prefix="cudask-pinned-map")
        self._premapped = self._mapper.submit(
            faulting.map_populated, nbytes, threads=self.populate_threads
        )
        self._premapped_size = nbytes

    def _drop_premapped(self) -> None:
        future, self._premapped = self._premapped, None
        if future is not None:
            try:
                ptr = future.result()
            except faulting.HostMemoryError:
                return
            faulting.unmap(ptr, self._premapped_size)

    def free(self, slab: Slab) -> None:
        """Give a slab back to the driver and the operating system."""
        assert self.backend is not None
        if slab.registered:
            self.backend.unregister_host(slab.ptr)
            faulting.unmap(slab.ptr, slab.size)
        else:
            self.backend.free_pinned(slab.ptr)

    def register(self, mapping: FaultedMapping) -> None:
        """Register a fallback block's mapping (raises when the driver refuses);
        it is unregistered when the mapping dies."""
        assert self.backend is not None
        self.backend.register_host(mapping.ptr, mapping.size)
        mapping.mark_registered(self.backend)

    def close(self) -> None:
        """Give back a slab faulted in ahead and stop the helper thread."""
        self._drop_premapped()
        if self._mapper is not None:
            self._mapper.shutdown(wait=True)


__all__ = ["METHODS", "Pinner", "resolve_method"]
