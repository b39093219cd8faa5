"""What the fault matrix's cases share (test_fault_matrix_gpu.py,
test_fault_host_gpu.py): a one-worker LocalCUDACluster, values held with the
digests of fresh computations of them, the worker's store metrics and pid, the
first line of an error, allocations and digests run as tasks, waiting with the
evidence of a hang, and exhausting device memory. Functions here run on the
workers too: the module is sent by value."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest

from cudask.testing.integrity import KINDS, digest, make_value

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20
GiB = 1 << 30
Row = Callable[..., dict[str, Any]]


def one_worker_cluster(**kwargs: Any) -> Any:
    from cudask import LocalCUDACluster

    kwargs.setdefault("threads_per_worker", 1)
    return LocalCUDACluster(n_workers=1, dashboard_address=":0", **kwargs)


def fresh_digest(seed: int, nbytes: int, kind: str) -> str:
    return digest(make_value(seed, nbytes, kind))


def hold_values(
    client: Any, n: int, nbytes: int, prefix: str = "held", kinds: tuple[str, ...] = KINDS
) -> dict[Any, str]:
    """n values made by tasks (so the scheduler can recompute them), each with the
    digest of a fresh computation of the same value."""
    from distributed import wait

    specs = [(i, nbytes, kinds[i % len(kinds)]) for i in range(n)]
    futures = [client.submit(make_value, *s, key=f"{prefix}-{s[0]}") for s in specs]
    wait(futures)
    fresh = client.gather([client.submit(fresh_digest, *s, pure=False) for s in specs])
    return dict(zip(futures, fresh, strict=True))


def store_metrics(dask_worker: Any) -> dict[str, float]:
    return dict(dask_worker.data.metrics())


def worker_metrics(client: Any) -> dict[str, float]:
    (m,) = client.run(store_metrics).values()
    return m


def worker_pid(client: Any) -> int:
    (pid,) = client.run(os.getpid).values()
    return int(pid)


def first_error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def allocate_and_sum(nbytes: int) -> int:
    import cupy

    x = cupy.ones(nbytes, dtype=cupy.uint8)
    return int(x.sum(dtype=cupy.uint64))


def slow_digest(x: Any, delay: float) -> str:
    time.sleep(delay)
    return digest(x)


def gpu_total() -> int:
    from cudask.devices import discover

    return int(discover().gpus[0].memory_total)


def wait_or_fail(client: Any, futures: list[Any], timeout: float = 180) -> None:
    """Wait for `futures`; past `timeout`, fail with the running tasks' stacks and the
    workers' last log lines (a hang is a failure with its evidence)."""
    from distributed import wait

    try:
        wait(futures, timeout=timeout)
    except TimeoutError:
        stacks = client.call_stack()
        pytest.fail(
            f"not done after {timeout} s: {[f.status for f in futures]}\n"
            f"stacks: {stacks}\nlogs: {worker_logs(client)[-3000:]}"
        )


def worker_logs(client: Any) -> str:
    return "\n".join(line for logs in client.get_worker_logs().values() for _, line in logs)


# ---------------------------------------------------------------- device memory
def exhaust(
    client: Any, fits: int, too_big: int, match: str
) -> tuple[float | None, float, str, dict]:
    """A task allocating `fits` bytes (room only once the store has spilled, at
    the device limit or on demand) must run, one allocating `too_big` must end in one error matching
    `match`. Return the first task's seconds when it ran out of memory and got
    it back by spilling on demand (else None), the spills on demand it took, the
    error's first line and the worker's store metrics at the end."""
    before = spills_made(worker_metrics(client))
    start = time.perf_counter()
    assert client.submit(allocate_and_sum, fits, pure=False).result() == fits
    fits_s = time.perf_counter() - start
    spills = spills_made(worker_metrics(client)) - before
    with pytest.raises(Exception, match=match) as info:
        client.submit(allocate_and_sum, too_big, pure=False).result()
    return fits_s if spills else None, spills, first_error_line(info.value), worker_metrics(client)


def error_type(first_line: str) -> str:
    return first_line.split(":", 1)[0]


def spills_made(m: dict[str, float]) -> float:
    """Spills made for allocations: past the device limit, and refused by the device."""
    return m.get("spill-at-limit-count", 0.0) + m.get("spill-on-demand-count", 0.0)


def spilled_bytes(m: dict[str, float]) -> float:
    return m.get("spill-at-limit-bytes", 0.0) + m.get("spill-on-demand-bytes", 0.0)


def host_fitting_scale() -> int:
    """The GPU's memory, at most 60% of the host memory distributed sees: what the
    device-exhaustion case spills must fit the host (an H200's 141 GB against a
    128 GiB host would not)."""
    from cudask.memory.settings import system_memory

    return min(gpu_total(), int(system_memory() * 0.6))
