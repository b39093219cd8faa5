"""A Worker subclass for checking that `worker_class` reaches the nanny.

Covers: `TaggedWorker`, a distributed.Worker that only adds a class
attribute, importable by worker processes as
"cudask.testing.workers.TaggedWorker". Does not cover: anything a real
custom worker would do.
"""

from __future__ import annotations

from distributed import Worker


class TaggedWorker(Worker):
    """distributed.Worker, recognisable by its type name and `tag`."""

    tag = "cudask-tagged-worker"


__all__ = ["TaggedWorker"]
