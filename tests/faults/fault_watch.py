"""What the scheduler saw during a fault case, so that the case's row says what
happened rather than what was expected to.

Covers: `Watch`, a scheduler plugin counting, from when it is added, the workers
that left and joined and how often each key was computed (processing -> memory,
so a key computed again after its worker died counts once more); `watch(client)`
adds it and returns a function reading those counts as a `Seen`.
Does not cover: why a worker left (its logs), keys computed before it was added, or
a scheduler in another process (it must import this module: LocalCluster's is in
the test process).
Threading: the plugin runs on the scheduler's event loop; the reader asks for a
copy of its counts through `Client.run_on_scheduler`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

NAME = "cudask-fault-watch"


class Watch(SchedulerPlugin):
    name = NAME

    def __init__(self) -> None:
        self.left = 0
        self.joined = 0
        self.computed: dict[str, int] = {}

    def add_worker(self, scheduler: Any, worker: str) -> None:
        self.joined += 1

    def remove_worker(
        self, scheduler: Any, worker: str, *, stimulus_id: str, **kwargs: Any
    ) -> None:
        self.left += 1

    def transition(
        self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str, **kwargs: Any
    ) -> None:
        if start == "processing" and finish == "memory":
            self.computed[str(key)] = self.computed.get(str(key), 0) + 1


@dataclass
class Seen:
    """Workers that left and joined, and {key: times computed}, since the watch began."""

    left: int = 0
    joined: int = 0
    computed: dict[str, int] = field(default_factory=dict)

    def recomputed(self, futures: Iterable[Any]) -> int:
        """How many of `futures` (all computed before the watch began) were computed again."""
        return sum(1 for f in futures if self.computed.get(str(f.key), 0) > 0)


def _read(dask_scheduler: Any) -> dict[str, Any]:
    plugin = dask_scheduler.plugins[NAME]
    return {"left": plugin.left, "joined": plugin.joined, "computed": dict(plugin.computed)}


def watch(client: Any) -> Callable[[], Seen]:
    """Start watching the scheduler of `client`; return a reader of what it saw so far."""
    client.register_plugin(Watch(), name=NAME)
    return lambda: Seen(**client.run_on_scheduler(_read))


__all__ = ["NAME", "Seen", "Watch", "watch"]
