"""The largest working set among the tasks of each phase of a run: the part of the
ETL benchmark's peak-memory bound that the tasks themselves bring.

Covers: `WorkingSets`, a scheduler plugin that records, as each task's output reaches
memory, the time, the key and the bytes of that output and of its inputs (the sizes the
worker reported: `sizeof`); `records`, read on the scheduler; `compute_spans`, each
task's compute spans in a task stream; `growth`, how far NVML's used memory rose while a
task computed above a sample taken after the previous task ended and before it began (its
temporaries and output, as samples taken every few tens of milliseconds see them); and
`largest`, the largest per phase window, with or without that growth (`measured`: how
many tasks had one). Without it,
temporaries inside a task are not seen: the least working set the bound allows. With it,
the figure errs low where a task is shorter than the sampling interval or its peak fell
between two samples, and high where something else allocated on the device while the task
ran (NVML counts the whole device: another process, CUDA loading modules, an allocator's
pool growing). Meant for one worker thread: with several, tasks overlap and each is
charged the others' allocations.

Does not cover: the samples themselves (`cudask_bench.etl_sampler.MemorySampler`), the
bound's verdict (`cudask_bench.etl`).

Threading: the plugin runs on the scheduler's event loop; `records` is called there
through `Client.run_on_scheduler`; the rest are pure functions.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

NAME = "cudask-bench-working-sets"

#: (epoch seconds, key as str, output bytes, input bytes) of a task that reached memory.
Record = tuple[float, str, int, int]


class WorkingSets(SchedulerPlugin):
    """A `Record` of every task that reached memory."""

    name = NAME

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish != "memory" or self.scheduler is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            inputs = sum(max(dep.nbytes, 0) for dep in ts.dependencies)
            self.records.append((time.time(), str(key), max(ts.nbytes, 0), inputs))


def records(dask_scheduler: Any) -> list[Record]:
    plugin = dask_scheduler.plugins.get(NAME)
    return list(plugin.records) if plugin is not None else []


def compute_spans(stream: Iterable[Mapping[str, Any]] | None) -> list[tuple[str, float, float]]:
    """(key as str, start, stop) of every "compute" span of a task stream (epoch seconds)."""
    return [
        (str(record.get("key")), float(span["start"]), float(span["stop"]))
        for record in stream or ()
        for span in record.get("startstops", ())
        if span.get("action") == "compute"
    ]


def growth(
    samples: list[tuple[float, int]], spans: Iterable[tuple[str, float, float]]
) -> dict[str, int]:
    """Per key, the most NVML's used memory rose while the task computed: the largest
    sample inside a span (start <= t <= stop) less the last sample before the span, if
    that sample came after the previous span ended (else what the previous task left
    would be charged to this one). Keys with no such pair of samples are absent; a key
    that computed more than once gets its largest rise. `samples`: (epoch seconds, bytes)."""
    ordered = sorted(samples)
    times = [t for t, _ in ordered]
    out: dict[str, int] = {}
    previous_stop = float("-inf")
    for key, start, stop in sorted(spans, key=lambda span: span[1]):
        first = bisect.bisect_left(times, start)
        inside = [v for _, v in ordered[first : bisect.bisect_right(times, stop)]]
        clean = first > 0 and times[first - 1] > previous_stop
        previous_stop = max(previous_stop, stop)
        if not inside or not clean:
            continue
        rise = max(inside) - ordered[first - 1][1]
        out[key] = max(out.get(key, 0), rise)
    return out


def largest(
    found: list[Record],
    windows: Mapping[str, tuple[float, float]],
    grown: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Per phase window (epoch seconds), the largest working set of a task that ended in
    it: its inputs plus its output, or plus what it `grown` where that is larger."""
    out = dict.fromkeys(windows, 0)
    for when, key, output, inputs in found:
        nbytes = inputs + max(output, (grown or {}).get(key, 0))
        for name in _phases_of(when, windows):
            out[name] = max(out[name], nbytes)
    return out


def measured(
    found: list[Record], windows: Mapping[str, tuple[float, float]], grown: Mapping[str, int]
) -> dict[str, int]:
    """Per phase window, how many of the tasks that ended in it have a rise in `grown`."""
    out = dict.fromkeys(windows, 0)
    for when, key, _, _ in found:
        for name in _phases_of(when, windows) if key in grown else ():
            out[name] += 1
    return out


def _phases_of(when: float, windows: Mapping[str, tuple[float, float]]) -> list[str]:
    """The phase windows (epoch seconds) that hold the moment `when`."""
    return [name for name, (a, b) in windows.items() if a <= when <= b]


__all__ = [
    "NAME",
    "Record",
    "WorkingSets",
    "compute_spans",
    "growth",
    "largest",
    "measured",
    "records",
]
