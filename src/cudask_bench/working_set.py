"""The largest working set among the tasks of each phase of a run: the part of the
ETL benchmark's peak-memory bound that the tasks themselves bring.

Covers: `WorkingSets`, a scheduler plugin that records, as each task's output reaches
memory, the time and the bytes of that output plus its inputs (the sizes the worker
reported: `sizeof`); `records`, read on the scheduler; and `largest`, the largest per
phase window. Temporaries inside a task are not seen, so this is the least working
set the bound allows (limit + largest, within `cudask_bench.limit.SLACK`).

Does not cover: the peak itself (`cudask_bench.etl_run.MemorySampler`), the bound's
verdict (`cudask_bench.etl`).

Threading: the plugin runs on the scheduler's event loop; `records` is called there
through `Client.run_on_scheduler`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

NAME = "cudask-bench-working-sets"


class WorkingSets(SchedulerPlugin):
    """(epoch seconds, output + input bytes) of every task that reached memory."""

    name = NAME

    def __init__(self) -> None:
        self.records: list[tuple[float, int]] = []
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish != "memory" or self.scheduler is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is not None:
            inputs = sum(max(dep.nbytes, 0) for dep in ts.dependencies)
            self.records.append((time.time(), max(ts.nbytes, 0) + inputs))


def records(dask_scheduler: Any) -> list[tuple[float, int]]:
    plugin = dask_scheduler.plugins.get(NAME)
    return list(plugin.records) if plugin is not None else []


def largest(found: list[tuple[float, int]], windows: Mapping[str, tuple[float, float]]) -> dict[str, int]:
    """Per phase window (epoch seconds), the largest working set of a task that ended in it."""
    out = dict.fromkeys(windows, 0)
    for when, nbytes in found:
        for name, (a, b) in windows.items():
            if a <= when <= b:
                out[name] = max(out[name], nbytes)
    return out


__all__ = ["NAME", "WorkingSets", "largest", "records"]
