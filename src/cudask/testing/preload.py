"""A worker preload for checking that `--preload` reaches the worker.

Covers: `dask_setup`, which marks the worker (`cudask_preloaded = True`) so a
test can see the preload ran. Does not cover: anything else. Threading: dask calls
it on the worker's event loop.
"""

from __future__ import annotations

from typing import Any


def dask_setup(worker: Any) -> None:
    worker.cudask_preloaded = True
