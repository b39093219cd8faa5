"""cudask.memory: the tiered device -> host -> disk store and its parts.

Covers: re-exporting the public names of the submodules - `TieredStore` and
`worker_metrics` (store.py), `ProxyStore` (jit/proxy_store.py: JIT-unspill, tasks
get proxies that unspill only what they touch) and `ProxyObject`
(jit/proxy.py), `is_device_object` and the handler registry (handlers/),
`PinnedPool` (host/pool.py), `PinnedMemoryWarning` (host/fallback.py),
`CopyBackend`/`CupyBackend` (backend.py),
`AllocationLedger` (accounting.py). Importing this package imports neither
CuPy nor distributed and creates no CUDA context: names are resolved on first
access.

Does not cover: choosing the store for a worker (`cudask.worker.spec`) or the
RMM pool (`cudask.worker`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "TieredStore": "cudask.memory.store",
    "worker_metrics": "cudask.memory.store",
    "ProxyStore": "cudask.memory.jit.proxy_store",
    "ProxyObject": "cudask.memory.jit.proxy",
    "is_device_object": "cudask.memory.handlers",
    "register_handler": "cudask.memory.handlers",
    "register_lazy": "cudask.memory.handlers",
    "UnspillableError": "cudask.memory.handlers",
    "HostCopy": "cudask.memory.handlers",
    "PinnedPool": "cudask.memory.host.pool",
    "PinnedMemoryWarning": "cudask.memory.host.fallback",
    "CopyBackend": "cudask.memory.backend",
    "CupyBackend": "cudask.memory.backend",
    "AllocationLedger": "cudask.memory.accounting",
}

if TYPE_CHECKING:
    from cudask.memory.accounting import AllocationLedger as AllocationLedger
    from cudask.memory.backend import CopyBackend as CopyBackend
    from cudask.memory.backend import CupyBackend as CupyBackend
    from cudask.memory.handlers import HostCopy as HostCopy
    from cudask.memory.handlers import UnspillableError as UnspillableError
    from cudask.memory.handlers import is_device_object as is_device_object
    from cudask.memory.handlers import register_handler as register_handler
    from cudask.memory.handlers import register_lazy as register_lazy
    from cudask.memory.host.fallback import PinnedMemoryWarning as PinnedMemoryWarning
    from cudask.memory.host.pool import PinnedPool as PinnedPool
    from cudask.memory.jit.proxy import ProxyObject as ProxyObject
    from cudask.memory.jit.proxy_store import ProxyStore as ProxyStore
    from cudask.memory.store import TieredStore as TieredStore
    from cudask.memory.store import worker_metrics as worker_metrics


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cudask.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AllocationLedger",
    "CopyBackend",
    "CupyBackend",
    "HostCopy",
    "PinnedMemoryWarning",
    "PinnedPool",
    "ProxyObject",
    "ProxyStore",
    "TieredStore",
    "UnspillableError",
    "is_device_object",
    "register_handler",
    "register_lazy",
    "worker_metrics",
]
