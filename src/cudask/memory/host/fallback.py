"""What a copy gets when the pinned pool cannot serve it, and how the user hears of it.

Covers: `PinnedMemoryWarning`; the causes a pool names when no pinned range
serves a copy ("full", "available", "refused", "warmup"), each with advice
naming the setting to change; and `Fallbacks`, the pool's part that hands out
host memory for such a copy (plain pageable memory below
`MAPPED_FALLBACK_FROM`, memory faulted in by threads from there on), counts
it, warns once per cause (pinning failures included), and registers large
fallback blocks with the driver when the pool's thread asks it to
(`register_one`), so copies back from them run at pinned speed.

Does not cover: when the pool falls back (`cudask.memory.host.pool`) or how
memory is registered (`cudask.memory.host.pinning`).

Threading: `Fallbacks` shares the pool's condition: its methods take the
lock, except those marked "lock held"; registering runs outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable

from cudask.memory.host.blocks import FaultedMapping, HostBlock
from cudask.memory.host.pinning import Pinner

logger = logging.getLogger(__name__)

# fallback blocks from this size on are faulted-in mappings (registered later)
MAPPED_FALLBACK_FROM = 1 << 20

REASONS: dict[str, str] = {
    "full": "the pinned pool is full (memory.pinned-pool-size={capacity} bytes)",
    "available": "pinning more would pass half of the host memory available",
    "refused": "the driver refused to pin more host memory",
    "warmup": "pinned memory is still being made ready ({reserved} of {goal} bytes)",
}
ADVICE: dict[str, str] = {
    "full": "Raise cudask.memory.pinned-pool-size (e.g. "
    'dask.config.set({"cudask.memory.pinned-pool-size": "32GiB"})) to keep them pinned.',
    "available": "Free host memory: the pool pins at most half of what is available.",
    "refused": "Lower cudask.memory.pinned-pool-size or free locked memory (ulimit -l).",
    "warmup": "Copies go to pinned memory as it becomes ready; set "
    "cudask.memory.pinned-preallocate to pin some when the worker starts.",
}


class PinnedMemoryWarning(RuntimeWarning):
    """The pinned pool could not serve a copy; pageable memory is used instead."""


def message(reason: str, *, capacity: int, reserved: int, goal: int) -> str:
    """Why no pinned range served a copy, for one of the `REASONS`."""
    return REASONS[reason].format(capacity=capacity, reserved=reserved, goal=goal)


def warn(text: str) -> None:
    """Log `text` and warn with it, attributed to the pool's caller's caller."""
    logger.warning(text)
    warnings.warn(text, PinnedMemoryWarning, stacklevel=4)


class Fallbacks:
    """Fallback blocks of one pool: counted, warned about, registered later."""

    def __init__(self, wake: threading.Condition, populate_threads: int | None) -> None:
        self._wake = wake  # the pool's condition; its lock guards the counters
        self.populate_threads = populate_threads
        self.blocks = 0
        self.bytes = 0
        self.warmup_bytes = 0  # those waiting for the pool's thread
        self.fragmented_bytes = 0  # those the pool's free bytes held, no one range of them
        self._warned: set[str] = set()
        # fallback blocks waiting to be registered (weak: they may die first)
        self._to_register: deque[weakref.ref[FaultedMapping]] = deque()
        self.registered = 0  # bytes of fallback blocks registered, still alive
        self.upgraded_bytes = 0
        self.upgrade_seconds = 0.0

    @property
    def waiting(self) -> bool:
        """Whether blocks wait to be registered (lock held)."""
        return bool(self._to_register)

    def block(
        self, nbytes: int, reason: str, why: str, *, register_later: bool, fragmented: bool = False
    ) -> HostBlock:
        """Host memory for one copy that no pinned range serves (for `reason`,
        explained by `why`; `fragmented`: the pool's free pinned bytes would have
        held it, but no single range of them): counted, warned about once per
        cause, and (when large and `register_later`) registered later by the
        pool's thread."""
        with self._wake:
            self.blocks += 1
            self.bytes += nbytes
            if reason == "warmup":
                self.warmup_bytes += nbytes
            if fragmented:
                self.fragmented_bytes += nbytes
            first = reason not in self._warned
            self._warned.add(reason)
        if first and reason != "warmup":
            warn(
                f"cudask: {why}; device -> host copies use pageable memory meanwhile, "
                f"which is several times slower. {ADVICE[reason]} This warning is shown once."
            )
        elif first:
            logger.info("cudask: %s; this copy goes to memory faulted in for it", why)
        if nbytes < MAPPED_FALLBACK_FROM:
            return HostBlock.pageable(nbytes)
        block = HostBlock.mapped(nbytes, threads=self.populate_threads)
        mapping = block.mapping
        if mapping is not None and register_later and reason != "refused":
            with self._wake:
                self._to_register.append(weakref.ref(mapping))
                self._wake.notify_all()
        return block

    def register_one(self, pinner: Pinner, fits: Callable[[int], bool]) -> bool:
        """Register one waiting fallback block's mapping if `fits` (lock held when
        called) its size; return whether there was one to try."""
        with self._wake:
            mapping = None
            while self._to_register and mapping is None:
                mapping = self._to_register.popleft()()
            if mapping is None:
                return False
            if not fits(mapping.size):
                self._to_register.clear()
                return True
            self.registered += mapping.size
        started = time.perf_counter()
        try:
            pinner.register(mapping)
        except Exception as exc:  # noqa: BLE001 - stays pageable, correct but slower
            with self._wake:
                self.registered -= mapping.size
                self._to_register.clear()
            logger.info("cudask: registering a fallback block failed: %s", exc)
            return True
        with self._wake:
            self.upgraded_bytes += mapping.size
            self.upgrade_seconds += time.perf_counter() - started
            weakref.finalize(mapping, self._forget, mapping.size)
        return True

    def stats(self) -> dict[str, float]:
        """The pool's `pageable-*` metrics (call with the pool's lock held)."""
        return {
            "pageable-fallback-count": float(self.blocks),
            "pageable-fallback-bytes": float(self.bytes),
            "pageable-fallback-warmup-bytes": float(self.warmup_bytes),
            "pageable-fallback-fragmented-bytes": float(self.fragmented_bytes),
            "pageable-registered-bytes": float(self.upgraded_bytes),
            "pageable-registered-seconds": self.upgrade_seconds,
        }

    def _forget(self, nbytes: int) -> None:
        with self._wake:
            self.registered -= nbytes

    def warn_once(self, reason: str, message: str) -> None:
        """Warn with `message` unless `reason` was warned about already or the
        interpreter is exiting (its main thread has ended: a failure then comes from
        the shutdown, such as executors refusing new work, not from the driver)."""
        if not threading.main_thread().is_alive():
            return
        with self._wake:
            if reason in self._warned:
                return
            self._warned.add(reason)
        warn(f"cudask: {message}")


__all__ = [
    "ADVICE",
    "MAPPED_FALLBACK_FROM",
    "REASONS",
    "Fallbacks",
    "PinnedMemoryWarning",
    "message",
    "warn",
]
