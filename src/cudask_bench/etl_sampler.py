"""GPU memory of one ETL run as NVML reports it, sampled in a thread, in both clocks.

Covers: `MemorySampler(device)`: NVML's used memory of one GPU (an index or a UUID), or
what a given `read` returns, taken every `interval` seconds (SAMPLE_INTERVAL) in a
daemon thread and on each `mark`, each sample stamped halfway through its read in
perf_counter seconds (`peak(start, end)`: the phases' clock) and in epoch seconds
(`by_epoch`: the task stream's, for cudask_bench.working_set); `idle`, the median of a
few reads. Without a GPU or NVML every read is None and `reason` says why. Does not
cover: the phases, subtracting the idle cluster (cudask_bench.etl_phases). Threading:
the sampler's thread only appends samples under its lock; the rest is called from one
thread. Light at import.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

#: Seconds between two NVML samples.
SAMPLE_INTERVAL = 0.02


class PhaseFailed(RuntimeError):
    """A phase of a run raised; the message names the phase and the error."""


class MemorySampler:
    """NVML's used memory of one GPU (or what `read` returns), sampled every `interval`
    seconds in a daemon thread and on `mark`; no GPU (`device` None, or no NVML) reads
    None."""

    def __init__(
        self,
        device: str | None,
        interval: float = SAMPLE_INTERVAL,
        read: Callable[[], int] | None = None,
    ) -> None:
        self.interval = interval
        self.reason: str | None = None
        self._read: Callable[[], int] | None = read
        self._samples: list[tuple[float, float, int]] = []  # (perf_counter, epoch, bytes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if read is not None:
            return
        if device is None:
            self.reason = "no GPU (pandas frames)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(device)
                if device.startswith(("GPU-", "MIG-"))
                else pynvml.nvmlDeviceGetHandleByIndex(int(device))
            )
            self._read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            self._read()
        except Exception as exc:  # noqa: BLE001 - no NVML here: figures without memory
            self._read, self.reason = None, f"NVML: {type(exc).__name__}: {exc}"

    def mark(self) -> int | None:
        """Read now, keep the sample, return it."""
        if self._read is None:
            return None
        before, epoch = time.perf_counter(), time.time()
        value = self._read()
        middle = (time.perf_counter() - before) / 2  # stamped halfway through the read
        with self._lock:
            self._samples.append((before + middle, epoch + middle, value))
        return value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.mark()

    def start(self) -> None:
        if self._read is not None and self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name="cudask-bench-nvml-sampler"
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def idle(self, count: int = 5) -> int | None:
        """The median of `count` reads `interval` apart."""
        values = []
        for _ in range(count):
            values.append(self.mark())
            time.sleep(self.interval)
        known = [v for v in values if v is not None]
        return int(statistics.median(known)) if known else None

    def peak(self, start: float, end: float) -> int | None:
        """The largest sample taken from `start` to `end` (perf_counter seconds)."""
        with self._lock:
            inside = [v for t, _, v in self._samples if start <= t <= end]
        return max(inside) if inside else None

    def by_epoch(self) -> list[tuple[float, int]]:
        """Every sample so far as (epoch seconds, bytes): the clock of the task stream."""
        with self._lock:
            return [(epoch, v) for _, epoch, v in self._samples]


__all__ = ["SAMPLE_INTERVAL", "MemorySampler"]
