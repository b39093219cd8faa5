"""Worker and Nanny subclasses for checking that `worker_class` is honoured.

Covers: `TaggedWorker` and `TaggedNanny`, a distributed.Worker and a
distributed.Nanny that only add a class attribute, importable as
"cudask.testing.workers.TaggedWorker" / ".TaggedNanny". Does not cover:
anything a real custom worker would do. Threading: as their distributed bases.
"""

from __future__ import annotations

from distributed import Nanny, Worker


class TaggedWorker(Worker):
    """distributed.Worker, recognisable by its type name and `tag`."""

    tag = "cudask-tagged-worker"


class TaggedNanny(Nanny):
    """distributed.Nanny, recognisable by its type name and `tag`."""

    tag = "cudask-tagged-nanny"


__all__ = ["TaggedNanny", "TaggedWorker"]
