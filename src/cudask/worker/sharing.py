"""Several workers on one GPU (`workers_per_gpu`): what each of them gets.

Covers: the number of workers per GPU an options mapping asks for, the order in
which a cluster fills its (GPU, worker-on-it) slots, each worker's share of a
per-GPU size (device memory limit, RMM pool sizes) and of its GPU's CPUs. With one
worker per GPU every function gives back what it was given: a whole size, all
the CPUs, one slot per GPU.
Does not cover: names (cudask.worker.spec.gpu_name, worker_names), parsing sizes
against a device (cudask.worker.sizing.device_sizes) or starting anything.

Threading: pure functions of their arguments; call them from any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def workers_per_gpu(o: Mapping[str, Any]) -> int:
    """N of `workers_per_gpu` (1 where the mapping does not say)."""
    return int(o.get("workers_per_gpu") or 1)


def share(size: int | None, n: int, alignment: int = 1) -> int | None:
    """One worker's share of a per-GPU `size` among `n` workers, rounded down to a
    multiple of `alignment` (None stays None: off)."""
    if size is None or n == 1:
        return size
    part = size // n
    return part - part % alignment if alignment > 1 else part


def cpu_share(cpus: Sequence[int], n: int, k: int) -> tuple[int, ...]:
    """The CPUs worker k of the n on one GPU is pinned to: the k-th of n contiguous,
    near-even parts of the GPU's CPUs when it has at least n, else all of them."""
    cpus = tuple(cpus)
    if n == 1 or len(cpus) < n:
        return cpus
    base, extra = divmod(len(cpus), n)
    start = k * base + min(k, extra)
    return cpus[start : start + base + (1 if k < extra else 0)]


def cluster_slots(n_devices: int, n: int) -> list[tuple[int, int]]:
    """(GPU position, worker number on it) in the order a cluster starts workers:
    one on every GPU before a second on any, so n_workers below GPUs x n spreads."""
    return [(i, k) for k in range(n) for i in range(n_devices)]


def node_slots(positions: Sequence[int], n: int) -> list[tuple[int, int]]:
    """(GPU position, worker number on it) of a node's workers, GPU by GPU: the
    order of their names (NAME-0, NAME-1, ...) and of a --worker-port range."""
    return [(i, k) for i in positions for k in range(n)]


__all__ = ["cluster_slots", "cpu_share", "node_slots", "share", "workers_per_gpu"]
