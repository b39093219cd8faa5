"""The store's counters, its `Worker.metrics` snapshot and its move log.

Covers: `MoveCounters` - (label, unit) -> cumulative value of the moves between
device and host (count, bytes, seconds), in the shape of SpillBuffer's
`cumulative_metrics` - and `snapshot`, which turns tier sizes, those counters,
spill-on-demand counts and pinned-pool state into the flat dict of
`TieredStore.metrics()`; and `moves`, the logger on which `log_spilling`
reports each move between tiers.

Does not cover: the host tier's disk counters (distributed's SpillBuffer keeps
them), the pool's own statistics (`cudask.memory.host.pool`).

Threading: not thread-safe; the store updates the counters under its lock.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping

from cudask.memory import handlers
from cudask.memory.backend import Copy
from cudask.memory.ondemand import SpillOnDemand

# log_spilling's lines go where distributed logs its own spilling: a worker process
# shows them at INFO, and Client.get_worker_logs() returns them ("cudask.memory" has
# no handler in a worker, so its INFO lines would be dropped).
moves = logging.getLogger("distributed.worker.memory")

# (label of the counters, prefix of the metrics keys)
_MOVES = (
    ("device-to-host", "spill-device-to-host"),
    ("host-to-device", "unspill-host-to-device"),
    ("disk-write", "spill-host-to-disk"),
    ("disk-read", "unspill-disk-to-host"),
)


def copies_of(copy: handlers.AnyHostCopy) -> list[Copy]:
    """The raw copies that filled a host copy (those of each part of a container)."""
    parts = copy.parts() if isinstance(copy, handlers.ContainerCopy) else [copy]
    return [c for p in parts for c in p.copies if isinstance(c, Copy)]


class MoveCounters:
    """Cumulative counters of the moves between the device and the host.

    The seconds of device-to-host and host-to-device are the copies' time on
    their streams (bytes / seconds is the bus rate); host-to-device-wait is how
    long tasks waited for unspilled data.
    """

    def __init__(self) -> None:
        self.values: defaultdict[tuple[str, str], float] = defaultdict(float)

    def device_read(self) -> None:
        self.values["device-read", "count"] += 1

    def spilled(self, nbytes: int, *, copied: bool = True) -> None:
        """A device -> host copy was started, or (`copied` false) a key went back
        to the host with the host copy it kept (`tiers.clean`)."""
        label = "device-to-host" if copied else "device-to-host-kept"
        self.values[label, "count"] += 1
        self.values[label, "bytes"] += nbytes

    def spill_done(self, copies: list[Copy], seconds: Callable[[Copy], float]) -> None:
        """The device -> host copies of a spilled object completed: their time on
        the stream."""
        self.values["device-to-host", "seconds"] += sum(seconds(c) for c in copies)

    def unspilled(self, copies: list[Copy], waited: float, seconds: Callable[[Copy], float]) -> int:
        """Host -> device copies completed after `waited` seconds; return their bytes."""
        nbytes = sum(c.nbytes for c in copies)
        self.values["host-to-device", "count"] += 1
        self.values["host-to-device", "bytes"] += nbytes
        self.values["host-to-device", "seconds"] += sum(seconds(c) for c in copies)
        self.values["host-to-device-wait", "seconds"] += waited
        return nbytes


def snapshot(
    tiers: dict[str, float],
    cumulative: Mapping[tuple[str, str], float],
    on_demand: SpillOnDemand | None,
    pool: Mapping[str, float] | None,
) -> dict[str, float]:
    """`TieredStore.metrics()`: the tier sizes, then the moves, spill on demand
    and the pinned pool's state (when the pool exists)."""
    out = dict(tiers)
    for label, name in _MOVES:
        for unit in ("count", "bytes", "seconds"):
            out[f"{name}-{unit}"] = float(cumulative.get((label, unit), 0.0))
    out["unspill-host-to-device-wait-seconds"] = float(
        cumulative.get(("host-to-device-wait", "seconds"), 0.0)
    )
    for unit in ("count", "bytes"):  # spills that copied nothing: the key kept its host copy
        out[f"spill-device-to-host-kept-{unit}"] = float(
            cumulative.get(("device-to-host-kept", unit), 0.0)
        )
    if on_demand is not None:
        out["spill-on-demand-count"] = float(on_demand.count)
        out["spill-on-demand-bytes"] = float(on_demand.freed)
        out["spill-at-limit-count"] = float(on_demand.limit_count)
        out["spill-at-limit-bytes"] = float(on_demand.limit_freed)
    if pool is not None:
        out.update(pool)
    return out


__all__ = ["MoveCounters", "copies_of", "moves", "snapshot"]
