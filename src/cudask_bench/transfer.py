"""`cudask bench transfer`: device data between workers of one host, CUDA IPC
(cudask.comm.ipc) against TCP through host memory, in fresh clusters.

Covers: per setting (`settings`: cudask over TCP with `cudask.comm.device-ipc` on and
off, cudask over UCX, and dask-cuda's workers over TCP and UCX when asked), a fresh
scheduler in this process and one worker process per placement entry (its
CUDA_VISIBLE_DEVICES, a worker per GPU in it: ("0", "0") two workers on GPU 0, ("0",
"1") one on each of two GPUs seeing its own alone, ("0,1",) one process over both), then
- point to point: an array made on worker A is used by a task on worker B; the first
  transfer of each size is the cold figure, the median of the repeats the warm one;
  bandwidth is what distributed's transfer log on B records;
- all-to-all: an N x N float64 CuPy array in row blocks rechunked to column blocks
  (task-based, cudask.comm.rechunk), checked by its sum; cold, then warm in the same
  cluster (`all_to_all_warm`);
- shuffle (with dask-cuDF): a DataFrame shuffled on a key by each of the plan's
  methods, cold and warm (cudask_bench.shuffle);
then each worker's IPC counters and store figures (cudask_bench.counters).

Does not cover: the CLI's checks of the plan (cudask_bench.cli.transfer).
Threading: the command's thread; the functions named `_fill`, `_last`, `_cells` run on
workers.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cudask_bench.counters import incoming, ipc_stats, store_figures
from cudask_bench.shuffle import frame_shuffle

PROTOCOLS = ("tcp", "ucx")
LOG_LENGTH = 1 << 20  # each bench worker's distributed.admin.low-level-log-length


@dataclass(frozen=True)
class Setting:
    """One way to run the workers."""

    name: str  # "cudask-ipc", "cudask-tcp", "cudask-ucx", "dask-cuda-tcp", "dask-cuda-ucx"
    backend: str  # "cudask" or "dask-cuda"
    protocol: str
    device_ipc: bool = False  # cudask.comm.device-ipc (cudask over TCP)
    python: str | None = None  # dask-cuda's interpreter (None: this one)
    pythonpath: tuple[str, ...] = ()  # where dask-cuda is, when not installed there


def settings(protocols: tuple[str, ...], dask_cuda: Setting | None) -> tuple[Setting, ...]:
    """cudask over TCP with IPC on and off, then cudask over UCX, and dask-cuda
    (`dask_cuda` carries its interpreter and path) over each protocol."""
    out = []
    if "tcp" in protocols:
        out += [Setting("cudask-ipc", "cudask", "tcp", device_ipc=True),
                Setting("cudask-tcp", "cudask", "tcp")]
    if "ucx" in protocols:
        out.append(Setting("cudask-ucx", "cudask", "ucx"))
    if dask_cuda is not None:
        out += [Setting(f"dask-cuda-{p}", "dask-cuda", p, python=dask_cuda.python,
                        pythonpath=dask_cuda.pythonpath) for p in protocols]
    return tuple(out)


@dataclass(frozen=True)
class TransferPlan:
    placement: tuple[str, ...]  # CUDA_VISIBLE_DEVICES of each worker process (a worker per GPU)
    sizes: tuple[int, ...]
    repeat: int
    n: int
    blocks: int
    device_memory_limit: str
    settings: tuple[Setting, ...]
    rmm_pool_size: str | None = None  # each worker's, CuPy allocating from it; cudask's and dask-cuda's alike
    log_dir: str | None = None
    shuffle_rows: int = 0  # 0: no shuffle
    shuffle_methods: tuple[str, ...] = ()
    shuffle_module: str = "cudf"


@contextmanager
def worker_launch(setting: Setting) -> Iterator[tuple[list[str] | None, dict[str, str]]]:
    """The worker command (None: `cudask worker`) and the environment it adds; for
    another interpreter, the shim directory on its path lasts as long as the block."""
    if setting.backend == "cudask":
        yield None, {"DASK_CUDASK__COMM__DEVICE_IPC": str(setting.device_ipc)}
        return
    from cudask_bench.targets import Target, make_shim, remove_shim  # the parent's side only

    target = Target(setting.python or sys.executable, setting.pythonpath)
    # The measuring functions live in cudask_bench: another interpreter gets cudask and
    # cudask_bench (alone) on its path.
    shim = make_shim() if target.foreign else None
    try:
        env = target.env(shim)
        yield [target.python, "-m", "dask_cuda.cli"], {"PYTHONPATH": env.get("PYTHONPATH", "")}
    finally:
        if shim is not None:
            remove_shim(shim)


def _fill(nbytes: int, value: float) -> Any:
    import cupy

    return cupy.full(nbytes // 8, value)


def _last(x: Any) -> float:
    return float(x[-1])


def _cells(block_info: Any = None, n: int = 0) -> Any:
    import cupy

    (r0, r1), (c0, c1) = block_info[None]["array-location"]
    return cupy.arange(r0, r1, dtype="f8")[:, None] * n + cupy.arange(c0, c1, dtype="f8")[None, :]


def _point_to_point(client: Any, a: str, b: str, size: int, repeat: int) -> dict[str, Any]:
    from distributed import wait

    runs = []
    for i in range(repeat + 1):
        before = len(client.run(incoming, workers=[b])[b])
        x = client.submit(_fill, size, float(i + 1), workers=[a], pure=False)
        wait(x)
        start = time.perf_counter()
        if client.submit(_last, x, workers=[b], pure=False).result() != float(i + 1):
            raise RuntimeError(f"worker {b} read a wrong value from {a}")
        task_s = time.perf_counter() - start
        log = client.run(incoming, workers=[b])[b][before:]
        moved = sum(e["total"] for e in log)
        seconds = sum(e["duration"] for e in log)
        runs.append({"bytes": moved, "transfer_s": seconds, "task_s": task_s,
                     "GBps": moved / seconds / 1e9 if seconds else None})
        del x
    warm = [r["GBps"] for r in runs[1:] if r["GBps"]]
    return {"cold": runs[0], "warm_median_GBps": statistics.median(warm) if warm else None,
            "runs": runs}


def all_to_all(client: Any, n: int, blocks: int) -> dict[str, Any]:
    """Rechunk an n x n float64 CuPy array from `blocks` row blocks to as many column
    blocks on `client`'s workers; seconds from the first submit, sum checked."""
    import cupy
    import dask.array as da
    from distributed import wait

    side = (n // blocks,) * blocks
    x = client.persist(da.map_blocks(_cells, n=n, dtype="f8", chunks=(side, (n,)),
                                     meta=cupy.empty((0, 0))))
    wait(x)
    start = time.perf_counter()
    y = client.persist(x.rechunk(((n,), side), method="tasks"))
    wait(y)
    seconds = time.perf_counter() - start
    total = float(y.sum().compute())
    expected = n * n * (n * n - 1) / 2
    return {"n": n, "blocks": blocks, "bytes": n * n * 8, "seconds": seconds,
            "GBps": n * n * 8 / seconds / 1e9, "sum_ok": abs(total - expected) <= 1e-9 * expected}


def run_setting(setting: Setting, plan: TransferPlan) -> dict[str, Any]:
    """Start the setting's workers and measure."""
    log_dir = Path(plan.log_dir) / f"transfer-{setting.name}" if plan.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    with worker_launch(setting) as (command, launch_env):
        return _measure(setting, plan, log_dir, command, launch_env)


def _measure(setting: Setting, plan: TransferPlan, log_dir: Path | None,
             command: list[str] | None, env: dict[str, str]) -> dict[str, Any]:
    """The setting's worker processes, started with `command` and `env`, measured."""
    from cudask.testing.processes import worker_processes

    # distributed keeps a worker's last `low-level-log-length` fetches (1000); the
    # bench reads differences of that log, so it keeps every fetch of the run
    env = {**env, "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": str(LOG_LENGTH)}
    with worker_processes(plan.placement, env=env, log_dir=log_dir, command=command,
                          protocol=setting.protocol,
                          args=["--device-memory-limit", plan.device_memory_limit,
                                *(["--rmm-pool-size", plan.rmm_pool_size, "--set-rmm-allocator-for-libs", "cupy"]
                                  if plan.rmm_pool_size else [])]
                          ) as client:
        a, b = sorted(client.nthreads())[:2]
        out: dict[str, Any] = {"point_to_point": {
            str(size): _point_to_point(client, a, b, size, plan.repeat) for size in plan.sizes}}
        out["all_to_all"] = all_to_all(client, plan.n, plan.blocks)
        out["all_to_all_warm"] = all_to_all(client, plan.n, plan.blocks)
        if plan.shuffle_rows:
            out["shuffle"] = {
                method: {run: frame_shuffle(client, plan.shuffle_rows, plan.blocks, method, plan.shuffle_module)
                         for run in ("cold", "warm")}
                for method in plan.shuffle_methods}
        out["ipc"] = client.run(ipc_stats)
        out["store"] = client.run(store_figures)
        return out


def run_transfer(plan: TransferPlan) -> dict[str, Any]:
    """Every setting in turn: {"plan": ..., "settings": {name: results}}."""
    return {"plan": asdict(plan), "settings": {s.name: run_setting(s, plan) for s in plan.settings}}


def summary(report: dict[str, Any]) -> list[str]:
    """A line per size and setting, the all-to-all per setting, and the first
    setting's warm bandwidth and all-to-all time against each other's."""
    lines = []
    results = report["settings"]
    for name, r in results.items():
        for size, p in r["point_to_point"].items():
            cold = p["cold"]
            lines.append(f"{name:14} {int(size) / 2**20:7.0f} MiB  cold {cold['GBps'] or 0:7.1f} GB/s "
                         f"({cold['task_s']:.3f} s task)  warm {p['warm_median_GBps'] or 0:7.1f} GB/s")
        a2a, warm = r["all_to_all"], r.get("all_to_all_warm")
        lines.append(f"{name:14} all-to-all {a2a['bytes'] / 1e9:.1f} GB: cold {a2a['seconds']:.2f} s "
                     f"({a2a['GBps']:.1f} GB/s)"
                     + (f", warm {warm['seconds']:.2f} s" if warm else "")
                     + f", sum ok: {a2a['sum_ok'] and (warm or a2a)['sum_ok']}")
        for method, runs in r.get("shuffle", {}).items():
            lines.append(f"{name:14} shuffle {method:5} {_shuffle_run(runs['cold'])}; warm "
                         f"{_shuffle_run(runs['warm'])}")
    names = list(results)
    if len(names) > 1:
        first = results[names[0]]
        largest = max(first["point_to_point"], key=int)
        for other in names[1:]:
            theirs = results[other]
            mine_bw = first["point_to_point"][largest]["warm_median_GBps"]
            their_bw = theirs["point_to_point"][largest]["warm_median_GBps"]
            ratio = f"{mine_bw / their_bw:.1f}x" if mine_bw and their_bw else "n/a"
            a2a = theirs["all_to_all"]["seconds"] / first["all_to_all"]["seconds"]
            warm = ""
            if "all_to_all_warm" in first and "all_to_all_warm" in theirs:
                warm = (f" (warm {theirs['all_to_all_warm']['seconds'] / first['all_to_all_warm']['seconds']:.1f}x)")
            lines.append(f"{names[0]} against {other}: {ratio} the warm bandwidth at "
                         f"{int(largest) / 2**20:.0f} MiB, all-to-all {a2a:.1f}x faster cold{warm}")
            for method, runs in first.get("shuffle", {}).items():
                mine, their = runs["cold"], theirs.get("shuffle", {}).get(method, {}).get("cold", {})
                if "seconds" in mine and "seconds" in their:
                    lines.append(f"{names[0]} against {other}: shuffle {method} "
                                 f"{their['seconds'] / mine['seconds']:.1f}x faster cold")
    return lines


def _shuffle_run(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"failed ({run['error'][:120]})"
    return (f"{run['bytes'] / 1e9:.1f} GB: {run['seconds']:.2f} s ({run['GBps']:.1f} GB/s), "
            f"rows ok: {run['rows_ok']}, keys ok: {run['keys_ok']}")
