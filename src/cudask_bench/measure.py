"""What a workload measures: timings of one metric, and the runs a process makes.

Covers: `Measurement` (one metric's measured and warm-up times, bytes, status, the
result check, the worker's disk I/O per run) and `summarize` (median/min/max and GB/s
of a measurement entry, with the medians of its disk I/O and rates, also used by the
harness on merged runs); `Step` and `schedule`, the runs one runner process
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
    #: per measured time, the worker's I/O in that run (`traffic_between`), when counted
    traffic: list[dict[str, int]] = dataclasses.field(default_factory=list)

    def record(self, seconds: float, warmup: bool, traffic: dict[str, int] | None = None) -> None:
        (self.warmup_times if warmup else self.times).append(seconds)
        if traffic is not None and not warmup:
            self.traffic.append(dict(traffic))

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
                **({"disk_traffic": self.traffic} if self.traffic else {}),
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
    traffic = entry.get("disk_traffic") or []
    if traffic and len(traffic) == len(times):
        entry["disk"] = summarize_traffic(times, traffic)
    return entry


#: The worker's I/O in one run, from the differences of its /proc/self/io counters:
#: bytes through write and read system calls (its spilled files; page-cache hits
#: included), and bytes the kernel sent to or fetched from the storage device.
TRAFFIC = {
    "written_bytes": "wchar",
    "read_bytes": "rchar",
    "storage_written_bytes": "write_bytes",
    "storage_read_bytes": "read_bytes",
}


def traffic_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """One run's I/O (TRAFFIC's names) from the counters read before and after it;
    {} where they were not read."""
    return {
        name: after[key] - before[key]
        for name, key in TRAFFIC.items()
        if key in before and key in after
    }


def summarize_traffic(times: list[float], traffic: list[dict[str, int]]) -> dict[str, Any]:
    """Medians of one metric's I/O per run, and of its rates over the run's time
    (`write_GBps` from written_bytes, `read_GBps` from read_bytes, 1e9 bytes/s)."""
    out: dict[str, Any] = {}
    for name in TRAFFIC:
        values = [t[name] for t in traffic if name in t]
        out[name] = statistics.median(values) if values else None
    for rate, name in (("write_GBps", "written_bytes"), ("read_GBps", "read_bytes")):
        rates = [
            t[name] / s / 1e9 for t, s in zip(traffic, times, strict=True) if name in t and s > 0
        ]
        out[rate] = statistics.median(rates) if rates else None
    return out


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


__all__ = [
    "TRAFFIC",
    "BenchFailure",
    "Measurement",
    "Step",
    "schedule",
    "summarize",
    "summarize_traffic",
    "traffic_between",
]
