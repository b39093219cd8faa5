"""The fault matrix, on a real GPU: each case ends with the right result or one
clear error, and then every key the client still holds is digested where it
lives and compared with a fresh computation of the same value
(`cudask.testing.integrity`). Each case records a row (case, outcome, keys
checked, keys lost, time to recover) for `--fault-table PATH`: the outcome is
built from what the case saw (the store's metrics, the scheduler's counts of
workers lost and keys recomputed: tests/faults/fault_watch.py), and the time to recover
is left out where nothing failed.

Cases: a task exhausting device memory (CuPy on the real GPU, and a fixed RMM
pool; with and without JIT-unspill); the worker process killed mid-compute
while it holds spilled data on host and disk; the local directory on a small
filesystem that fills while spilling (a tmpfs, mounted directly or inside a user
namespace: tests/faults/scratch_fs.py; where neither works, the row says
"not run" and why);
the host memory limit reached while device data spill (distributed's pause and
terminate thresholds); pinning refused and the pinned pool exhausted
mid-spill; another process taking most of the GPU's memory.

Run on a GPU machine:
  python -m pytest tests/faults -m gpu -v --fault-table faults.json
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from fault_watch import watch
from scratch_fs import Unavailable, small_filesystem

from cudask.testing import wait_for
from cudask.testing.integrity import KINDS, check_keys, digest, make_value

pytestmark = pytest.mark.gpu

# Functions below run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 1 << 20
GiB = 1 << 30
Row = Callable[..., dict[str, Any]]


# ---------------------------------------------------------------- helpers
def _cluster(**kwargs: Any) -> Any:
    from cudask import LocalCUDACluster

    kwargs.setdefault("threads_per_worker", 1)
    return LocalCUDACluster(n_workers=1, dashboard_address=":0", **kwargs)


def _fresh_digest(seed: int, nbytes: int, kind: str) -> str:
    return digest(make_value(seed, nbytes, kind))


def _hold(client: Any, n: int, nbytes: int, prefix: str = "held",
          kinds: tuple[str, ...] = KINDS) -> dict[Any, str]:
    """n values made by tasks (so the scheduler can recompute them), each with the
    digest of a fresh computation of the same value."""
    from distributed import wait

    specs = [(i, nbytes, kinds[i % len(kinds)]) for i in range(n)]
    futures = [client.submit(make_value, *s, key=f"{prefix}-{s[0]}") for s in specs]
    wait(futures)
    fresh = client.gather([client.submit(_fresh_digest, *s, pure=False) for s in specs])
    return dict(zip(futures, fresh, strict=True))


def _metrics(dask_worker: Any) -> dict[str, float]:
    return dict(dask_worker.data.metrics())


def _worker_metrics(client: Any) -> dict[str, float]:
    (m,) = client.run(_metrics).values()
    return m


def _pid(client: Any) -> int:
    (pid,) = client.run(os.getpid).values()
    return int(pid)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _allocate_and_sum(nbytes: int) -> int:
    import cupy

    x = cupy.ones(nbytes, dtype=cupy.uint8)
    return int(x.sum(dtype=cupy.uint64))


def _slow_digest(x: Any, delay: float) -> str:
    time.sleep(delay)
    return digest(x)


def _gpu_total() -> int:
    from cudask.devices import discover

    return int(discover().gpus[0].memory_total)


def _wait(client: Any, futures: list[Any], timeout: float = 180) -> None:
    """Wait for `futures`; past `timeout`, fail with the running tasks' stacks and the
    workers' last log lines (a hang is a failure with its evidence)."""
    from distributed import wait

    try:
        wait(futures, timeout=timeout)
    except TimeoutError:
        stacks = client.call_stack()
        pytest.fail(f"not done after {timeout} s: {[f.status for f in futures]}\n"
                    f"stacks: {stacks}\nlogs: {_worker_logs(client)[-3000:]}")


def _worker_logs(client: Any) -> str:
    return "\n".join(line for logs in client.get_worker_logs().values() for _, line in logs)


# ---------------------------------------------------------------- device memory
def _exhaust(client: Any, fits: int, too_big: int,
             match: str) -> tuple[float | None, float, str, dict]:
    """A task allocating `fits` bytes (room only once the store has spilled, at
    the device limit or on demand) must run, one allocating `too_big` must end in one error matching
    `match`. Return the first task's seconds when it ran out of memory and got
    it back by spilling on demand (else None), the spills on demand it took, the
    error's first line and the worker's store metrics at the end."""
    before = _spills(_worker_metrics(client))
    start = time.perf_counter()
    assert client.submit(_allocate_and_sum, fits, pure=False).result() == fits
    fits_s = time.perf_counter() - start
    spills = _spills(_worker_metrics(client)) - before
    with pytest.raises(Exception, match=match) as info:
        client.submit(_allocate_and_sum, too_big, pure=False).result()
    return fits_s if spills else None, spills, _first_line(info.value), _worker_metrics(client)


def _error_type(first_line: str) -> str:
    return first_line.split(":", 1)[0]


def _spills(m: dict[str, float]) -> float:
    """Spills made for allocations: past the device limit, and refused by the device."""
    return m.get("spill-at-limit-count", 0.0) + m.get("spill-on-demand-count", 0.0)


def _spilled_bytes(m: dict[str, float]) -> float:
    return m.get("spill-at-limit-bytes", 0.0) + m.get("spill-on-demand-bytes", 0.0)


def _scale() -> int:
    """The GPU's memory, at most 60% of the host memory distributed sees: what the
    device-exhaustion case spills must fit the host (an H200's 141 GB against a
    128 GiB host would not)."""
    from cudask.memory.settings import system_memory

    return min(_gpu_total(), int(system_memory() * 0.6))


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_task_exhausts_cupy_device_memory(jit: bool, fault_row: Row) -> None:
    """The store holds about half of the GPU (of `_scale`) on the device, a task
    asks for 60%, spilling at the limit or on demand; a second task asks for twice
    the whole GPU."""
    pytest.importorskip("cupy")
    from distributed import Client

    scale = _scale()
    chunk = 1 * GiB
    with _cluster(jit_unspill=jit, device_memory_limit=int(scale * 0.5),
                  memory_limit=int(scale * 0.5)) as cluster, Client(cluster) as client:
        held = _hold(client, int(scale * 0.55) // chunk, chunk, kinds=("f8", "i1", "view"))
        fits_s, spills, error, m = _exhaust(client, int(scale * 0.6), 2 * _gpu_total(),
                                            "(?i)out of memory")
        check = check_keys(client, held)
        fault_row(case=f"task exhausts device memory: CuPy, {'JIT' if jit else 'plain'}",
                  outcome=f"{scale * 0.6 / GiB:.0f} GiB: ran after {spills:.0f} spill(s) at the limit or on "
                          f"demand; 2x the GPU: {_error_type(error)}; {_spills(m):.0f} spill(s) "
                          f"in all ({_spilled_bytes(m) / GiB:.1f} GiB)",
                  check=check, recover_s=fits_s, error=error)
        assert _spills(m) >= 1, m
        assert check.ok, check


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_task_exhausts_rmm_pool(jit: bool, fault_row: Row) -> None:
    """A fixed 2 GiB RMM pool (CuPy allocating through it) with 1.5 GiB held: a task
    asking for 1.25 GiB, then one asking for 4 GiB."""
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    from distributed import Client

    with _cluster(jit_unspill=jit, device_memory_limit="1GiB", memory_limit="8GiB",
                  rmm_pool_size="2GiB", rmm_maximum_pool_size="2GiB",
                  rmm_allocator_external_lib_list="cupy") as cluster, Client(cluster) as client:
        held = _hold(client, 12, 128 * MiB)
        fits_s, spills, error, m = _exhaust(client, 1280 * MiB, 4 * GiB,
                                            "(?i)out.of.memory|bad_alloc")
        check = check_keys(client, held)
        fault_row(case=f"task exhausts device memory: RMM pool, {'JIT' if jit else 'plain'}",
                  outcome=f"1.25 of 2 GiB pool: ran after {spills:.0f} spill(s) at the limit or "
                          f"on demand; 4 GiB: {_error_type(error)}",
                  check=check, recover_s=fits_s, error=error)
        assert _spills(m) >= 1, m
        assert check.ok, check


# ---------------------------------------------------------------- worker killed
@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_worker_killed_mid_compute_with_spilled_data(jit: bool, fault_row: Row) -> None:
    """1.5 GiB through a 512 MiB device tier and a 410 MiB host tier (the rest on
    disk); SIGKILL while tasks read them; the nanny restarts the worker and the
    scheduler recomputes what was lost."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client, as_completed

    with dask.config.set({"distributed.worker.memory.target": 0.05}), \
            _cluster(jit_unspill=jit, device_memory_limit="512MiB",
                     memory_limit="8GiB") as cluster, Client(cluster) as client:
        held = _hold(client, 24, 64 * MiB)
        m = _worker_metrics(client)
        assert m["host-keys"] > 0 and m["disk-keys"] > 0, m
        seen = watch(client)
        reads = {client.submit(_slow_digest, f, 0.3, pure=False): d for f, d in held.items()}
        pid = _pid(client)
        done = as_completed(reads)
        for _ in range(4):
            next(done)
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter()
        results = client.gather(list(reads))
        recover_s = time.perf_counter() - killed
        client.wait_for_workers(1, timeout=120)
        new_pid = _pid(client)
        wrong = [f.key for f, r in zip(reads, results, strict=True) if r != reads[f]]
        check = check_keys(client, held)
        now = seen()
        fault_row(case=f"worker SIGKILLed mid-compute, data on host and disk "
                       f"({'JIT' if jit else 'plain'})",
                  outcome=f"worker left {now.left}x, joined {now.joined}x "
                          f"({'a new process' if new_pid != pid else 'the same process'}); "
                          f"{now.recomputed(held)} of {len(held)} held keys recomputed; "
                          f"{len(reads) - len(wrong)} of {len(reads)} reads right",
                  check=check, recover_s=recover_s, left=now.left, joined=now.joined,
                  recomputed=now.recomputed(held))
        assert new_pid != pid and now.left >= 1 and now.recomputed(held) > 0, now
        assert not wrong
        assert check.ok, check


# ---------------------------------------------------------------- scratch disk
def test_local_directory_fills_while_spilling(tmp_path: Path, fault_row: Row) -> None:
    """The local directory on a 256 MiB filesystem; 1.5 GiB through a 256 MiB device
    tier and a 410 MiB host tier: the disk fills, the rest stays in host memory.
    Where no small filesystem can be made, the row says so."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client

    case = "local directory on a 256 MiB filesystem fills while spilling"
    with contextlib.ExitStack() as stack:
        try:
            small = stack.enter_context(small_filesystem(tmp_path / "small", "256m"))
        except Unavailable as exc:
            fault_row(case=case, outcome=f"not run: no small filesystem here ({exc})",
                      check=None, recover_s=None)
            pytest.skip(f"no small filesystem here: {exc}")
        stack.enter_context(dask.config.set({"distributed.worker.memory.target": 0.05}))
        cluster = stack.enter_context(_cluster(device_memory_limit="256MiB", memory_limit="8GiB",
                                               local_directory=str(small)))
        client = stack.enter_context(Client(cluster))
        start = time.perf_counter()
        held = _hold(client, 24, 64 * MiB)
        create_s = time.perf_counter() - start
        ran = sum(f.status == "finished" for f in held)
        m = _worker_metrics(client)
        logs = _worker_logs(client)
        check = check_keys(client, held)
        # distributed logs "Spill to disk failed" on its `distributed.spill` logger,
        # which the worker's log buffer does not keep: the filesystem itself says.
        free = shutil.disk_usage(small).free
        full = free < 64 * MiB
        fault_row(case=case,
                  outcome=f"disk {'full' if full else 'not full'} ({m['disk-bytes'] / MiB:.0f} "
                          f"MiB on it, {free / MiB:.0f} MiB free): {m['host-keys']:.0f} keys in "
                          f"host memory; {ran} of {len(held)} tasks ran",
                  check=check, recover_s=None, create_s=round(create_s, 2), free_bytes=free)
        assert m["disk-keys"] > 0 and full, (m, free, logs[-2000:])
        assert ran == len(held)
        assert m["host-keys"] * 64 * MiB > 0.05 * 8 * GiB, m  # kept past the host target
        assert check.ok, check


# ---------------------------------------------------------------- host memory limit
def test_host_memory_limit_reached_while_spilling(fault_row: Row) -> None:
    """3 GiB through a 512 MiB device tier into a 3 GiB worker: host memory passes
    distributed's spill and pause thresholds while device data spill."""
    pytest.importorskip("cupy")
    from distributed import Client

    with _cluster(device_memory_limit="512MiB", memory_limit="3GiB") as cluster, \
            Client(cluster) as client:
        pid = _pid(client)
        start = time.perf_counter()
        held = _hold(client, 48, 64 * MiB)
        create_s = time.perf_counter() - start
        seen = watch(client)  # from here on: what the held keys go through
        total = sum(client.gather([client.submit(_allocate_and_sum, MiB, pure=False)]))
        m = _worker_metrics(client)
        logs = _worker_logs(client)
        restarted = _pid(client) != pid
        check = check_keys(client, held)
        paused = "Pausing worker" in logs
        resumed = "Resuming worker" in logs
        now = seen()
        fault_row(case="host memory limit (3 GiB) reached while device data spill",
                  outcome=("worker paused" + (", resumed" if resumed else "") if paused
                           else "worker never paused")
                  + ("; the worker was restarted (a new process)" if restarted else "")
                  + f"; {m['disk-keys']:.0f} keys on disk; a task after it ran",
                  check=check, recover_s=None, create_s=round(create_s, 2), paused=paused,
                  restarted=restarted, left=now.left, recomputed=now.recomputed(held))
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

    with _cluster(device_memory_limit="256MiB", memory_limit="4GiB") as cluster, \
            Client(cluster) as client:
        held = _hold(client, 24, 64 * MiB)
        before = _worker_metrics(client)
        seen = client.submit(_press_host_memory, 0.86, 8.0, pure=False).result(timeout=300)
        freed = time.perf_counter()  # the task has let its memory go
        # A paused worker resumes at the memory monitor's next look (100 ms).
        resumed = wait_for(lambda: set(client.run(_worker_status).values()) == {"running"},
                           timeout=60, interval=0.2)
        recover_s = time.perf_counter() - freed if seen["paused"] and resumed else None
        after = _worker_metrics(client)
        ran = client.submit(_allocate_and_sum, MiB, pure=False).result(timeout=120) == MiB
        check = check_keys(client, held)
        trimmed = after.get("pinned-released-bytes", 0.0) - before.get("pinned-released-bytes", 0.0)
        fault_row(case="host memory held past the pause threshold (4 GiB worker, task at 86%)",
                  outcome=f"worker {'paused' if seen['paused'] else 'never paused'}; "
                          f"{after['disk-keys'] - before['disk-keys']:.0f} keys moved to disk; "
                          f"pinned pool gave {trimmed / MiB:.0f} MiB back; "
                          f"{'resumed' if resumed else 'not running after 60 s'}"
                          f"{'; a task after it ran' if ran else ''}",
                  check=check, recover_s=recover_s, paused=seen["paused"],
                  peak_fraction=round(seen["peak"] / seen["limit"], 3))
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

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            _cluster(device_memory_limit="256MiB", memory_limit="4GiB") as cluster, \
            Client(cluster) as client:
        held = _hold(client, 24, 64 * MiB)
        seen = watch(client)
        bomb = client.submit(_host_bomb, 5 * GiB, pure=False)
        with pytest.raises(KilledWorker) as info:
            bomb.result(timeout=300)
        failed = time.perf_counter()
        check = check_keys(client, held)
        recover_s = time.perf_counter() - failed
        now = seen()
        fault_row(case="task past the host memory limit (4 GiB worker, 5 GiB task)",
                  outcome=f"the worker left {now.left}x and joined {now.joined}x; "
                          f"{_error_type(_first_line(info.value))}; "
                          f"{now.recomputed(held)} of {len(held)} held keys recomputed",
                  check=check, recover_s=recover_s, error=_first_line(info.value),
                  left=now.left, joined=now.joined, recomputed=now.recomputed(held))
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
        store = TieredStore(device_memory_limit=256 * MiB, memory_limit=None, backend=backend,
                            local_directory=str(tmp_path),
                            settings=store_settings(256 * MiB, None, pinned_preallocate=True))
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
    fresh = {spec: _fresh_digest(*spec) for spec in specs}
    check = Check(identical=[str(k) for k in specs if digests[k] == fresh[k]],
                  changed=[str(k) for k in specs if digests[k] != fresh[k]])
    fault_row(case="pinning refused by the driver (register and host-alloc)",
              outcome=f"{backend.refused} call(s) refused; {len(warned)} warning(s); "
                      f"{m['pageable-fallback-count']:.0f} spills to pageable memory; "
                      f"{len(check.identical)} of {len(specs)} read back identical",
              check=check, recover_s=None, run_s=round(spill_s, 2),
              refused_calls=backend.refused, warnings=warned)
    assert check.ok, check
    assert backend.refused >= 1 and m.get("pinned-reserved-bytes", 0) == 0, (backend.refused, m)
    assert m["pageable-fallback-count"] > 0 and 1 <= len(warned) <= 2, (warned, m)


def test_pinned_pool_exhausted_mid_spill(fault_row: Row) -> None:
    """A 64 MiB pinned pool and 1.5 GiB through a 256 MiB device tier: the pool is
    full after the first spills and the rest go to memory faulted in for them."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client

    with dask.config.set({"cudask.memory.pinned-pool-size": "64MiB",
                          "cudask.memory.pinned-slab-size": "32MiB"}), \
            _cluster(device_memory_limit="256MiB", memory_limit="16GiB") as cluster, \
            Client(cluster) as client:
        start = time.perf_counter()
        held = _hold(client, 24, 64 * MiB)
        create_s = time.perf_counter() - start
        m = _worker_metrics(client)
        check = check_keys(client, held)
        fault_row(case="pinned pool (64 MiB) exhausted mid-spill",
                  outcome=f"{m['pageable-fallback-count']:.0f} spills to memory faulted in for "
                          f"them; pool at {m['pinned-reserved-bytes'] / MiB:.0f} MiB",
                  check=check, recover_s=None, create_s=round(create_s, 2))
        assert m["pageable-fallback-count"] > 0 and m["pinned-reserved-bytes"] <= 64 * MiB
        assert check.ok, check


# ---------------------------------------------------------------- another process
def _free_cached_blocks() -> None:
    from cudask.comm.leases import current_pool

    current_pool().free_all_blocks()


@contextlib.contextmanager
def _gpu_hog(leave_free: int) -> Iterator[int]:
    """Another process holding all but `leave_free` bytes of the GPU's free memory."""
    code = ("import sys, cupy\n"
            "free, _ = cupy.cuda.runtime.memGetInfo()\n"
            f"x = cupy.empty(max(free - {leave_free}, 0), dtype=cupy.uint8)\n"
            "print(x.nbytes, flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)


@pytest.mark.parametrize("mode", ["plain", "plain-no-on-demand", "jit"])
def test_another_process_takes_the_gpu(mode: str, fault_row: Row) -> None:
    """The worker's device limit (16 GiB) assumes the GPU is its own; with 8 GiB held,
    another process takes all but 3 GiB of what is free, then 8 more GiB are made."""
    pytest.importorskip("cupy")
    import dask
    from distributed import Client

    on_demand = mode != "plain-no-on-demand"
    with dask.config.set({"cudask.memory.spill-on-demand": on_demand}), \
            _cluster(jit_unspill=mode == "jit", device_memory_limit="16GiB",
                     memory_limit="32GiB") as cluster, Client(cluster) as client:
        held = _hold(client, 8, GiB, prefix="before", kinds=("f8", "i1"))
        client.run(_free_cached_blocks)  # what the worker's CuPy pool keeps is the hog's to take
        with _gpu_hog(3 * GiB) as taken:
            more = [client.submit(make_value, 100 + i, GiB, "f8", key=f"after-{i}")
                    for i in range(8)]
            _wait(client, more)
            erred = [f for f in more if f.status == "error"]
            error = _first_line(erred[0].exception()) if erred else None
            check_during = check_keys(client, held)
        hog_gone = time.perf_counter()
        if erred:  # the other process has gone: the same tasks again
            client.retry(erred)
            _wait(client, more)
        recover_s = time.perf_counter() - hog_gone if erred else None
        rerun = sum(f.status == "finished" for f in erred)
        fresh = client.gather([client.submit(_fresh_digest, 100 + i, GiB, "f8", pure=False)
                               for i in range(8)])
        held.update(dict(zip(more, fresh, strict=True)))
        m = _worker_metrics(client)
        check = check_keys(client, held)
        fault_row(case=f"another process takes the GPU ({taken / GiB:.0f} GiB), {mode}",
                  outcome=(f"{len(erred)} of 8 tasks failed ({_error_type(error or '')}); "
                           f"{rerun} of them ran again once the memory was back" if erred else
                           f"all 8 ran: {m.get('spill-on-demand-count', 0):.0f} spill(s) on "
                           "demand"),
                  check=check, recover_s=recover_s, error=error,
                  held_during=check_during.checked - len(check_during.lost))
        assert check_during.ok, check_during
        assert check.ok, check
        if on_demand:
            assert not erred, error
        else:
            assert erred and "out of memory" in (error or "").lower()
