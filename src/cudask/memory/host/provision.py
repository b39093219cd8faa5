"""Provisioning of the pinned pool: slabs reserved ahead of use, and given back.

Covers: `Provisioner`, which reserves the pool's slabs up to a goal - the start
goal, kept while idle (`start_background`), memory free ahead of use
(`ensure_free`, `ask_ahead`; later slabs widen for larger blocks) - on its thread
("cudask-pinned") once device traffic pauses (`traffic`), or in the caller
(`preallocate`); registers fallback blocks when idle; gives free slabs back (idle
for `release_after`, all after `trim`, past `limit_idle`); stays within
`capacity` and `available_fraction` of the memory available.

Does not cover: carving and releasing blocks (`pool`), or pinning (`pinning`).

Threading: shares the pool's parts and lock (passed in); methods lock unless
marked "lock held"; pinning and giving back run outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cudask.memory.host import traffic
from cudask.memory.host.blocks import DeferredBlocks
from cudask.memory.host.fallback import Fallbacks
from cudask.memory.host.faulting import round_up
from cudask.memory.host.pinning import Pinner
from cudask.memory.host.slabs import Slab, Slabs, wider

logger = logging.getLogger(__name__)

# While released blocks wait for their copies, the thread looks at them this often
# (seconds): their slabs can go back once the copies complete.
POLL_SECONDS = 0.005


@dataclass
class Counters:
    """What the provisioner has done, for the pool's metrics."""

    provisioned_bytes: int = 0  # pinned in slabs ...
    provision_seconds: float = 0.0  # ... in this long
    deferred_seconds: float = 0.0  # waiting for device traffic to pause
    released_bytes: int = 0  # given back to the operating system


class Provisioner:
    """Reserves the pool's slabs ahead of use and gives idle ones back; see the
    module docstring. `slabs`, `wake` (the condition on the pool's lock), `pinner`,
    `fallbacks` and `deferred` (blocks waiting for their copies) are the pool's
    parts; `available()`: bytes of host memory available now."""

    def __init__(
        self,
        slabs: Slabs,
        wake: threading.Condition,
        *,
        pinner: Pinner,
        fallbacks: Fallbacks,
        deferred: DeferredBlocks,
        capacity: int,
        slab_size: int,
        alignment: int,
        release_after: float | None,
        available: Callable[[], int],
        available_fraction: float,
    ) -> None:
        self._slabs = slabs
        self._wake = wake
        self._pinner = pinner
        self._fallbacks = fallbacks
        self._deferred = deferred
        self.capacity = capacity
        self.alignment = alignment
        self.base_slab = max(round_up(slab_size or capacity or 1, alignment), alignment)
        self.slab_size = self.base_slab  # widened for larger blocks (`ask_ahead`)
        self.release_after = release_after
        self.available = available
        self.available_fraction = available_fraction
        self.goal = 0  # bytes reserved up to
        self.keep = 0  # the start goal: never given back while idle
        self.headroom = 0  # bytes kept free ahead of use once started
        self.idle_cap = float("inf")  # the most free pinned bytes held (`limit_idle`)
        self.counters = Counters()
        self._big = 0  # a block larger than a slab, waiting for a slab of its size
        self._reserving = 0  # bytes being pinned outside the lock
        self._releasing = 0  # bytes out of the slabs, being given back
        self._trim = False  # give every wholly free slab back now (`trim`)
        self._pin_failed = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def reserved(self) -> int:
        """Bytes of pinned memory reserved in slabs (and not yet given back)."""
        return self._slabs.size + self._releasing

    # -- goals -----------------------------------------------------------------
    def start_background(self, goal: int, headroom: int | None = None) -> None:
        """Reserve `goal` bytes in the background now and keep them (never given
        back while idle); later keep `headroom` bytes (default: two slabs) free
        ahead of use, up to the capacity. Returns at once; idempotent."""
        with self._wake:
            if self._closed or self.capacity == 0:
                return
            self.headroom = 2 * self.slab_size if headroom is None else max(headroom, 0)
            self.goal = max(self.goal, min(goal, self.capacity))
            self.keep = max(self.keep, min(goal, self.capacity))
            self._wake_thread()

    def ensure_free(self, nbytes: int) -> None:
        """Have `nbytes` of pinned memory free ahead of use (beyond the bytes in
        use), reserved in the background up to the capacity. Cheap when already
        asked: callable on every write."""
        with self._wake:
            if self._closed or self.capacity == 0:
                return
            want = min(self._slabs.in_use + max(nbytes, 0), self.capacity)
            if want - self.goal >= self.alignment:
                self.goal = want
                self._wake_thread()

    def ask_ahead(self, size: int, fragmented: bool = False) -> None:
        """Raise the goal so `size` more bytes plus the headroom are free ahead of
        use (beyond the reserved bytes where their free pieces are too small:
        `fragmented`); a block larger than a slab widens later slabs (lock held)."""
        if size > self.slab_size:
            self._big = max(self._big, size)
        if size > self.base_slab:
            widest = max(self.capacity - self.capacity % self.alignment, self.base_slab)
            self.slab_size = min(wider(size, self.base_slab, self.slab_size), widest)
        ahead = max(self._slabs.in_use + self.headroom, self.reserved if fragmented else 0)
        want = min(ahead + size, self.capacity)
        if want > self.goal or self._big or self.reserved + self._reserving < self.goal:
            # (a goal not met may have waited for memory to become available)
            self.goal = max(self.goal, want)
            self._wake_thread()

    def why_not(self, size: int) -> str:
        """Why no pinned range serves `size` bytes now, one of
        `cudask.memory.host.fallback.REASONS` (lock held)."""
        if self._pin_failed:
            return "refused"
        if self.reserved + self._reserving + size > self.capacity:
            return "full"
        if not self._fits(size):
            return "available"
        return "warmup"

    def slab_idle(self) -> None:
        """A slab has become wholly free: time its release (lock held)."""
        if self.release_after is not None:
            self._wake.notify_all()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the goal is reserved (or pinning failed, the footprint limit
        was reached, or the pool closed); return whether the goal is reserved."""
        with self._wake:
            self._wake.wait_for(self._settled, timeout)
            return self.reserved >= self._target()

    def _settled(self) -> bool:
        """Whether nothing more is reserved for the goal now (lock held)."""
        if self._closed or self._pin_failed or self.reserved >= self._target():
            return True
        missing = max(int(self._target() - self.reserved), self.alignment)
        return not self._fits(min(missing, self.slab_size)) and not self._reserving

    def _target(self) -> float:
        """Bytes reserved up to: the goal, within capacity and idle cap (lock held)."""
        return min(self.goal, self.capacity, self._slabs.in_use + self.idle_cap)

    def _fits(self, size: int) -> bool:
        """Whether `size` more pinned bytes stay within capacity and the available
        memory (lock held)."""
        held = self.reserved + self._reserving + self._fallbacks.registered
        if held + size > self.capacity:
            return False
        return held + size <= self.available_fraction * (self.available() + held)

    def _wake_thread(self) -> None:
        """Start the thread unless it runs, and wake it (lock held)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="cudask-pinned", daemon=True)
            self._thread.start()
        self._wake.notify_all()

    # -- growth ----------------------------------------------------------------
    def preallocate(self, nbytes: int | None = None) -> int:
        """Reserve slabs up to `nbytes` (default: the capacity) in the calling
        thread; return the bytes reserved."""
        goal = self.capacity if nbytes is None else min(nbytes, self.capacity)
        while (remaining := goal - self.reserved - self._reserving) >= self.alignment:
            if not self._grow(min(self.slab_size, remaining - remaining % self.alignment)):
                break
        return self.reserved

    def _grow(self, size: int, premap: bool = False) -> bool:
        """Reserve one slab of at least `size` bytes, pinned outside the lock; with
        `premap` (the thread), fault the next slab in meanwhile if the goal needs one."""
        with self._wake:
            claim = self._claim(size, premap)
        if claim is None:
            return False
        nbytes, premap_next = claim
        started = time.perf_counter()
        try:
            ptr, registered = self._pinner.pin(nbytes, premap_next=premap_next)
        except Exception as exc:  # noqa: BLE001 - the driver or kernel refused: stop trying
            # warned from here, so that the warning names the caller of preallocate
            why = f"pinning {nbytes} bytes of host memory failed: {exc}"
            self._fallbacks.warn_once("refused", why)
            self._stop_pinning(nbytes)
            return False
        return self._add(Slab(ptr, nbytes, registered), time.perf_counter() - started)

    def _claim(self, size: int, premap: bool) -> tuple[int, int] | None:
        """The bytes of the next slab, now counted as being reserved, and of the one
        to fault in meanwhile; None when none can be (lock held)."""
        nbytes = None if self._pin_failed or self._closed else self._slab_bytes(size)
        if nbytes is None:
            return None
        self._reserving += nbytes
        more = premap and self._target() - self.reserved - self._reserving >= self.slab_size
        return nbytes, self.slab_size if more else 0

    def _slab_bytes(self, size: int) -> int | None:
        """The size of a slab of at least `size` bytes: a multiple of the slab size,
        cut to the capacity; just `size` where a whole slab passes the memory
        available; None when not even that fits (lock held)."""
        held = self.reserved + self._reserving
        nbytes = round_up(max(size, self.slab_size), self.slab_size)
        if held + nbytes > self.capacity:
            nbytes = self.capacity - held
            nbytes -= nbytes % self.alignment
            if nbytes < size or nbytes <= 0:
                return None
        if not self._fits(nbytes):
            nbytes = round_up(size, self.alignment)
            if not self._fits(nbytes):
                return None
        return nbytes

    def _stop_pinning(self, nbytes: int) -> None:
        """Pinning `nbytes` failed: pin no more."""
        with self._wake:
            self._reserving -= nbytes
            self._pin_failed = True
            self._wake.notify_all()

    def _add(self, slab: Slab, seconds: float) -> bool:
        """Put a slab pinned in `seconds` into the pool; give it straight back if
        the pool closed meanwhile."""
        with self._wake:
            self._reserving -= slab.size
            self.counters.provisioned_bytes += slab.size
            self.counters.provision_seconds += seconds
            if not self._closed:
                self._slabs.add(slab)
                self._wake.notify_all()
                return True
        self._pinner.free(slab)
        return False

    # -- the thread ------------------------------------------------------------
    def _run(self) -> None:
        """The thread ("cudask-pinned"): steps until closed."""
        try:
            while self._step():
                pass
        except Exception:  # never kill the worker over pinning
            logger.exception("cudask: the pinned-memory thread stopped")

    def _step(self) -> bool:
        """One step of the thread: reserve a slab below the goal, register a fallback
        block, or give back idle slabs; else wait until woken. False once closed."""
        self._deferred.collect()  # blocks whose copies completed since their release
        with self._wake:
            if self._closed:
                return False
            size = self._wanted()
            register = not size and self._fallbacks.waiting
            idle, wait = ([], None) if size or register else self._idle_slabs()
            if not (size or register or idle):
                self._sleep(wait)
                return True
        if idle:
            self._give_back(idle)
            return True
        self._await_quiet()
        if size:
            self._grow(size, premap=True)
        else:
            self._fallbacks.register_one(self._pinner, self._fits)
        return True

    def _wanted(self) -> int:
        """Bytes of the next slab to reserve, 0 for none (lock held): what the goal
        misses, up to a slab, or a block larger than a slab; none beyond the idle
        cap or the memory available, or once pinning failed."""
        missing = int(self._target() - self.reserved - self._reserving)
        room = self.idle_cap - (self.reserved + self._reserving - self._slabs.in_use)
        if self._big > room:
            self._big = 0  # no room for a free slab that large
        grow = missing >= self.alignment and room >= self.slab_size  # else given back
        if not (grow or self._big) or self._pin_failed:
            return 0
        if not self._fits(min(max(missing, self.alignment), self.slab_size)):
            return 0
        size = min(self.slab_size, max(missing - missing % self.alignment, 0))
        size, self._big = max(size, self._big), 0
        return size

    def _sleep(self, wait: float | None) -> None:
        """Wait to be woken, `wait` seconds at most (None: no bound), polling the
        copies of released blocks meanwhile (lock held)."""
        if self._deferred:
            wait = POLL_SECONDS if wait is None else min(wait, POLL_SECONDS)
        self._wake.wait(wait)

    def _await_quiet(self) -> None:
        """Wait, within a bound, for this process's device traffic to pause."""
        with self._wake:
            waited = traffic.await_quiet(self._wake, lambda: self._closed)
            self.counters.deferred_seconds += waited

    # -- giving back -----------------------------------------------------------
    def limit_idle(self, nbytes: int) -> None:
        """Hold at most `nbytes` of free pinned memory (beyond the start goal) from
        now on: free slabs past it go back now, in the calling thread, and no more
        is reserved ahead (the store's host tier counts free pinned memory)."""
        with self._wake:
            before = self._target()
            self.idle_cap = max(nbytes, 0)
            excess = self._slabs.size - self._slabs.in_use - self.idle_cap
            if excess <= 0 or self._closed:
                if self._target() > before:
                    self._wake.notify_all()  # the cap held the thread back: more is wanted
                return
            idle, _ = self._slabs.take_idle(None, self.keep, trim=True, upto=int(excess))
            self._taken_out(idle)
        self._give_back(idle)

    def trim(self) -> None:
        """Give every wholly free slab beyond the start goal back to the operating
        system now, without waiting for `release_after` (host memory is short). Done
        by the thread; returns at once."""
        with self._wake:
            if self._slabs and not self._closed:
                self._trim = True
                self._wake_thread()

    def _idle_slabs(self) -> tuple[list[Slab], float | None]:
        """Take out the slabs idle for `release_after`, newest first, keeping the
        start goal (every free one after `trim`); also return how long until the
        next could go (None: until woken). Lock held."""
        trim, self._trim = self._trim, False
        idle, wait = self._slabs.take_idle(self.release_after, self.keep, trim=trim)
        if idle:
            self._taken_out(idle)
        return idle, wait

    def _taken_out(self, idle: list[Slab]) -> None:
        """Slabs were taken out of the pool to be given back: count them, and cut the
        goal to what stays (lock held)."""
        self.goal = min(self.goal, self._slabs.size)
        self._releasing += sum(slab.size for slab in idle)

    def _give_back(self, slabs: list[Slab]) -> None:
        """Return wholly free slabs, already out of the pool, to the driver."""
        for slab in slabs:
            self._pinner.free(slab)
        nbytes = sum(slab.size for slab in slabs)
        with self._wake:
            self._releasing -= nbytes
            self.counters.released_bytes += nbytes

    def close(self) -> None:
        """Stop the thread, wait for the copies of released blocks, and return every
        slab to the driver. Blocks still in use must not be touched afterwards."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)  # at most one slab being pinned
        self._pinner.close()
        self._deferred.collect(wait=True)
        with self._wake:
            slabs = self._slabs.clear()
        for slab in slabs:
            self._pinner.free(slab)

    # -- metrics ---------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """The pool's `pinned-*` metrics of provisioning: reserved bytes, readiness
        (1.0: the goal reserved), how fast memory was made ready, waits for device
        traffic, bytes given back (lock held)."""
        goal = min(self.goal, self.capacity)
        counts = self.counters
        seconds = counts.provision_seconds
        return {
            "pinned-reserved-bytes": float(self.reserved),
            "pinned-reserving-bytes": float(self._reserving),
            "pinned-goal-bytes": float(goal),
            "pinned-ready": 1.0 if goal <= 0 else min(self.reserved / goal, 1.0),
            "pinned-provision-bytes": float(counts.provisioned_bytes),
            "pinned-provision-seconds": seconds,
            "pinned-provision-gbps": counts.provisioned_bytes / seconds / 1e9 if seconds else 0.0,
            "pinned-deferred-seconds": counts.deferred_seconds,
            "pinned-released-bytes": float(counts.released_bytes),
        }


__all__ = ["POLL_SECONDS", "Counters", "Provisioner"]
