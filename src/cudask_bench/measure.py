"""What a workload measures: timings of one metric, and the runs a process makes.

Covers: `Measurement` (one metric's measured and warm-up times, bytes, status, the
result check) and `summarize` (median/min/max and GB/s of a measurement entry, also
used by the harness on merged runs); `Step` and `schedule`, the runs one runner process
makes of a spill or cupy workload in a mode (warm: warm-ups then repetitions, all
`_warm`; cold: the first run of a fresh cluster, then warm runs in it); `BenchFailure`.
Does not cover: running the work (cudask_bench.workloads). Pure Python: no dask, no
array library. Threading: values owned by the runner's main thread.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from cudask_bench.spec import MODES, WARM_SUFFIX


class BenchFailure(RuntimeError):
    """A workload produced a wrong result or could not run; the message says which."""


@dataclasses.dataclass
class Measurement:
    """The timings of one metric of one variant, in seconds."""

    times: list[float] = dataclasses.field(default_factory=list)
    warmup_times: list[float] = dataclasses.field(default_factory=list)
    nbytes: int | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "ok"
    error: str | None = None
    check: str | None = None

    def record(self, seconds: float, warmup: bool) -> None:
        (self.warmup_times if warmup else self.times).append(seconds)

    def fail(self, error: str) -> None:
        self.status = "failed"
        self.error = error

    def to_json(self) -> dict[str, Any]:
        return summarize(
            {
                "unit": "s",
                "times": self.times,
                "warmup_times": self.warmup_times,
                "bytes": self.nbytes,
                "parameters": self.parameters,
                "status": self.status,
                "error": self.error,
                "check": self.check,
            }
        )


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """Add median/min/max (and GB/s where bytes are known) to a measurement entry."""
    times = [float(t) for t in entry.get("times") or []]
    entry["median"] = statistics.median(times) if times else None
    entry["min"] = min(times) if times else None
    entry["max"] = max(times) if times else None
    nbytes = entry.get("bytes")
    median = entry["median"]
    entry["gbps"] = nbytes / median / 1e9 if nbytes and median else None
    return entry


@dataclasses.dataclass(frozen=True)
class Step:
    """One run of a workload in a runner process.

    `suffix` is added to the workload's metric names ("" for a cold run, `_warm`
    for a steady-state one); `warmup` keeps the time out of every median;
    `label` is the progress text.
    """

    suffix: str
    warmup: bool
    label: str


def schedule(mode: str, *, warmup: int, repeat: int, warm_runs: int) -> list[Step]:
    """The runs one runner process makes of a spill or cupy workload.

    warm: `warmup` unmeasured then `repeat` measured repetitions, all `_warm`.
    cold: the first run of a fresh cluster, then `warm_runs` runs (`_warm`) in the
    same cluster; `repeat` is not used (the harness starts a process per
    repetition) and the whole process is a warm-up when `warmup` > 0, as for
    startup.
    """
    if mode == "warm":
        return [Step(WARM_SUFFIX, True, f"warm-up {i + 1}/{warmup}") for i in range(warmup)] + [
            Step(WARM_SUFFIX, False, f"run {i + 1}/{repeat}") for i in range(repeat)
        ]
    if mode == "cold":
        unmeasured = warmup > 0
        prefix = "warm-up process, " if unmeasured else ""
        return [Step("", unmeasured, f"{prefix}cold")] + [
            Step(WARM_SUFFIX, unmeasured, f"{prefix}warm {i + 1}/{warm_runs}")
            for i in range(warm_runs)
        ]
    raise BenchFailure(f"mode {mode!r} is not known; accepted: {', '.join(MODES)}")


__all__ = ["BenchFailure", "Measurement", "Step", "schedule", "summarize"]
