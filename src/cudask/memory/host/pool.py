"""The pinned pool: blocks for device -> host copies, carved out of pinned slabs.

Covers: `PinnedPool`, which carves blocks out of its slabs (first fit, coalesced
on release) and takes them back, after the copy in flight where there is one; a
request that no free range serves gets a fallback block at once (`fallback`). It
makes the parts shared with its `provisioner` (slabs, lock, fallbacks, pinner,
deferred blocks) and forwards the store's calls to it.

Does not cover: when slabs are reserved or given back (`provision`), how memory
is pinned (`pinning`), or copying (`transfer`).

Threading: public methods are thread-safe (one lock, shared with the
provisioner); `HostBlock.release(after=copy)` defers a release until the copy
using the block completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cudask.memory.backend import Copy, CopyBackend
from cudask.memory.host import fallback
from cudask.memory.host.blocks import DeferredBlocks, HostBlock
from cudask.memory.host.fallback import Fallbacks
from cudask.memory.host.faulting import round_up
from cudask.memory.host.pinning import METHODS, Pinner
from cudask.memory.host.provision import Provisioner
from cudask.memory.host.slabs import Slabs

# Blocks start at multiples of this many bytes.
ALIGNMENT = 256
# Bytes of one slab: each is one registration with the driver, during which the
# process's other CUDA calls wait (docs/design/host-memory.md).
SLAB_SIZE = 256 << 20
# The most of the host memory available (counting what the pool holds) it pins.
AVAILABLE_FRACTION = 0.5


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


class PinnedPool:
    """Pinned host memory up to `capacity` bytes, reserved `slab_size` at a time
    by its `provisioner`; see the module docstring.

    `release_after`: seconds a wholly free slab is kept (None: kept until
    `trim`). `method`: "auto" (register where possible), "register" or
    "host-alloc". `available`: bytes of host memory available now (default:
    psutil's MemAvailable); `available_fraction`: the most of it (plus what the
    pool holds) the pool pins. `populate_threads`: threads faulting memory in
    (None: `faulting.default_threads()`).
    """

    def __init__(
        self,
        backend: CopyBackend | None,
        capacity: int,
        *,
        slab_size: int = SLAB_SIZE,
        alignment: int = ALIGNMENT,
        release_after: float | None = None,
        method: str = "auto",
        available: Callable[[], int] | None = None,
        available_fraction: float = AVAILABLE_FRACTION,
        populate_threads: int | None = None,
    ) -> None:
        _check(capacity, slab_size, release_after, method, available_fraction)
        self.capacity = capacity if backend is not None else 0
        self.alignment = alignment
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._slabs = Slabs()
        self._deferred = DeferredBlocks(self._give)  # released while their copies run
        self._fallbacks = Fallbacks(self._wake, populate_threads)
        self._pinner = Pinner(
            backend,
            method,
            populate_threads=populate_threads,
            warn_once=self._fallbacks.warn_once,
        )
        self.provisioner = Provisioner(
            self._slabs,
            self._wake,
            pinner=self._pinner,
            fallbacks=self._fallbacks,
            deferred=self._deferred,
            capacity=self.capacity,
            slab_size=slab_size,
            alignment=alignment,
            release_after=release_after,
            available=available or _available_memory,
            available_fraction=available_fraction,
        )

    # -- introspection ---------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes of pinned memory reserved in slabs (and not yet given back)."""
        return self.provisioner.reserved

    @property
    def slabs(self) -> int:
        return len(self._slabs)

    @property
    def in_use(self) -> int:
        """Bytes of the slabs carved out as blocks not yet given back."""
        return self._slabs.in_use

    @property
    def method(self) -> str:
        """How slabs are pinned now: "register" or "host-alloc"."""
        return self._pinner.method

    # -- allocation ------------------------------------------------------------
    def allocate(self, nbytes: int) -> HostBlock:
        """A block of at least `nbytes`: pinned when a free pinned range is ready,
        else a fallback block (never waits for pinning)."""
        if nbytes == 0 or self.capacity == 0:
            return HostBlock.pageable(nbytes)
        size = round_up(nbytes, self.alignment)
        self._deferred.collect()
        block = self._carve(nbytes, size, ahead=True)
        # copies in flight may hold blocks (for milliseconds): wait, retry, then fall back
        if block is None and self._deferred.collect(wait=True):
            block = self._carve(nbytes, size, ahead=False)
        if block is not None:
            return block
        reason, why, fragmented = self._why_not(size)
        # called from here, so that its warning names the caller of allocate
        return self._fallbacks.block(
            nbytes, reason, why, register_later=self.method == "register", fragmented=fragmented
        )

    def _carve(self, nbytes: int, size: int, *, ahead: bool) -> HostBlock | None:
        """A pinned block of `size` bytes from the slabs (None if no range is free);
        with `ahead`, keep the headroom free ahead of use."""
        with self._lock:
            taken = self._slabs.take(size)
            if taken is not None and ahead:
                self.provisioner.ask_ahead(0)
        if taken is None:
            return None
        slab, offset = taken
        return HostBlock(
            slab.ptr + offset, nbytes, pinned=True, pool=self, slab=slab, offset=offset, size=size
        )

    def _why_not(self, size: int) -> tuple[str, str, bool]:
        """Why no pinned range serves `size` bytes: the reason, its message, and
        whether the free bytes would have held it in one piece; while memory is
        still being made ready, asks the provisioner for more."""
        with self._lock:
            reason = self.provisioner.why_not(size)
            fragmented = self._slabs.size - self._slabs.in_use >= size
            if reason == "warmup":
                self.provisioner.ask_ahead(size, fragmented)
            why = fallback.message(
                reason,
                capacity=self.capacity,
                reserved=self.reserved,
                goal=self.provisioner.goal,
            )
        return reason, why, fragmented

    # -- release ---------------------------------------------------------------
    def release_block(self, block: HostBlock, after: Copy | None) -> None:
        """Take `block` back, once `after` has completed (`HostBlock.release`)."""
        if after is not None and not after.ready():
            self._deferred.add(block, after)
            with self._lock:
                self._wake.notify_all()  # the provisioner's thread looks at the copy soon
        else:
            self._give(block)

    def _give(self, block: HostBlock) -> None:
        with self._lock:
            if block.released:
                return
            block.released = True
            assert block._slab is not None
            self._slabs.give(block._slab, block._offset, block._size)
            if block._slab.idle_since is not None:
                self.provisioner.slab_idle()

    # -- what the store asks of provisioning (`Provisioner`) --------------------
    def start_background(self, goal: int, headroom: int | None = None) -> None:
        """`Provisioner.start_background`: reserve `goal` bytes now and keep them."""
        self.provisioner.start_background(goal, headroom)

    def ensure_free(self, nbytes: int) -> None:
        """`Provisioner.ensure_free`: have `nbytes` free ahead of use."""
        self.provisioner.ensure_free(nbytes)

    def limit_idle(self, nbytes: int) -> None:
        """`Provisioner.limit_idle`: hold at most `nbytes` of free pinned memory."""
        self.provisioner.limit_idle(nbytes)

    def trim(self) -> None:
        """`Provisioner.trim`: give every wholly free slab back now."""
        self.provisioner.trim()

    def close(self) -> None:
        """Stop the provisioner's thread, wait for pending copies and return every
        slab to the driver. Blocks still in use must not be touched afterwards."""
        self.provisioner.close()

    def stats(self) -> dict[str, float]:
        """Pool state for the store's metrics: `pinned-*` (capacity, bytes in use,
        slabs, the method, and the provisioner's: reserved bytes, readiness, how
        fast memory was made ready, deferrals, bytes given back) and `pageable-*`
        (fallback blocks; `-warmup-`: waiting for the provisioner)."""
        with self._lock:
            return (
                self._fallbacks.stats()
                | self.provisioner.stats()
                | {
                    "pinned-capacity-bytes": float(self.capacity),
                    "pinned-in-use-bytes": float(self.in_use),
                    "pinned-slabs": float(len(self._slabs)),
                    "pinned-registered": 1.0 if self.method == "register" else 0.0,
                }
            )


def _check(
    capacity: int, slab_size: int, release_after: float | None, method: str, fraction: float
) -> None:
    """Raise ValueError naming the first of `PinnedPool`'s arguments out of range."""
    if capacity < 0 or slab_size < 0:
        raise ValueError(f"capacity={capacity} and slab_size={slab_size} must be >= 0")
    if release_after is not None and release_after < 0:
        raise ValueError(f"release_after={release_after} must be >= 0 seconds or None")
    if method not in METHODS:
        raise ValueError(f"method={method!r}; accepted: {', '.join(METHODS)}")
    if not 0 < fraction <= 1:
        raise ValueError(f"available_fraction={fraction} must be in (0, 1]")


__all__ = ["ALIGNMENT", "AVAILABLE_FRACTION", "SLAB_SIZE", "PinnedPool"]
