"""`cudask bench transfer`: device data between workers of one host, CUDA IPC
(cudask.comm.ipc) against TCP through host memory and UCX, in fresh clusters, the
order of the settings rotated between rounds.

Covers: the settings (`settings`: cudask over TCP with `cudask.comm.device-ipc` on,
also without a staging area, with gc_freeze, with `cudask.memory.spill-target: 0.9`
and without spilling on demand (no allocator hooks), and off, cudask over UCX, and
dask-cuda's workers over TCP and UCX when asked), each run without and with each RMM pool of the
plan (a `Case`); `--rounds` rounds, each running every case once in a fresh cluster,
the order rotated by one case each round (`rotations`: no case always pays the
machine's first-use costs), after `warmup` runs of round 0's first case that the
figures leave out (the report's "warmup": they take the machine's first-use costs).
Per case and round, a fresh scheduler (`run_setting`; the command runs each case in a
process of its own, cudask_bench.transfer_case) and one worker process per
placement entry (its CUDA_VISIBLE_DEVICES, a worker per GPU in
it: ("0", "0") two workers on GPU 0, ("0", "1") one on each of two GPUs seeing its own
alone, ("0,1",) one process over both), then
- all-to-all: an N x N float64 CuPy array in row blocks rechunked to column blocks
  (task-based, cudask.comm.rechunk), checked by its sum: cold (the first work of the
  fresh cluster, timed from the rechunk's submit), then `warm_runs` more, of which the
  run of the median time is the warm figure (`all_to_all_warm`, `warm_all_to_all`);
- point to point: an array made on worker A is used by a task on worker B; the first
  transfer of each size is the cold figure, the median of the repeats the warm one;
  bandwidth is what distributed's transfer log on B records;
- shuffle (with dask-cuDF): a DataFrame shuffled on a key by each of the plan's
  methods, cold and warm (cudask_bench.shuffle);
then each worker's IPC counters and store figures (cudask_bench.counters). A case that
fails is recorded with its error and the run goes on; past `budget_s` no new case
starts. Cold and warm per case across rounds, and the targets: cudask_bench.transfer_report.

Does not cover: the CLI's checks of the plan (cudask_bench.cli.transfer).
Threading: the command's thread (`run_setting`: the case runner's main thread); the functions named `_fill`, `_last`, `_cells` run on
workers.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cudask_bench.counters import (
    held_figures,
    incoming,
    ipc_stats,
    store_figures,
    stream_figures,
    watch_spills,
)
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
    env: tuple[tuple[str, str], ...] = ()  # more for the workers' environment


NO_STAGING = (("DASK_CUDASK__COMM__DEVICE_IPC_STAGING", "0"),)  # no cudask.comm.staging area
GC_FREEZE = (("DASK_CUDASK__WORKER__GC_FREEZE", "True"),)  # start-up objects frozen (gc_freeze)
# background spilling from 0.9 of the device limit, keeping room ahead (the default spills at the limit)
SPILL_AHEAD = (("DASK_CUDASK__MEMORY__SPILL_TARGET", "0.9"),)
# no spilling on demand: CuPy's allocator and the RMM resource not hooked (no gate, no counter)
NO_ON_DEMAND = (("DASK_CUDASK__MEMORY__SPILL_ON_DEMAND", "False"),)


def settings(protocols: tuple[str, ...], dask_cuda: Setting | None) -> tuple[Setting, ...]:
    """cudask over TCP with IPC on (the default configuration, then without a staging
    area, with gc_freeze, spilling from 0.9 of the device limit, without spilling on
    demand) and off, then cudask over UCX, and dask-cuda (`dask_cuda` carries its
    interpreter and path) over each protocol."""
    out = []
    if "tcp" in protocols:
        out += [
            Setting("cudask-ipc", "cudask", "tcp", device_ipc=True),
            Setting("cudask-ipc-no-staging", "cudask", "tcp", device_ipc=True, env=NO_STAGING),
            Setting("cudask-ipc-gc-freeze", "cudask", "tcp", device_ipc=True, env=GC_FREEZE),
            Setting("cudask-ipc-spill-ahead", "cudask", "tcp", device_ipc=True, env=SPILL_AHEAD),
            Setting("cudask-ipc-no-on-demand", "cudask", "tcp", device_ipc=True, env=NO_ON_DEMAND),
            Setting("cudask-tcp", "cudask", "tcp"),
        ]
    if "ucx" in protocols:
        out.append(Setting("cudask-ucx", "cudask", "ucx"))
    if dask_cuda is not None:
        out += [
            Setting(
                f"dask-cuda-{p}",
                "dask-cuda",
                p,
                python=dask_cuda.python,
                pythonpath=dask_cuda.pythonpath,
            )
            for p in protocols
        ]
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
    pools: tuple[str | None, ...] = (
        None,
    )  # each worker's RMM pool (None: none), CuPy allocating from it
    rounds: int = 1
    warmup: int = 0  # runs of the first case before the rounds, left out of the figures
    warm_runs: int = 1  # all-to-all runs after the cold one in the same cluster
    budget_s: float = 0.0  # no case starts after this many seconds (0: no limit)
    log_dir: str | None = None
    shuffle_rows: int = 0  # 0: no shuffle
    shuffle_methods: tuple[str, ...] = ()
    shuffle_module: str = "cudf"

    def __post_init__(self) -> None:
        if self.warm_runs < 1:
            raise ValueError(f"warm_runs={self.warm_runs}: a case needs at least one warm run")


@contextmanager
def worker_launch(setting: Setting) -> Iterator[tuple[list[str] | None, dict[str, str]]]:
    """The worker command (None: `cudask worker`) and the environment it adds; for
    another interpreter, the shim directory on its path lasts as long as the block."""
    if setting.backend == "cudask":
        yield None, {"DASK_CUDASK__COMM__DEVICE_IPC": str(setting.device_ipc), **dict(setting.env)}
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
        runs.append(
            {
                "bytes": moved,
                "transfer_s": seconds,
                "task_s": task_s,
                "GBps": moved / seconds / 1e9 if seconds else None,
            }
        )
        del x
    warm = [r["GBps"] for r in runs[1:] if r["GBps"]]
    return {
        "cold": runs[0],
        "warm_median_GBps": statistics.median(warm) if warm else None,
        "runs": runs,
    }


def all_to_all(client: Any, n: int, blocks: int) -> dict[str, Any]:
    """Rechunk an n x n float64 CuPy array from `blocks` row blocks to as many column
    blocks on `client`'s workers; seconds from the first submit, sum checked, what the
    workers did meanwhile (`workers`: counters.stream_figures over the rechunk's own tasks,
    the scheduler's records taken by its record count, `distributed.get_task_stream`; it
    records its task stream from the cluster's start, `_measure`) and, per worker once the rechunk is
    done, what its store holds and has spilled so far and how many blocks of each
    layout it holds (`held`: counters.held_figures; uneven blocks can take one worker
    past its device limit). `rechunk`: dask's `array.rechunk.threshold` and
    `array.chunk-size` in this process, which decide whether dask plans the rechunk in
    one stage or through intermediate chunks, and the rechunk's task count."""
    import cupy
    import dask.array as da
    import dask.config
    from distributed import get_task_stream, wait

    side = (n // blocks,) * blocks
    x = client.persist(
        da.map_blocks(_cells, n=n, dtype="f8", chunks=(side, (n,)), meta=cupy.empty((0, 0)))
    )
    wait(x)
    # the scheduler's records from here on, by its record count (a window of wall-clock
    # times can miss records of a short run), taken once the sum below has run
    with get_task_stream(client) as stream:
        began, start = time.time(), time.perf_counter()
        rechunked = x.rechunk(((n,), side), method="tasks")
        y = client.persist(rechunked)
        wait(y)
        seconds = time.perf_counter() - start
        ended = time.time()
        layouts = {"row-blocks": client.who_has(x), "column-blocks": client.who_has(y)}
        held = {
            w: {
                **figures,
                **{
                    name: float(sum(w in where for where in who.values()))
                    for name, who in layouts.items()
                },
            }
            for w, figures in client.run(held_figures).items()
        }
        total = float(y.sum().compute())
    own = set(rechunked.__dask_graph__()) - set(x.__dask_graph__())  # the rechunk's tasks
    plan = {
        "threshold": dask.config.get("array.rechunk.threshold"),
        "chunk_size": dask.config.get("array.chunk-size"),
        "tasks": len(own),
    }
    expected = n * n * (n * n - 1) / 2
    return {
        "n": n,
        "blocks": blocks,
        "bytes": n * n * 8,
        "seconds": seconds,
        "GBps": n * n * 8 / seconds / 1e9,
        "sum_ok": abs(total - expected) <= 1e-9 * expected,
        "workers": stream_figures(stream.data, began, ended, own),
        "held": held,
        "rechunk": plan,
    }


def warm_all_to_all(client: Any, plan: TransferPlan) -> dict[str, Any]:
    """`plan.warm_runs` all-to-all runs after the cold one: the run of the median time (the
    lower of the two middle ones for an even count, so the figure is a run that happened),
    its `seconds_each` every run's time and `sum_ok` whether every run's sum was right."""
    runs = [all_to_all(client, plan.n, plan.blocks) for _ in range(plan.warm_runs)]
    middle = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]
    return {
        **middle,
        "seconds_each": [r["seconds"] for r in runs],
        "sum_ok": all(r["sum_ok"] for r in runs),
    }


@dataclass(frozen=True)
class Case:
    """A setting with or without an RMM pool."""

    setting: Setting
    pool: str | None = None

    @property
    def name(self) -> str:
        return self.setting.name + (f"+pool-{self.pool}" if self.pool else "")


def cases(plan: TransferPlan) -> tuple[Case, ...]:
    """Every setting without a pool, then with each pool of the plan."""
    return tuple(Case(s, pool) for pool in plan.pools for s in plan.settings)


def rotations(items: tuple[Case, ...], rounds: int) -> list[list[Case]]:
    """The order of each round: round r starts with the r-th case (modulo their number)."""
    n = len(items)
    return [list(items[r % n :] + items[: r % n]) for r in range(rounds)] if n else []


def run_setting(
    setting: Setting, plan: TransferPlan, pool: str | None = None, tag: str = ""
) -> dict[str, Any]:
    """Start the setting's workers (with `pool`) and measure."""
    name = Case(setting, pool).name + tag
    log_dir = Path(plan.log_dir) / f"transfer-{name}" if plan.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    with worker_launch(setting) as (command, launch_env):
        return _measure(plan, pool, log_dir, command, launch_env, setting.protocol)


def _measure(
    plan: TransferPlan,
    pool: str | None,
    log_dir: Path | None,
    command: list[str] | None,
    env: dict[str, str],
    protocol: str,
) -> dict[str, Any]:
    """Worker processes started with `command` and `env`, measured: the all-to-all
    first (its cold run is the fresh cluster's first work), then point to point."""
    from cudask.testing.processes import worker_processes

    # distributed keeps a worker's last `low-level-log-length` fetches (1000); the
    # bench reads differences of that log, so it keeps every fetch of the run
    env = {**env, "DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH": str(LOG_LENGTH)}
    with worker_processes(
        plan.placement,
        env=env,
        log_dir=log_dir,
        command=command,
        protocol=protocol,
        args=[
            "--device-memory-limit",
            plan.device_memory_limit,
            *(["--rmm-pool-size", pool, "--set-rmm-allocator-for-libs", "cupy"] if pool else []),
        ],
    ) as client:
        a, b = sorted(client.nthreads())[:2]
        client.run(watch_spills)  # dask-cuda's store: its spills counted as cudask's count theirs
        client.get_task_stream(count=1)  # the scheduler records its task stream from now on
        out: dict[str, Any] = {"all_to_all": all_to_all(client, plan.n, plan.blocks)}
        out["all_to_all_warm"] = warm_all_to_all(client, plan)
        out["point_to_point"] = {
            str(size): _point_to_point(client, a, b, size, plan.repeat) for size in plan.sizes
        }
        if plan.shuffle_rows:
            out["shuffle"] = {
                method: {
                    run: frame_shuffle(
                        client, plan.shuffle_rows, plan.blocks, method, plan.shuffle_module
                    )
                    for run in ("cold", "warm")
                }
                for method in plan.shuffle_methods
            }
        out["ipc"] = client.run(ipc_stats)
        out["store"] = client.run(store_figures)
        return out


Runner = Callable[[Setting, TransferPlan, str | None, str], dict[str, Any]]


def run_transfer(
    plan: TransferPlan,
    run: Runner = run_setting,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`plan.warmup` runs of the first case, then every case once per round, in each
    round's rotated order: {"plan", "order", "warmup": [...], "settings": {case:
    {"rounds": [...], cold and warm across them}}, "targets"};
    `progress` gets the report so far after each case."""
    from cudask_bench.transfer_report import aggregate, targets

    all_cases = cases(plan)
    order = rotations(all_cases, plan.rounds)
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in all_cases}
    started = time.monotonic()
    warmups: list[dict[str, Any]] = []

    def report() -> dict[str, Any]:
        done = {
            c.name: {
                "setting": c.setting.name,
                "pool": c.pool,
                "rounds": runs[c.name],
                **aggregate(runs[c.name]),
            }
            for c in all_cases
        }
        return {
            "plan": asdict(plan),
            "order": [[c.name for c in rnd] for rnd in order],
            "warmup": warmups,
            "settings": done,
            "targets": targets(done, plan.pools),
        }

    def one(case: Case, entry: dict[str, Any], tag: str) -> dict[str, Any]:
        if plan.budget_s and time.monotonic() - started > plan.budget_s:
            entry["skipped"] = f"past the budget of {plan.budget_s:.0f} s"
            return entry
        case_start = time.monotonic()
        try:
            entry.update(run(case.setting, plan, case.pool, tag))
        except Exception as exc:  # noqa: BLE001 - recorded; the other cases still run
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        entry["case_s"] = time.monotonic() - case_start
        return entry

    for w in range(plan.warmup if order else 0):
        warmups.append(one(order[0][0], {"case": order[0][0].name, "warmup": w}, f"-warmup{w}"))
        if progress is not None:
            progress(report())
    for r, rnd in enumerate(order):
        for position, case in enumerate(rnd):
            runs[case.name].append(one(case, {"round": r, "position": position}, f"-r{r}"))
            if progress is not None:
                progress(report())
    return report()
