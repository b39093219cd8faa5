"""A running cluster's set-up, read through a Client, as dask-cuda's utils read it.

Covers: `get_worker_config` (run on a worker: each plugin's settings under
"[plugin] ClassName", the host memory fractions, "device-memory-limit" where the
worker spills from its GPU, the protocol, UCX transports, comm timeouts),
`get_scheduler_configuration`, `get_cluster_configuration` (the first worker's
report with the scheduler's, and the worker and thread counts), `print_cluster_config`
(the same as a table in the terminal), `wait_workers` and `all_to_all` (tests' and
benchmarks' helpers), with dask-cuda 26.10's names, keys and return types.
Does not cover: `cudask config`'s per-worker report (cudask.cli.cluster_config).

Threading: the client-side functions run in the caller's thread with a Client
(asynchronous clients get coroutines where dask-cuda's do); `get_worker_config`
runs on a worker's event loop.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from typing import Any

import dask.config
from dask.utils import format_bytes
from distributed import wait
from distributed.comm.addressing import parse_address

_SKIPPED = {"setup", "teardown", "transition", "cores", "name", "idempotent"}
_BYTES = {"memory_limit", "device-memory-limit", "initial_pool_size", "maximum_pool_size"}


def _plugin_settings(plugin: Any) -> Any:
    """A plugin's settings: its describe() where it has one, else its public,
    non-callable attributes; "UNKNOWN CONFIG" when they cannot be pickled."""
    describe = getattr(plugin, "describe", None)
    if callable(describe):
        settings = describe()
    else:
        settings = {
            k: getattr(plugin, k)
            for k in dir(plugin)
            if not k.startswith("_")
            and k not in _SKIPPED
            and not callable(getattr(plugin, k, None))
        }
    try:
        pickle.dumps(settings)
    except (TypeError, pickle.PicklingError, AttributeError):
        return "UNKNOWN CONFIG"
    return settings


def get_worker_config(dask_worker: Any) -> dict[str, Any]:
    """What one worker runs with (through Client.run)."""
    report: dict[str, Any] = {
        f"[plugin] {type(p).__name__}": _plugin_settings(p) for p in dask_worker.plugins.values()
    }
    manager = dask_worker.memory_manager
    for key in (
        "memory_limit",
        "memory_pause_fraction",
        "memory_spill_fraction",
        "memory_target_fraction",
    ):
        report[key] = getattr(manager, key)
    device_limit = getattr(dask_worker.data, "device_memory_limit", None)
    if device_limit is not None:
        report["device-memory-limit"] = device_limit
    protocol, _ = parse_address(dask_worker.scheduler.address)
    report["protocol"] = protocol
    if protocol in ("ucx", "ucxx"):
        import ucxx

        report["ucx-transports"] = ucxx.get_active_transports()
    report["distributed.comm.timeouts"] = dask.config.get("distributed.comm.timeouts")
    return report


async def get_scheduler_configuration(client: Any) -> dict[str, Any]:
    """The scheduler's worker TTL and extensions."""
    ttl = await client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.worker_ttl)
    extensions = await client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.extensions)
    )
    return {"distributed.scheduler.worker-ttl": ttl, "active-extensions": extensions}


def _threads(dask_scheduler: Any) -> list[int]:
    return [ws.nthreads for ws in dask_scheduler.workers.values()]


async def _cluster_configuration(client: Any) -> dict[str, Any]:
    reports = await client.run(get_worker_config)
    out = await get_scheduler_configuration(client)
    if reports:
        out.update(next(iter(reports.values())))
        threads = await client.run_on_scheduler(_threads)  # now, not the client's cache
        out["nworkers"] = len(threads)
        out["nthreads"] = sum(threads)
    return out


def get_cluster_configuration(client: Any) -> Any:
    """The cluster's set-up: the first worker's report (workers of one cluster share
    it), the scheduler's, and the worker and thread counts."""
    return client.sync(_cluster_configuration, client=client, asynchronous=client.asynchronous)


def _table(settings: dict[str, Any], title: str | None) -> Any:
    from rich.markup import escape
    from rich.pretty import Pretty
    from rich.table import Table

    table = Table(title=title, show_header=title is not None)
    table.add_column("Parameter", justify="left")
    table.add_column("Value", justify="left")
    for key, value in sorted(settings.items()):
        if key in _BYTES and isinstance(value, int) and not isinstance(value, bool):
            value = format_bytes(value)
        shown = (
            _table(value, None)
            if isinstance(value, dict) and value
            else escape(value)
            if isinstance(value, str)
            else Pretty(value)
        )
        table.add_row(escape(key), shown)
    return table


def print_cluster_config(client: Any) -> None:
    """Print get_cluster_configuration as a table (synchronous clients)."""
    if client.asynchronous:
        print("print_cluster_config needs a synchronous Client")
        return
    from rich.console import Console

    Console().print(_table(get_cluster_configuration(client), "Dask Cluster Configuration"))


def wait_workers(
    client: Any,
    min_timeout: float = 10,
    seconds_per_gpu: float = 2,
    n_gpus: int | None = None,
    timeout_callback: Callable[[], object] | None = None,
) -> bool:
    """Wait until `n_gpus` workers (default: this process's GPUs) are connected: True,
    or False after max(min_timeout, seconds_per_gpu * n_gpus) seconds, having called
    `timeout_callback`. DASK_CUDA_WAIT_WORKERS_MIN_TIMEOUT overrides min_timeout."""
    from cudask.devices.queries import get_n_gpus

    env = os.environ.get("DASK_CUDA_WAIT_WORKERS_MIN_TIMEOUT")
    minimum = float(env) if env is not None else min_timeout
    wanted = n_gpus or get_n_gpus()
    deadline = time.monotonic() + max(minimum, seconds_per_gpu * wanted)
    while len(client.scheduler_info(n_workers=-1)["workers"]) != wanted:
        if time.monotonic() > deadline:
            if callable(timeout_callback):
                timeout_callback()
            return False
        time.sleep(0.1)
    return True


async def _all_to_all(client: Any) -> None:
    """Every worker gets a piece of data from every other (to open every connection)."""
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    pieces = [client.submit(bytes, 1, pure=False, workers=[w]) for w in workers]
    await wait(pieces)
    await wait([client.submit(len, p, pure=False, workers=[w]) for w in workers for p in pieces])


def all_to_all(client: Any) -> Any:
    return client.sync(_all_to_all, client=client, asynchronous=client.asynchronous)


__all__ = [
    "all_to_all",
    "get_cluster_configuration",
    "get_scheduler_configuration",
    "get_worker_config",
    "print_cluster_config",
    "wait_workers",
]
