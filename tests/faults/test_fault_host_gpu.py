"""The fault matrix on a real GPU, host side: the host memory limit reached while
device data spill (distributed's pause and terminate thresholds), pinning refused
by the driver and the pinned pool exhausted mid-spill. Each case ends with the
right result or one clear error, and every key the client still holds is then
checked where it lives against a fresh computation (`cudask.testing.integrity`).
Rows for the fault table, helpers and how to run: as in test_fault_matrix_gpu.py,
the device side.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from fault_cases import (
    GiB,
    MiB,
    Row,
    allocate_and_sum,
    error_type,
    first_error_line,
    fresh_digest,
    hold_values,
    one_worker_cluster,
    worker_logs,
    worker_metrics,
    worker_pid,
)
from fault_watch import watch

from cudask.testing import wait_for
from cudask.testing.integrity import KINDS, check_keys, digest, make_value

pytestmark = pytest.mark.gpu

# Functions below run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------- host memory limit
def test_host_memory_limit_reached_while_spilling(fault_row: Row) -> None:
    """3 GiB through a 512 MiB device tier into a 3 GiB worker: host memory passes
    distributed's spill and pause thresholds while device data spill."""
    pytest.importorskip("cupy")
    from distributed import Client

    with (
        one_worker_cluster(device_memory_limit="512MiB", memory_limit="3GiB") as cluster,
        Client(cluster) as client,
    ):
        pid = worker_pid(client)
        start = time.perf_counter()
        held = hold_values(client, 48, 64 * MiB)
        create_s = time.perf_counter() - start
        seen = watch(client)  # from here on: what the held keys go through
        total = sum(client.gather([client.submit(allocate_and_sum, MiB, pure=False)]))
        m = worker_metrics(client)
        logs = worker_logs(client)
        restarted = worker_pid(client) != pid
        check = check_keys(client, held)
        paused = "Pausing worker" in logs
        resumed = "Resuming worker" in logs
        now = seen()
        fault_row(
            case="host memory limit (3 GiB) reached while device data spill",
            outcome=(
                "worker paused" + (", resumed" if resumed else "")
                if paused
                else "worker never paused"
            )
            + ("; the worker was restarted (a new process)" if restarted else "")
            + f"; {m['disk-keys']:.0f} keys on disk; a task after it ran",
            check=check,
            recover_s=None,
            create_s=round(create_s, 2),
            paused=paused,
            restarted=restarted,
            left=now.left,
            recomputed=now.recomputed(held),
        )
        assert total == MiB
        assert check.ok, check


def _press_host_memory(fraction: float, hold_s: float) -> dict[str, Any]:
    """Keep the worker process at `fraction` of its memory limit for `hold_s`
    seconds (topping up in 64 MiB steps as the worker moves data out), watching
    the worker's status; then free it all. Return what was seen."""
    import numpy as np
    import psutil
    from distributed import get_worker

    worker = get_worker()
    limit = worker.memory_manager.memory_limit
    proc = psutil.Process()
    chunks: list[Any] = []
    paused = False
    peak = 0
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        rss = proc.memory_info().rss
        peak = max(peak, rss)
        if rss < fraction * limit:
            chunks.append(np.ones(64 * MiB, dtype=np.uint8))
        else:
            time.sleep(0.01)
        paused = paused or worker.status.name == "paused"
    held = len(chunks) * 64 * MiB
    del chunks
    return {"paused": paused, "peak": peak, "limit": limit, "held": held}


def _worker_status(dask_worker: Any) -> str:
    return str(dask_worker.status.name)


def test_host_memory_past_the_pause_threshold(fault_row: Row) -> None:
    """A task holds the worker's process memory between distributed's pause (80%)
    and terminate (95%) thresholds while spilled device data sit in host memory:
    the worker pauses, its memory manager moves the host tier to disk and the
    pinned pool gives its free slabs back (`PinnedPool.trim`); once the task frees
    its memory the worker resumes and every held key reads back."""
    pytest.importorskip("cupy")
    from distributed import Client

    with (
        one_worker_cluster(device_memory_limit="256MiB", memory_limit="4GiB") as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, 24, 64 * MiB)
        before = worker_metrics(client)
        seen = client.submit(_press_host_memory, 0.86, 8.0, pure=False).result(timeout=300)
        freed = time.perf_counter()  # the task has let its memory go
        # A paused worker resumes at the memory monitor's next look (100 ms).
        resumed = wait_for(
            lambda: set(client.run(_worker_status).values()) == {"running"},
            timeout=60,
            interval=0.2,
        )
        recover_s = time.perf_counter() - freed if seen["paused"] and resumed else None
        after = worker_metrics(client)
        ran = client.submit(allocate_and_sum, MiB, pure=False).result(timeout=120) == MiB
        check = check_keys(client, held)
        trimmed = after.get("pinned-released-bytes", 0.0) - before.get("pinned-released-bytes", 0.0)
        fault_row(
            case="host memory held past the pause threshold (4 GiB worker, task at 86%)",
            outcome=f"worker {'paused' if seen['paused'] else 'never paused'}; "
            f"{after['disk-keys'] - before['disk-keys']:.0f} keys moved to disk; "
            f"pinned pool gave {trimmed / MiB:.0f} MiB back; "
            f"{'resumed' if resumed else 'not running after 60 s'}"
            f"{'; a task after it ran' if ran else ''}",
            check=check,
            recover_s=recover_s,
            paused=seen["paused"],
            peak_fraction=round(seen["peak"] / seen["limit"], 3),
        )
        assert seen["paused"], seen
        assert resumed and ran
        assert seen["peak"] < 0.95 * seen["limit"], seen
        assert after["disk-keys"] > before["disk-keys"], (before, after)
        assert check.ok, check


def _host_bomb(nbytes: int) -> int:
    import numpy as np

    x = np.ones(nbytes, dtype=np.uint8)
    time.sleep(30)  # the nanny terminates the process before this ends
    return int(x[0])


def test_task_past_the_host_memory_limit_is_terminated(fault_row: Row) -> None:
    """A task allocating more host memory than the worker may use, while spilled
    device data sit on host and disk: the nanny terminates the worker at
    distributed's terminate threshold, the task ends in one KilledWorker error,
    and the held keys are recomputed."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client, KilledWorker

    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        one_worker_cluster(device_memory_limit="256MiB", memory_limit="4GiB") as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, 24, 64 * MiB)
        seen = watch(client)
        bomb = client.submit(_host_bomb, 5 * GiB, pure=False)
        with pytest.raises(KilledWorker) as info:
            bomb.result(timeout=300)
        failed = time.perf_counter()
        check = check_keys(client, held)
        recover_s = time.perf_counter() - failed
        now = seen()
        fault_row(
            case="task past the host memory limit (4 GiB worker, 5 GiB task)",
            outcome=f"the worker left {now.left}x and joined {now.joined}x; "
            f"{error_type(first_error_line(info.value))}; "
            f"{now.recomputed(held)} of {len(held)} held keys recomputed",
            check=check,
            recover_s=recover_s,
            error=first_error_line(info.value),
            left=now.left,
            joined=now.joined,
            recomputed=now.recomputed(held),
        )
        assert now.left >= 2, now  # allowed-failures 1: the task ended two workers
        assert check.ok, check


# ---------------------------------------------------------------- pinned memory
class _RefusingBackend:
    """CuPy's copy backend with the driver's pinning calls refused the way the
    driver refuses them (cudaErrorMemoryAllocation); every copy is real."""

    def __init__(self) -> None:
        from cudask.memory.backend import CupyBackend

        self._real = CupyBackend()
        self.name = "cupy-refusing-pinning"
        self.refused = 0

    def _refuse(self, *args: Any) -> Any:
        import cupy

        self.refused += 1
        rt = cupy.cuda.runtime
        raise rt.CUDARuntimeError(getattr(rt, "errorMemoryAllocation", 2))

    alloc_pinned = register_host = _refuse

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_pinning_refused_by_the_driver(tmp_path: Path, fault_row: Row) -> None:
    """Every cudaHostRegister and cudaHostAlloc refused: one warning, spills go to
    pageable memory, and 2 GiB through a 256 MiB device tier come back identical."""
    pytest.importorskip("cupy")
    import cupy

    from cudask.memory.host.fallback import PinnedMemoryWarning
    from cudask.memory.settings import store_settings
    from cudask.memory.store import TieredStore
    from cudask.testing.integrity import Check

    backend = _RefusingBackend()
    specs = [(i, 128 * MiB, KINDS[i % 4]) for i in range(16)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PinnedMemoryWarning)
        store = TieredStore(
            device_memory_limit=256 * MiB,
            memory_limit=None,
            backend=backend,
            local_directory=str(tmp_path),
            settings=store_settings(256 * MiB, None, pinned_preallocate=True),
        )
        try:
            start = time.perf_counter()
            for spec in specs:
                store[spec] = make_value(*spec)
            digests = {spec: digest(store[spec]) for spec in specs}
            spill_s = time.perf_counter() - start
            m = store.metrics()
        finally:
            store.close()
    cupy.get_default_memory_pool().free_all_blocks()
    warned = [str(w.message) for w in caught if issubclass(w.category, PinnedMemoryWarning)]
    fresh = {spec: fresh_digest(*spec) for spec in specs}
    check = Check(
        identical=[str(k) for k in specs if digests[k] == fresh[k]],
        changed=[str(k) for k in specs if digests[k] != fresh[k]],
    )
    fault_row(
        case="pinning refused by the driver (register and host-alloc)",
        outcome=f"{backend.refused} call(s) refused; {len(warned)} warning(s); "
        f"{m['pageable-fallback-count']:.0f} spills to pageable memory; "
        f"{len(check.identical)} of {len(specs)} read back identical",
        check=check,
        recover_s=None,
        run_s=round(spill_s, 2),
        refused_calls=backend.refused,
        warnings=warned,
    )
    assert check.ok, check
    assert backend.refused >= 1 and m.get("pinned-reserved-bytes", 0) == 0, (backend.refused, m)
    assert m["pageable-fallback-count"] > 0 and 1 <= len(warned) <= 2, (warned, m)


def test_pinned_pool_exhausted_mid_spill(fault_row: Row) -> None:
    """A 64 MiB pinned pool and 1.5 GiB through a 256 MiB device tier: the pool is
    full after the first spills and the rest go to memory faulted in for them."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client

    with (
        dask.config.set({"cudask.memory.pinned-pool-size": "64MiB"}),
        one_worker_cluster(device_memory_limit="256MiB", memory_limit="16GiB") as cluster,
        Client(cluster) as client,
    ):
        start = time.perf_counter()
        held = hold_values(client, 24, 64 * MiB)
        create_s = time.perf_counter() - start
        m = worker_metrics(client)
        check = check_keys(client, held)
        fault_row(
            case="pinned pool (64 MiB) exhausted mid-spill",
            outcome=f"{m['pageable-fallback-count']:.0f} spills to memory faulted in for "
            f"them; pool at {m['pinned-reserved-bytes'] / MiB:.0f} MiB",
            check=check,
            recover_s=None,
            create_s=round(create_s, 2),
        )
        assert m["pageable-fallback-count"] > 0 and m["pinned-reserved-bytes"] <= 64 * MiB
        assert check.ok, check
