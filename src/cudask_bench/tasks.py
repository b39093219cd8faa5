"""The task functions benchmarks submit to workers, by reference.

Covers: the spill chunk's deterministic fill, its element-by-element check and its
sum (`make_chunk`, `verify_chunk`, `sum_chunk`), the first array task of `startup`,
synchronizing the worker's device, host copies of device blocks, the five-point
stencil of `map_overlap`, the worker process's I/O counters, and the facts a worker
reports about its store and device. Each takes
the array module by name ("cupy", or "numpy" to check the harness without a GPU) and
imports it on the worker; nothing here imports a cluster, so the same functions run on
every backend. Does not cover: timing or submitting (cudask_bench.workloads).
Threading: each call runs in one worker thread and shares no state.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from cudask_bench.spec import PACKAGES


def _xp(name: str) -> Any:
    return importlib.import_module(name)


def make_chunk(module: str, base: int, elements: int) -> Any:
    """A uint64 chunk whose element j holds base + j (runs on the worker)."""
    xp = _xp(module)
    chunk = xp.arange(elements, dtype=xp.uint64)
    chunk += xp.uint64(base)
    return chunk


def first_array_task(module: str) -> int:
    """The first array a fresh worker computes: sum(0..1023) on its device (runs on
    the worker; `startup` times it, imports included)."""
    xp = _xp(module)
    return int(xp.arange(1024, dtype=xp.int64).sum())


def verify_chunk(chunk: Any, module: str, base: int, elements: int) -> int:
    """How many elements of `chunk` differ from base + j; -1 for a wrong shape or dtype."""
    xp = _xp(module)
    if tuple(chunk.shape) != (elements,) or str(chunk.dtype) != "uint64":
        return -1
    expected = xp.arange(elements, dtype=xp.uint64)
    expected += xp.uint64(base)
    return int(xp.count_nonzero(chunk != expected))


def sum_chunk(chunk: Any, module: str) -> int:
    """The sum of `chunk`'s elements, modulo 2**64 as uint64 sums wrap (on its device)."""
    return int(chunk.sum(dtype=_xp(module).uint64))


def expected_sum(base: int, elements: int) -> int:
    """What `sum_chunk` returns for the chunk of `make_chunk(module, base, elements)`."""
    return (elements * base + elements * (elements - 1) // 2) % 2**64


#: The counters of /proc/self/io that `io_counters` reads: bytes through read and write
#: system calls (page cache hits included), and bytes to and from the storage layer.
IO_COUNTERS = ("rchar", "wchar", "read_bytes", "write_bytes", "cancelled_write_bytes")


def io_counters() -> dict[str, int]:
    """This process's I/O counters from /proc/self/io (run on the worker, by
    `client.run`); {} where the system has none."""
    try:
        with open("/proc/self/io") as fh:
            pairs = (line.split(":", 1) for line in fh if ":" in line)
            found = {k.strip(): int(v) for k, v in pairs}
    except (OSError, ValueError):
        return {}
    return {k: found[k] for k in IO_COUNTERS if k in found}


def synchronize(module: str) -> None:
    """Wait for every kernel and copy queued on the worker's device."""
    if module == "cupy":
        _xp("cupy").cuda.Device().synchronize()


def to_numpy(block: Any) -> np.ndarray:
    """A host copy of a device block (identity for NumPy blocks)."""
    if isinstance(block, np.ndarray):
        return block
    if hasattr(block, "__cuda_array_interface__") and hasattr(block, "get"):
        return np.asarray(block.get())
    return np.asarray(block)


def stencil(block: Any) -> Any:
    """Five-point Laplacian of a 2-D block (dispatches to CuPy through NumPy's protocols)."""
    return (
        4 * block
        - np.roll(block, 1, axis=0)
        - np.roll(block, -1, axis=0)
        - np.roll(block, 1, axis=1)
        - np.roll(block, -1, axis=1)
    )


def store_facts(dask_worker: Any) -> dict[str, Any]:
    """What the worker's data store is and what it counted (runs on the worker)."""
    import sys

    data = dask_worker.data
    facts: dict[str, Any] = {
        "data_type": f"{type(data).__module__}.{type(data).__qualname__}",
        "keys": len(data),
        "cudask_modules": sorted(m for m in sys.modules if m.split(".")[0] in PACKAGES),
    }
    metrics = getattr(data, "cumulative_metrics", None)
    if metrics is not None:
        try:
            facts["cumulative_metrics"] = {
                "/".join(str(part) for part in (k if isinstance(k, tuple) else (k,))): v
                for k, v in dict(metrics).items()
            }
        except Exception as exc:  # noqa: BLE001 - a store's metrics must not fail the run
            facts["cumulative_metrics_error"] = repr(exc)
    return facts


def device_facts(module: str) -> dict[str, Any]:
    """The device the worker computes on (runs on the worker)."""
    import os

    facts: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if module == "cupy":
        cupy = _xp("cupy")
        device = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        name = props.get("name", b"")
        facts.update(
            name=name.decode() if isinstance(name, bytes) else str(name),
            pci_bus_id=device.pci_bus_id,
            memory_total=int(device.mem_info[1]),
            cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
        )
    return facts


__all__ = [
    "IO_COUNTERS",
    "device_facts",
    "expected_sum",
    "first_array_task",
    "io_counters",
    "make_chunk",
    "stencil",
    "store_facts",
    "sum_chunk",
    "synchronize",
    "to_numpy",
    "verify_chunk",
]
