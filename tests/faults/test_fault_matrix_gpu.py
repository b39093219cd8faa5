"""The fault matrix on a real GPU, device side: each case ends with the right
result or one clear error, and then every key the client still holds is digested
where it lives and compared with a fresh computation of the same value
(`cudask.testing.integrity`). The outcome is built from what the case saw (the
store's metrics, the scheduler's counts of workers lost and keys recomputed:
tests/faults/fault_watch.py), and the time to recover is left out where nothing
failed.

Cases: a task exhausting device memory (CuPy on the real GPU, and a fixed RMM
pool; with and without JIT-unspill); the worker process killed mid-compute
while it holds spilled data on host and disk; the local directory on a small
filesystem that fills while spilling (a tmpfs, mounted directly or inside a user
namespace: tests/faults/scratch_fs.py; where neither works, the row says
"not run" and why); another process taking most of the GPU's memory. The host
side (host memory limits, pinned memory) is in test_fault_host_gpu.py.

Each case records a row (case, outcome, keys checked, keys lost, time to recover)
for `--fault-table PATH` (tests/faults/conftest.py); the helpers the cases share
are in tests/faults/fault_cases.py.

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
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest
from fault_cases import (
    GiB,
    MiB,
    Row,
    error_type,
    exhaust,
    first_error_line,
    fresh_digest,
    gpu_total,
    hold_values,
    host_fitting_scale,
    one_worker_cluster,
    slow_digest,
    spilled_bytes,
    spills_made,
    wait_or_fail,
    worker_logs,
    worker_metrics,
    worker_pid,
)
from fault_watch import watch
from scratch_fs import Unavailable, small_filesystem

from cudask.testing.integrity import check_keys, make_value

pytestmark = pytest.mark.gpu

# Functions below run on the workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_task_exhausts_cupy_device_memory(jit: bool, fault_row: Row) -> None:
    """The store holds about half of the GPU (of `host_fitting_scale`) on the device, a task
    asks for 60%, spilling at the limit or on demand; a second task asks for twice
    the whole GPU."""
    pytest.importorskip("cupy")
    from distributed import Client

    scale = host_fitting_scale()
    chunk = 1 * GiB
    with (
        one_worker_cluster(
            jit_unspill=jit, device_memory_limit=int(scale * 0.5), memory_limit=int(scale * 0.5)
        ) as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, int(scale * 0.55) // chunk, chunk, kinds=("f8", "i1", "view"))
        fits_s, spills, error, m = exhaust(
            client, int(scale * 0.6), 2 * gpu_total(), "(?i)out of memory"
        )
        check = check_keys(client, held)
        fault_row(
            case=f"task exhausts device memory: CuPy, {'JIT' if jit else 'plain'}",
            outcome=f"{scale * 0.6 / GiB:.0f} GiB: ran after {spills:.0f} spill(s) at the limit or on "
            f"demand; 2x the GPU: {error_type(error)}; {spills_made(m):.0f} spill(s) "
            f"in all ({spilled_bytes(m) / GiB:.1f} GiB)",
            check=check,
            recover_s=fits_s,
            error=error,
        )
        assert spills_made(m) >= 1, m
        assert check.ok, check


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
def test_task_exhausts_rmm_pool(jit: bool, fault_row: Row) -> None:
    """A fixed 2 GiB RMM pool (CuPy allocating through it) with 1.5 GiB held: a task
    asking for 1.25 GiB, then one asking for 4 GiB."""
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    from distributed import Client

    with (
        one_worker_cluster(
            jit_unspill=jit,
            device_memory_limit="1GiB",
            memory_limit="8GiB",
            rmm_pool_size="2GiB",
            rmm_maximum_pool_size="2GiB",
            rmm_allocator_external_lib_list="cupy",
        ) as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, 12, 128 * MiB)
        fits_s, spills, error, m = exhaust(
            client, 1280 * MiB, 4 * GiB, "(?i)out.of.memory|bad_alloc"
        )
        check = check_keys(client, held)
        fault_row(
            case=f"task exhausts device memory: RMM pool, {'JIT' if jit else 'plain'}",
            outcome=f"1.25 of 2 GiB pool: ran after {spills:.0f} spill(s) at the limit or "
            f"on demand; 4 GiB: {error_type(error)}",
            check=check,
            recover_s=fits_s,
            error=error,
        )
        assert spills_made(m) >= 1, m
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

    with (
        dask.config.set({"distributed.worker.memory.target": 0.05}),
        one_worker_cluster(
            jit_unspill=jit, device_memory_limit="512MiB", memory_limit="8GiB"
        ) as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, 24, 64 * MiB)
        m = worker_metrics(client)
        assert m["host-keys"] > 0 and m["disk-keys"] > 0, m
        seen = watch(client)
        reads = {client.submit(slow_digest, f, 0.3, pure=False): d for f, d in held.items()}
        pid = worker_pid(client)
        done = as_completed(reads)
        for _ in range(4):
            next(done)
        os.kill(pid, signal.SIGKILL)
        killed = time.perf_counter()
        results = client.gather(list(reads))
        recover_s = time.perf_counter() - killed
        client.wait_for_workers(1, timeout=120)
        new_pid = worker_pid(client)
        wrong = [f.key for f, r in zip(reads, results, strict=True) if r != reads[f]]
        check = check_keys(client, held)
        now = seen()
        fault_row(
            case=f"worker SIGKILLed mid-compute, data on host and disk "
            f"({'JIT' if jit else 'plain'})",
            outcome=f"worker left {now.left}x, joined {now.joined}x "
            f"({'a new process' if new_pid != pid else 'the same process'}); "
            f"{now.recomputed(held)} of {len(held)} held keys recomputed; "
            f"{len(reads) - len(wrong)} of {len(reads)} reads right",
            check=check,
            recover_s=recover_s,
            left=now.left,
            joined=now.joined,
            recomputed=now.recomputed(held),
        )
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
            fault_row(
                case=case,
                outcome=f"not run: no small filesystem here ({exc})",
                check=None,
                recover_s=None,
            )
            pytest.skip(f"no small filesystem here: {exc}")
        stack.enter_context(dask.config.set({"distributed.worker.memory.target": 0.05}))
        cluster = stack.enter_context(
            one_worker_cluster(
                device_memory_limit="256MiB", memory_limit="8GiB", local_directory=str(small)
            )
        )
        client = stack.enter_context(Client(cluster))
        start = time.perf_counter()
        held = hold_values(client, 24, 64 * MiB)
        create_s = time.perf_counter() - start
        ran = sum(f.status == "finished" for f in held)
        m = worker_metrics(client)
        logs = worker_logs(client)
        check = check_keys(client, held)
        # distributed logs "Spill to disk failed" on its `distributed.spill` logger,
        # which the worker's log buffer does not keep: the filesystem itself says.
        free = shutil.disk_usage(small).free
        full = free < 64 * MiB
        fault_row(
            case=case,
            outcome=f"disk {'full' if full else 'not full'} ({m['disk-bytes'] / MiB:.0f} "
            f"MiB on it, {free / MiB:.0f} MiB free): {m['host-keys']:.0f} keys in "
            f"host memory; {ran} of {len(held)} tasks ran",
            check=check,
            recover_s=None,
            create_s=round(create_s, 2),
            free_bytes=free,
        )
        assert m["disk-keys"] > 0 and full, (m, free, logs[-2000:])
        assert ran == len(held)
        assert m["host-keys"] * 64 * MiB > 0.05 * 8 * GiB, m  # kept past the host target
        assert check.ok, check


# ---------------------------------------------------------------- another process
def _free_cached_blocks() -> None:
    from cudask.comm.leases import current_pool

    current_pool().free_all_blocks()


@contextlib.contextmanager
def _gpu_hog(leave_free: int) -> Iterator[int]:
    """Another process holding all but `leave_free` bytes of the GPU's free memory."""
    code = (
        "import sys, cupy\n"
        "free, _ = cupy.cuda.runtime.memGetInfo()\n"
        f"x = cupy.empty(max(free - {leave_free}, 0), dtype=cupy.uint8)\n"
        "print(x.nbytes, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
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
    with (
        dask.config.set({"cudask.memory.spill-on-demand": on_demand}),
        one_worker_cluster(
            jit_unspill=mode == "jit", device_memory_limit="16GiB", memory_limit="32GiB"
        ) as cluster,
        Client(cluster) as client,
    ):
        held = hold_values(client, 8, GiB, prefix="before", kinds=("f8", "i1"))
        client.run(_free_cached_blocks)  # what the worker's CuPy pool keeps is the hog's to take
        with _gpu_hog(3 * GiB) as taken:
            more = [
                client.submit(make_value, 100 + i, GiB, "f8", key=f"after-{i}") for i in range(8)
            ]
            wait_or_fail(client, more)
            erred = [f for f in more if f.status == "error"]
            error = first_error_line(erred[0].exception()) if erred else None
            check_during = check_keys(client, held)
        hog_gone = time.perf_counter()
        if erred:  # the other process has gone: the same tasks again
            client.retry(erred)
            wait_or_fail(client, more)
        recover_s = time.perf_counter() - hog_gone if erred else None
        rerun = sum(f.status == "finished" for f in erred)
        fresh = client.gather(
            [client.submit(fresh_digest, 100 + i, GiB, "f8", pure=False) for i in range(8)]
        )
        held.update(dict(zip(more, fresh, strict=True)))
        m = worker_metrics(client)
        check = check_keys(client, held)
        fault_row(
            case=f"another process takes the GPU ({taken / GiB:.0f} GiB), {mode}",
            outcome=(
                f"{len(erred)} of 8 tasks failed ({error_type(error or '')}); "
                f"{rerun} of them ran again once the memory was back"
                if erred
                else f"all 8 ran: {m.get('spill-on-demand-count', 0):.0f} spill(s) on demand"
            ),
            check=check,
            recover_s=recover_s,
            error=error,
            held_during=check_during.checked - len(check_during.lost),
        )
        assert check_during.ok, check_during
        assert check.ok, check
        if on_demand:
            assert not erred, error
        else:
            assert erred and "out of memory" in (error or "").lower()
