"""The pinned pool: page-locked host memory in slabs, made ready by its own thread.

Covers: `PinnedPool`, which carves blocks for device -> host copies out of pinned
slabs (first fit, coalesced on release, later slabs widened for larger blocks; a block
released while its copy is in flight goes back once it completes), never waiting for pinning:
a request that finds no free pinned range gets a fallback block
(`cudask.memory.host.fallback`) and asks the pool's thread for more. The
thread ("cudask-pinned") reserves slabs up to a goal (`start_background`,
`ensure_free`) and registers large fallback blocks when idle, each once this
process's device traffic pauses (`traffic`), and gives slabs idle for
`release_after` (or all free ones after `trim`) back, keeping the start goal.
The footprint stays within `capacity` and `available_fraction` of the host
memory available.
Why these defaults: docs/design/host-memory.md.

Does not cover: how memory is pinned (`cudask.memory.host.pinning`), the slab free
lists (`cudask.memory.host.slabs`), copying (`cudask.memory.host.transfer`), or how
much the store needs.

Threading: every public method is thread-safe (one lock and a condition on
it; faulting in and registering run outside it). A block must not be released
while a copy into or out of it is in flight: `HostBlock.release(after=copy)`
defers the release until the copy has completed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cudask.memory.backend import Copy, CopyBackend
from cudask.memory.host import fallback, traffic
from cudask.memory.host.blocks import DeferredBlocks, HostBlock
from cudask.memory.host.fallback import Fallbacks
from cudask.memory.host.faulting import round_up
from cudask.memory.host.pinning import METHODS, Pinner
from cudask.memory.host.slabs import Slab, Slabs, wider

logger = logging.getLogger(__name__)

ALIGNMENT = 256


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


class PinnedPool:
    """Pinned host memory up to `capacity` bytes, reserved `slab_size` at a time
    by a background thread; see the module docstring.

    `method`: "auto" (register where possible), "register" or "host-alloc".
    `available`: bytes of host memory available now (default: psutil's
    MemAvailable); `available_fraction`: the most of it (plus what the pool
    holds) the pool pins. `populate_threads`: threads faulting memory in
    (None: `faulting.default_threads()`).
    """

    def __init__(
        self,
        backend: CopyBackend | None,
        capacity: int,
        slab_size: int,
        *,
        alignment: int = ALIGNMENT,
        release_after: float | None = None,
        method: str = "auto",
        available: Callable[[], int] | None = None,
        available_fraction: float = 0.5,
        populate_threads: int | None = None,
    ) -> None:
        if capacity < 0 or slab_size < 0:
            raise ValueError(f"capacity={capacity} and slab_size={slab_size} must be >= 0")
        if release_after is not None and release_after < 0:
            raise ValueError(f"release_after={release_after} must be >= 0 seconds or None")
        if method not in METHODS:
            raise ValueError(f"method={method!r}; accepted: {', '.join(METHODS)}")
        if not 0 < available_fraction <= 1:
            raise ValueError(f"available_fraction={available_fraction} must be in (0, 1]")
        self.backend = backend
        self.capacity = capacity if backend is not None else 0
        self.slab_size = max(round_up(slab_size or capacity or 1, alignment), alignment)
        self.base_slab = self.slab_size  # slab_size grows with the blocks asked (`wider`)
        self.alignment = alignment
        self.available = available or _available_memory
        self.available_fraction = available_fraction
        self.populate_threads = populate_threads
        self.deferred_seconds = 0.0  # the pool's thread waited for device traffic this long
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._fallbacks = Fallbacks(self._wake, populate_threads)
        self._pinner = Pinner(backend, method, populate_threads=populate_threads,
                              warn_once=self._fallbacks.warn_once)
        self._slabs = Slabs()
        self._reserving = 0  # bytes being reserved by threads outside the lock
        self._deferred = DeferredBlocks()  # released while their copies are in flight
        self._pin_failed = self._closed = False
        self._thread: threading.Thread | None = None  # growth, fallback blocks, idle slabs back
        self.goal = 0  # bytes the thread reserves up to
        self.keep = self.headroom = 0  # keep: the start goal, never given back
        self.idle_cap = float("inf")  # most free pinned bytes held (`limit_idle`)
        self._big = 0  # a request larger than a slab, for the thread
        self.release_after = release_after
        self._trim = False  # give every wholly free slab back now (trim())
        self.released_bytes = 0
        self._releasing = 0  # bytes out of the pool, being returned to the driver
        self.provisioned_bytes, self.provision_seconds = 0, 0.0  # bytes made ready, and in

    # -- introspection -------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes of pinned memory reserved in slabs (and not yet given back)."""
        return self._slabs.size + self._releasing

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

    # -- allocation ----------------------------------------------------------------
    def allocate(self, nbytes: int) -> HostBlock:
        """A block of at least `nbytes`: pinned when a free pinned range is ready,
        else a fallback block (never waits for pinning)."""
        if nbytes == 0 or self.capacity == 0:
            return HostBlock.pageable(nbytes)
        size = round_up(nbytes, self.alignment)
        self._collect()
        with self._lock:
            block = self._take(nbytes, size)
            if block is not None:
                self._ask_ahead(0)
                return block
        # copies in flight may hold blocks (for milliseconds): wait, retry, then fall back
        if self._collect(wait=True):
            with self._lock:
                block = self._take(nbytes, size)
                if block is not None:
                    return block
        with self._lock:
            reason = self._why_not(size)
            fragmented = self._slabs.size - self._slabs.in_use >= size
            if reason == "warmup":
                self._ask_ahead(size, fragmented)
            why = fallback.message(reason, capacity=self.capacity, reserved=self.reserved,
                                   goal=self.goal)
        return self._fallbacks.block(nbytes, reason, why, register_later=self.method == "register",
                                     fragmented=fragmented)

    def preallocate(self, nbytes: int | None = None) -> int:
        """Reserve slabs up to `nbytes` (default: the capacity) here; return the bytes reserved."""
        goal = self.capacity if nbytes is None else min(nbytes, self.capacity)
        while (remaining := goal - self.reserved - self._reserving) >= self.alignment:
            if not self._grow(min(self.slab_size, remaining - remaining % self.alignment)):
                break
        return self.reserved

    def start_background(self, goal: int, headroom: int | None = None) -> None:
        """Reserve `goal` bytes in the background now and keep them (never given
        back while idle); later keep `headroom` bytes (default: two slabs) free
        ahead of use, up to the capacity. Returns at once; idempotent."""
        with self._lock:
            if self._closed or self.backend is None or self.capacity == 0:
                return
            self.headroom = 2 * self.slab_size if headroom is None else max(headroom, 0)
            self.goal = max(self.goal, min(goal, self.capacity))
            self.keep = max(self.keep, min(goal, self.capacity))
            self._start_thread()
            self._wake.notify_all()

    def ensure_free(self, nbytes: int) -> None:
        """Have `nbytes` of pinned memory free ahead of use (beyond the bytes in
        use), reserved in the background up to the capacity. Cheap when already
        asked: callable on every write."""
        with self._lock:
            if self._closed or self.backend is None or self.capacity == 0:
                return
            want = min(self.in_use + max(nbytes, 0), self.capacity)
            if want - self.goal >= self.alignment:
                self.goal = want
                self._start_thread()
                self._wake.notify_all()

    def _start_thread(self) -> None:
        """Start the pool's thread unless it runs (lock held)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=_pool_loop, args=(self,), name="cudask-pinned", daemon=True
            )
            self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the goal is reserved (or pinning failed, the footprint limit
        was reached, or the pool closed); return whether the goal is reserved."""
        with self._lock:
            def done() -> bool:  # the footprint limit: not even what is missing fits
                missing = max(int(self._target() - self.reserved), self.alignment)
                return (self._closed or self._pin_failed or self.reserved >= self._target()
                        or (not self._fits(min(missing, self.slab_size)) and not self._reserving))

            self._wake.wait_for(done, timeout)
            return self.reserved >= self._target()

    def _target(self) -> float:
        """Bytes the thread reserves up to: the goal, within capacity and idle cap (lock held)."""
        return min(self.goal, self.capacity, self._slabs.in_use + self.idle_cap)

    def _fits(self, size: int) -> bool:
        """Whether `size` more pinned bytes stay within capacity and available memory (lock held)."""
        held = self.reserved + self._reserving + self._fallbacks.registered
        if held + size > self.capacity:
            return False
        return held + size <= self.available_fraction * (self.available() + held)

    def _why_not(self, size: int) -> str:
        """Why no pinned range serves `size` bytes now (lock held)."""
        if self._pin_failed:
            return "refused"
        if self.reserved + self._reserving + size > self.capacity:
            return "full"
        if not self._fits(size):
            return "available"
        return "warmup"

    def _ask_ahead(self, size: int, fragmented: bool = False) -> None:
        """Raise the goal so `size` more bytes plus the headroom are free ahead of use (beyond
        the reserved bytes where their free pieces are too small: `fragmented`); a block
        larger than a slab widens later slabs (lock held)."""
        if size > self.slab_size:
            self._big = max(self._big, size)
        if size > self.base_slab:
            self.slab_size = min(wider(size, self.base_slab, self.slab_size),
                                 max(self.capacity - self.capacity % self.alignment, self.base_slab))
        ahead = max(self.in_use + self.headroom, self.reserved if fragmented else 0)
        want = min(ahead + size, self.capacity)
        if want > self.goal or self._big or self.reserved + self._reserving < self.goal:
            # (a goal not met may have waited for memory to become available)
            self.goal = max(self.goal, want)
            self._start_thread()
            self._wake.notify_all()

    def _take(self, nbytes: int, size: int) -> HostBlock | None:
        taken = self._slabs.take(size)
        if taken is None:
            return None
        slab, offset = taken
        return HostBlock(
            slab.ptr + offset, nbytes, pinned=True, pool=self, slab=slab,
            offset=offset, size=size,
        )

    # -- growth --------------------------------------------------------------------
    def _grow(self, size: int, premap: bool = False) -> bool:
        """Reserve one slab of at least `size` bytes (outside the lock); with
        `premap` (the pool's thread), fault the next slab in meanwhile when the
        goal needs one."""
        slab_bytes = round_up(max(size, self.slab_size), self.slab_size)
        with self._lock:
            if self._pin_failed or self.backend is None or self._closed:
                return False
            if self.reserved + self._reserving + slab_bytes > self.capacity:
                slab_bytes = self.capacity - self.reserved - self._reserving
                slab_bytes -= slab_bytes % self.alignment
                if slab_bytes < size or slab_bytes <= 0:
                    return False
            if not self._fits(slab_bytes):  # a whole slab is too much: what was asked, if that fits
                slab_bytes = round_up(size, self.alignment)
                if not self._fits(slab_bytes):
                    return False
            self._reserving += slab_bytes
            more = premap and (
                self._target() - self.reserved - self._reserving >= self.slab_size
            )
            after = self.slab_size if more else 0
        started = time.perf_counter()
        try:
            ptr, registered = self._pinner.pin(slab_bytes, premap_next=after)
        except Exception as exc:  # noqa: BLE001 - the driver or kernel refused: stop trying
            self._fallbacks.warn_once(
                "refused", f"pinning {slab_bytes} bytes of host memory failed: {exc}"
            )
            with self._lock:
                self._reserving -= slab_bytes
                self._pin_failed = True
                self._wake.notify_all()
            return False
        seconds = time.perf_counter() - started
        with self._lock:
            self._reserving -= slab_bytes
            self.provisioned_bytes += slab_bytes
            self.provision_seconds += seconds
            if self._closed:  # closed while pinning: give it straight back
                self._pinner.free(Slab(ptr, slab_bytes, registered))
                return False
            self._slabs.add(Slab(ptr, slab_bytes, registered))
            self._wake.notify_all()
        return True

    # -- the pool's thread ---------------------------------------------------------
    def _step(self) -> bool:
        """One step of the pool's thread: reserve a slab if below the goal, register a fallback
        block, or give back the slabs idle for `release_after`; False when closed. Waits idle."""
        idle: list[Slab] = []
        size = 0
        self._collect()  # blocks whose copies completed since they were released
        with self._lock:
            while True:
                if self._closed:
                    return False
                missing = int(self._target() - self.reserved - self._reserving)
                room = self.idle_cap - (self.reserved + self._reserving - self.in_use)
                if self._big > room:
                    self._big = 0  # no room for a free slab that large
                grow = missing >= self.alignment and room >= self.slab_size  # else given back
                if ((grow or self._big) and not self._pin_failed
                        and self._fits(min(max(missing, self.alignment), self.slab_size))):
                    size = min(self.slab_size, max(missing - missing % self.alignment, 0))
                    if self._big:
                        size, self._big = max(size, self._big), 0
                    break
                if self._fallbacks.waiting:
                    break
                idle, wait = self._idle_slabs()
                if idle:
                    break
                if self._deferred:  # look again at their copies soon
                    self._wake.wait(0.005 if wait is None else min(wait, 0.005))
                    return True
                self._wake.wait(wait)
        if idle:
            self._give_back(idle)
            return True
        with self._lock:  # not while this process moves device memory (traffic)
            self.deferred_seconds += traffic.await_quiet(self._wake, lambda: self._closed)
        if size:
            self._grow(size, premap=True)
        else:
            self._fallbacks.register_one(self._pinner, self._fits)
        return True

    def _idle_slabs(self) -> tuple[list[Slab], float | None]:
        """Take out of the pool the slabs idle for `release_after`, newest first,
        keeping the start goal (all the free ones after `trim()`); also return how
        long until the next could go (None: until woken). Lock held."""
        trim, self._trim = self._trim, False
        idle, wait = self._slabs.take_idle(self.release_after, self.keep, trim=trim)
        if idle:
            self.goal = min(self.goal, self._slabs.size)
            self._releasing += sum(slab.size for slab in idle)
        return idle, wait

    def limit_idle(self, nbytes: int) -> None:
        """Hold at most `nbytes` of free pinned memory (beyond the start goal) from
        now on: free slabs past it go back now, in the calling thread, and no more
        is reserved ahead (the store's host tier counts free pinned memory)."""
        with self._lock:
            before = self._target()
            self.idle_cap = max(nbytes, 0)
            excess = self._slabs.size - self._slabs.in_use - self.idle_cap
            if excess <= 0 or self._closed:
                if self._target() > before:
                    self._wake.notify_all()  # the cap held the thread back: more is wanted now
                return
            idle, _ = self._slabs.take_idle(None, self.keep, trim=True, upto=excess)
            self.goal = min(self.goal, self._slabs.size)
            self._releasing += sum(slab.size for slab in idle)
        self._give_back(idle)

    def trim(self) -> None:
        """Give every wholly free slab beyond the start goal back to the operating
        system now, without waiting for `release_after` (host memory is short:
        the worker's memory manager is moving data to disk). Done by the pool's
        thread; returns at once."""
        with self._lock:
            if self._slabs and not self._closed:
                self._trim = True
                self._start_thread()
                self._wake.notify_all()

    def _give_back(self, slabs: list[Slab]) -> None:
        """Return wholly free slabs, already out of the pool, to the driver."""
        for slab in slabs:
            self._pinner.free(slab)
        nbytes = sum(slab.size for slab in slabs)
        with self._lock:
            self._releasing -= nbytes
            self.released_bytes += nbytes

    # -- release -------------------------------------------------------------------
    def release_block(self, block: HostBlock, after: Copy | None) -> None:
        """Take `block` back, once `after` has completed (`HostBlock.release`)."""
        if after is not None and not after.ready():
            self._deferred.add(block, after)
            with self._lock:
                self._wake.notify_all()  # the pool's thread looks at the copy again soon
        else:
            self._give(block)

    def _give(self, block: HostBlock) -> None:
        with self._lock:
            if block.released:
                return
            block.released = True
            assert block._slab is not None
            self._slabs.give(block._slab, block._offset, block._size)
            if block._slab.idle_since is not None and self.release_after is not None:
                self._wake.notify_all()  # the pool's thread times its release

    def _collect(self, wait: bool = False) -> bool:
        """Return to the slabs the blocks whose copies completed (all of them when
        `wait`); return whether any were."""
        done = self._deferred.done(wait)
        for block in done:
            self._give(block)
        return bool(done)

    def close(self) -> None:
        """Stop the thread, wait for pending copies and return every slab to the
        driver. Blocks still in use must not be touched afterwards."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)  # at most one slab being pinned
        self._pinner.close()
        self._collect(wait=True)
        with self._lock:
            slabs = self._slabs.clear()
        for slab in slabs:
            self._pinner.free(slab)

    def stats(self) -> dict[str, float]:
        """Pool state for the store's metrics: capacity, reserved and in-use bytes, readiness
        (1.0: the goal reserved), how fast memory was made ready (`pinned-provision-*`;
        fallback blocks registered later: `pageable-registered-*`), pageable fallbacks
        (`-warmup-`: waiting for the thread), deferrals, bytes given back."""
        with self._lock:
            goal = min(self.goal, self.capacity)
            ready = 1.0 if goal <= 0 else min(self.reserved / goal, 1.0)
            rate = self.provisioned_bytes / self.provision_seconds if self.provision_seconds else 0.0
            return self._fallbacks.stats() | {
                "pinned-capacity-bytes": float(self.capacity),
                "pinned-reserved-bytes": float(self.reserved),
                "pinned-reserving-bytes": float(self._reserving),
                "pinned-goal-bytes": float(goal),
                "pinned-ready": ready,
                "pinned-in-use-bytes": float(self.in_use),
                "pinned-slabs": float(len(self._slabs)),
                "pinned-provision-bytes": float(self.provisioned_bytes),
                "pinned-provision-seconds": self.provision_seconds,
                "pinned-provision-gbps": rate / 1e9,
                "pinned-deferred-seconds": self.deferred_seconds,
                "pinned-registered": 1.0 if self.method == "register" else 0.0,
                "pinned-released-bytes": float(self.released_bytes),
            }


def _pool_loop(pool: PinnedPool) -> None:
    """The pool's thread: reserve slabs as `goal` asks, register fallback
    blocks, give idle slabs back, until closed."""
    try:
        while pool._step():
            pass
    except Exception:  # never kill the worker over pinning
        logger.exception("cudask: the pinned-memory thread stopped")


__all__ = ["ALIGNMENT", "PinnedPool"]
