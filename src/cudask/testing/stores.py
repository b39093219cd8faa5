"""cudask's data stores over fake device memory, for workers of CPU tests.

Covers: `fake_store`, the factory a test names in a worker's `data=(fake_store,
{...})`: distributed calls it in the worker process (it pickles by reference) with
the worker's local directory, and it returns a TieredStore, or with `jit_unspill`
a ProxyStore, whose copies run on cudask.testing.fake_cuda's FakeCopyBackend, with
a small pinned pool and no background pinning, its spilled files under the
worker's directory as a GPU worker's are. Tasks make device objects with
`cudask.testing.fake_cuda.filled`. Does not cover: the spec of a real GPU worker
(cudask.worker.spec builds it); the plugins a test gives such a worker are its own
choice. Threading: as the stores it returns.
"""

from __future__ import annotations

from typing import Any, Literal

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import FakeCopyBackend


def fake_store(
    device_memory_limit: int | None = None,
    memory_limit: int | None = None,
    worker_local_directory: str | None = None,
    *,
    jit_unspill: bool = False,
    log_spilling: bool = False,
    max_spill: int | Literal[False] = False,
    **settings: Any,
) -> Any:
    """A worker's store on the fake backend; `settings` are `store_settings` keywords
    (defaults here: no preallocation, a 64 MiB pinned pool in 1 MiB slabs)."""
    settings.setdefault("pinned_preallocate", False)
    settings.setdefault("pinned_pool_size", 64 << 20)
    settings.setdefault("pinned_slab_size", 1 << 20)
    kwargs: dict[str, Any] = {
        "log_spilling": log_spilling,
        "max_spill": max_spill,
        "worker_local_directory": worker_local_directory,
        "backend": FakeCopyBackend(),
        "settings": store_settings(device_memory_limit, memory_limit, **settings),
    }
    if jit_unspill:
        from cudask.memory.jit.proxy_store import ProxyStore

        return ProxyStore(device_memory_limit, memory_limit, **kwargs)
    return TieredStore(device_memory_limit, memory_limit, **kwargs)


__all__ = ["fake_store"]
