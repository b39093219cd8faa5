"""cudask.memory: the tiered device -> host -> disk store and its parts.

Covers: re-exporting the public names of the submodules - `TieredStore` and
`worker_metrics` (store.py), `ProxyStore` (jit/proxy_store.py: JIT-unspill, tasks
get proxies that unspill only what they touch) and `ProxyObject`
(jit/proxy.py), `is_device_object` and the handler registry (dispatch.py),
`PinnedPool` (pinned.py), `CopyBackend`/`CupyBackend` (transfer.py),
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
    "is_device_object": "cudask.memory.dispatch",
    "register_handler": "cudask.memory.dispatch",
    "register_lazy": "cudask.memory.dispatch",
    "UnspillableError": "cudask.memory.dispatch",
    "HostCopy": "cudask.memory.dispatch",
    "PinnedPool": "cudask.memory.pinned",
    "PinnedMemoryWarning": "cudask.memory.pinned",
    "CopyBackend": "cudask.memory.transfer",
    "CupyBackend": "cudask.memory.transfer",
    "AllocationLedger": "cudask.memory.accounting",
}

if TYPE_CHECKING:
    from cudask.memory.accounting import AllocationLedger as AllocationLedger
    from cudask.memory.dispatch import HostCopy as HostCopy
    from cudask.memory.dispatch import UnspillableError as UnspillableError
    from cudask.memory.dispatch import is_device_object as is_device_object
    from cudask.memory.dispatch import register_handler as register_handler
    from cudask.memory.dispatch import register_lazy as register_lazy
    from cudask.memory.jit.proxy import ProxyObject as ProxyObject
    from cudask.memory.jit.proxy_store import ProxyStore as ProxyStore
    from cudask.memory.pinned import PinnedMemoryWarning as PinnedMemoryWarning
    from cudask.memory.pinned import PinnedPool as PinnedPool
    from cudask.memory.store import TieredStore as TieredStore
    from cudask.memory.store import worker_metrics as worker_metrics
    from cudask.memory.transfer import CopyBackend as CopyBackend
    from cudask.memory.transfer import CupyBackend as CupyBackend


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
