"""GPU memory as NVML reports it, sampled in a thread: the peak of each phase of a run.

Covers: `nvml_used(device)`, a reader of the memory NVML counts as used on one GPU
(an index or UUID, NVML's numbering), and `MemorySampler`, which calls a reader
every `interval` seconds in a thread of its own and keeps the largest value seen
during each named phase (`with sampler.phase("sum"): ...`), a sample taken at
each phase's start and end as well.

Does not cover: what runs on the GPU, or subtracting anyone's context (callers
take an idle reading first). Imports pynvml only in `nvml_used`, never cudask:
a dask-cuda run may use it from another environment.

Threading: the sampler's thread only reads and updates the current peak under a
lock; `phase`, `start` and `stop` are called from one thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Self


def nvml_used(device: str) -> Callable[[], int]:
    """A reader of the bytes NVML reports used on `device` (index or UUID)."""
    import pynvml

    pynvml.nvmlInit()
    handle: Any = (
        pynvml.nvmlDeviceGetHandleByUUID(device)
        if not device.isdigit()
        else pynvml.nvmlDeviceGetHandleByIndex(int(device))
    )

    def read() -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)

    return read


class MemorySampler:
    """`read()` every `interval` seconds in a thread; the peak of each phase."""

    def __init__(self, read: Callable[[], int], interval: float = 0.02) -> None:
        if interval <= 0:
            raise ValueError(f"interval={interval!r}; accepted: seconds > 0, e.g. 0.02")
        self.read = read
        self.interval = interval
        self.peaks: dict[str, int] = {}
        self.samples = 0
        self._lock = threading.Lock()
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        value = self.read()
        with self._lock:
            self.samples += 1
            self._peak = max(self._peak, value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="gpu-memory-sampler", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Keep the largest reading during the block as `peaks[name]`."""
        with self._lock:
            self._peak = 0
        self._sample()
        try:
            yield
        finally:
            self._sample()
            with self._lock:
                self.peaks[name] = self._peak

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["MemorySampler", "nvml_used"]
