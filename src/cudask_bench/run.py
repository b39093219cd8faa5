"""The benchmark runner: one process, one backend, one variant, one JSON result.

    python -m cudask_bench.run --backend cudask|dask-cuda|dict --workload spill|cupy|startup \
        [--mode cold|warm] [--device-memory-limit BYTES] [--jit-unspill] ... --json result.json

Covers: importing the backend's cluster class (cudask.LocalCUDACluster,
dask_cuda.LocalCUDACluster, or distributed.LocalCluster with `data=dict`), starting a
one-worker cluster on one GPU with the given options (in cold mode `cupy` starts one per
operation, each closed before the next), running one workload (cudask_bench.workloads),
and writing a JSON result: status, error, measurements, versions seen here and by the
worker, the worker's store facts. Progress events go to stderr as lines starting with
PROGRESS_PREFIX. Exit status 0 when the run succeeded, 1 when it failed (the JSON then
says why), 2 for bad arguments, 143 when stopped by SIGTERM (it closes its cluster
first), which it also sends itself when its parent is gone (cudask_bench.stopping). Cold mode keeps the worker cold until the timed run:
only a ping round trip (`_ping`) precedes the first submit.

Honesty: with --backend dask-cuda this process never imports cudask's cluster, store or
worker code; the result lists the cudask and cudask_bench modules loaded here and on the
worker, and the run fails if any of them is cluster code. It may run under another
interpreter, with cudask and cudask_bench only on PYTHONPATH.

Does not cover: choosing variants, comparing them, charts (cudask_bench.harness).
Threading: the process's main thread; the module imports nothing heavy, since every
worker process that multiprocessing spawns re-imports it as its main module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from cudask_bench import environment, spec, stopping

if TYPE_CHECKING:
    from cudask_bench.measure import Measurement, Step

# Nothing heavier at module level (numpy comes with cudask_bench.workloads): with
# multiprocessing's "spawn", every worker process the cluster starts first re-runs the
# parent's main module, which is this one, so its imports would count in every
# backend's start-up. `main` and `execute` import the workloads.

#: cudask modules that must not be loaded when another backend runs.
CLUSTER_MODULES = ("cudask.deploy", "cudask.memory", "cudask.worker")


class RunnerError(Exception):
    """A runner-level failure with a message meant for the user."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cudask_bench.run",
        description="Run one cudask bench workload on one backend and write a JSON result. "
        "Normally started by `cudask bench`, one process per variant.",
    )
    p.add_argument("--backend", required=True, choices=spec.BACKENDS)
    p.add_argument("--workload", required=True, choices=spec.WORKLOADS)
    p.add_argument("--json", required=True, help="where to write the JSON result")
    p.add_argument("--array-module", default="cupy", choices=spec.ARRAY_MODULES)
    p.add_argument("--device", default="0", help="GPU index or UUID (CUDA_VISIBLE_DEVICES)")
    p.add_argument(
        "--device-memory-limit",
        type=int,
        default=None,
        help="bytes; 0 turns the device limit off; absent: the backend's default",
    )
    p.add_argument("--jit-unspill", action="store_true")
    p.add_argument("--memory-limit", default="auto", help="host memory limit per worker")
    p.add_argument("--rmm-pool-size", type=int, default=None, help="bytes")
    p.add_argument("--protocol", default="tcp")
    p.add_argument(
        "--mode",
        default=spec.DEFAULT_MODE,
        choices=spec.MODES,
        help="spill, cupy: cold (%(default)s) times the first run on this process's fresh "
        "cluster from the first submit, then --warm-runs more; warm times --repeat "
        "repetitions after --warmup ones",
    )
    p.add_argument(
        "--warm-runs",
        type=int,
        default=spec.DEFAULT_WARM_RUNS,
        help="cold mode: runs after the first in the same cluster (the _warm figures)",
    )
    p.add_argument("--repeat", type=int, default=3, help="warm mode: measured repetitions")
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="warm mode: unmeasured repetitions first; cold mode and startup: > 0 makes "
        "this process's run a warm-up",
    )
    p.add_argument("--total", type=int, default=None, help="spill: bytes in all chunks")
    p.add_argument("--chunk-size", type=int, default=None, help="spill: bytes per chunk")
    p.add_argument(
        "--operation",
        action="append",
        default=[],
        choices=list(spec.CUPY_OPERATIONS),
        help="cupy: an operation (repeatable; default all)",
    )
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--array-chunk", type=int, default=None)
    p.add_argument("--second-size", type=int, default=None)
    return p.parse_args(argv)


class Progress:
    """Writes `done/total label` events on stderr for the parent harness."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0

    def __call__(self, label: str) -> None:
        stopping.check_stop()
        self.done += 1
        event = {"done": self.done, "total": self.total, "label": label}
        sys.stderr.write(spec.PROGRESS_PREFIX + json.dumps(event) + "\n")
        sys.stderr.flush()


def steps_of(args: argparse.Namespace) -> list[Step]:
    """The runs of a spill or cupy workload in this process."""
    from cudask_bench.measure import schedule

    return schedule(args.mode, warmup=args.warmup, repeat=args.repeat, warm_runs=args.warm_runs)


def operations_of(args: argparse.Namespace) -> list[str]:
    return args.operation or list(spec.CUPY_OPERATIONS)


def planned_steps(args: argparse.Namespace) -> int:
    """Progress events this process will write ("cluster up" is one per cluster)."""
    if args.workload == "startup":
        return 1
    runs = len(steps_of(args))
    if args.workload == "spill":
        return 1 + 3 * runs  # create, read+verify, read+sum
    operations = len(operations_of(args))
    if args.mode == "cold":  # a cluster per operation, the input timed
        return operations * (2 + runs)
    return 1 + operations * runs


def load_backend(backend: str, jit_unspill: bool) -> tuple[Any, dict[str, Any]]:
    """The backend's cluster class and facts about it; import only that backend."""
    if backend == "cudask":
        from cudask import LocalCUDACluster

        return LocalCUDACluster, {"class": "cudask.LocalCUDACluster"}
    if backend == "dask-cuda":
        try:
            import dask_cuda
            from dask_cuda import LocalCUDACluster as DaskCudaCluster
        except ImportError as exc:
            raise RunnerError(
                f"--backend dask-cuda: dask_cuda cannot be imported in {sys.executable} ({exc}); "
                "install dask-cuda there or point --dask-cuda-python at a Python that has it"
            ) from None
        version = getattr(dask_cuda, "__version__", None) or environment.version_of("dask_cuda")
        takes_jit = "jit_unspill" in inspect.signature(DaskCudaCluster).parameters
        facts = {
            "class": "dask_cuda.LocalCUDACluster",
            "dask_cuda": version,
            "jit_unspill_keyword": takes_jit,
        }
        if jit_unspill and not (takes_jit and environment.dask_cuda_has_jit_unspill(version, None)):
            raise RunnerError(
                f"--jit-unspill: dask-cuda {version} has no JIT-unspill (removed in 26.06); "
                "run the dask-cuda side from an environment with dask-cuda 26.04 or older"
            )
        return DaskCudaCluster, facts
    from distributed import LocalCluster

    return LocalCluster, {"class": "distributed.LocalCluster", "data": "dict"}


def cluster_kwargs(
    args: argparse.Namespace, cluster_class: Any, local_directory: str
) -> dict[str, Any]:
    """Identical options for every backend, spelled the way each takes them."""
    kwargs: dict[str, Any] = {
        "n_workers": 1,
        "threads_per_worker": 1,
        "memory_limit": args.memory_limit,
        "protocol": args.protocol,
        "dashboard_address": None,
        "silence_logs": logging.ERROR,
        "local_directory": local_directory,
    }
    if args.backend == "dict":
        kwargs.update(processes=True, data=dict, env={"CUDA_VISIBLE_DEVICES": args.device})
        return kwargs
    kwargs["CUDA_VISIBLE_DEVICES"] = args.device
    if args.device_memory_limit is not None:
        kwargs["device_memory_limit"] = args.device_memory_limit
    parameters = inspect.signature(cluster_class).parameters
    if args.jit_unspill or "jit_unspill" in parameters:
        kwargs["jit_unspill"] = bool(args.jit_unspill)
    if args.rmm_pool_size is not None:
        kwargs["rmm_pool_size"] = args.rmm_pool_size
    return kwargs


def _ping() -> int:
    return os.getpid()


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Keep distributed's own logging out of the progress stream."""
    logger = logging.getLogger("distributed")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


@dataclasses.dataclass
class ClusterTimes:
    """perf_counter instants of one cluster's start, and how long closing it took."""

    start: float = 0.0
    constructed: float = 0.0
    ready: float = 0.0
    close_s: float = 0.0


@contextlib.contextmanager
def fresh_cluster(
    args: argparse.Namespace,
    cluster_class: Any,
    result: dict[str, Any],
    progress: Progress,
    times: ClusterTimes,
) -> Iterator[Any]:
    """A new one-worker cluster in its own local directory, and a client that has seen
    the worker answer one task (`_ping`); closed on exit, `times.close_s` then set."""
    from distributed import Client

    with tempfile.TemporaryDirectory(prefix="cudask-bench-") as local_directory:
        kwargs = cluster_kwargs(args, cluster_class, local_directory)
        result["cluster"].setdefault(
            "kwargs",
            {
                k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
                for k, v in kwargs.items()
            },
        )
        cluster = None
        try:
            times.start = time.perf_counter()
            with stopping.deferred():  # SIGTERM waits until the cluster is there to close
                cluster = cluster_class(**kwargs)
            times.constructed = time.perf_counter()
            with Client(cluster) as client:
                client.wait_for_workers(1)
                client.submit(_ping, pure=False).result()
                times.ready = time.perf_counter()
                progress("cluster up")
                yield client
        finally:
            if cluster is not None:
                closing = time.perf_counter()
                cluster.close()
                times.close_s = time.perf_counter() - closing


def record_device(client: Any, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The device the worker computes on (the first cluster's, where a process starts several)."""
    from cudask_bench import tasks

    if "worker" not in result:
        facts = client.run(tasks.device_facts, args.array_module)
        result["worker"] = next(iter(facts.values()), {})


def record_store(client: Any, result: dict[str, Any]) -> dict[str, Any]:
    """Record the worker's store facts and versions (the first cluster's, where a process
    starts several); return this cluster's store facts."""
    from cudask_bench import tasks

    store: dict[str, Any] = next(iter(client.run(tasks.store_facts).values()), {})
    result.setdefault("store", store)
    result.setdefault("worker_versions", next(iter(client.run(environment.versions).values())))
    return store


def run_startup(
    args: argparse.Namespace,
    cluster_class: Any,
    import_s: float,
    result: dict[str, Any],
    progress: Progress,
) -> dict[str, Measurement]:
    """Time the import, the cluster, the first round trip, the first array task, closing."""
    from cudask_bench.measure import Measurement
    from cudask_bench.tasks import first_array_task

    times = ClusterTimes()
    with fresh_cluster(args, cluster_class, result, progress, times) as client:
        total = client.submit(first_array_task, args.array_module, pure=False).result()
        t_array = time.perf_counter()
        expected = 1023 * 1024 // 2  # sum(0..1023)
        if total != expected:
            raise RunnerError(f"the first array task returned {total}, not {expected}")
        record_device(client, args, result)
        record_store(client, result)
    measured: dict[str, Measurement] = {}
    for name, seconds in (
        ("startup", import_s + (times.ready - times.start)),
        ("import", import_s),
        ("cluster", times.constructed - times.start),
        ("first_roundtrip", times.ready - times.constructed),
        ("first_array_task", t_array - times.ready),
        ("ready_for_arrays", import_s + (t_array - times.start)),
        ("close", times.close_s),
    ):
        m = Measurement()
        m.record(seconds, args.warmup > 0)
        measured[name] = m
    return measured


def cluster_groups(args: argparse.Namespace) -> list[list[str]]:
    """The cupy operations of each cluster the process starts, in order: one cluster
    for all of them, or in cold mode one per operation (spill: one cluster)."""
    if args.workload != "cupy":
        return [[]]
    operations = operations_of(args)
    return [[op] for op in operations] if args.mode == "cold" else [operations]


def run_in_cluster(
    client: Any, args: argparse.Namespace, operations: list[str], progress: Progress
) -> dict[str, Measurement]:
    from cudask_bench import workloads

    steps = steps_of(args)
    if args.workload == "spill":
        return workloads.run_spill(
            client,
            module=args.array_module,
            total=args.total,
            chunk_size=args.chunk_size,
            steps=steps,
            progress=progress,
        )
    shapes = {
        op: spec.operation_shape(op, args.size, args.array_chunk, args.second_size)
        for op in operations
    }
    return workloads.run_cupy(
        client,
        module=args.array_module,
        operations=operations,
        shapes=shapes,
        steps=steps,
        progress=progress,
        time_input=args.mode == "cold",
    )


def run_workload(
    args: argparse.Namespace,
    cluster_class: Any,
    result: dict[str, Any],
    progress: Progress,
    measured: dict[str, Measurement],
) -> None:
    """spill or cupy into `measured`, cluster by cluster (`cluster_groups`).

    Warm mode asks the worker for its device facts before the workload, as it always
    did; cold mode after, so that nothing but the ping precedes the first submit.
    Where a process starts several clusters, `result["stores"]` holds each one's store.
    """
    groups = cluster_groups(args)
    for operations in groups:
        with fresh_cluster(args, cluster_class, result, progress, ClusterTimes()) as client:
            if args.mode == "warm":
                record_device(client, args, result)
            measured.update(run_in_cluster(client, args, operations, progress))
            record_device(client, args, result)
            store = record_store(client, result)
            if len(groups) > 1:
                result.setdefault("stores", {})[",".join(operations)] = store


def preload() -> None:
    """Import what every backend shares before the backend's own import is timed."""
    import distributed  # noqa: F401

    from cudask_bench import workloads  # noqa: F401


def execute(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Run the workload and fill `result` in place (so a failure keeps what ran)."""
    progress = Progress(planned_steps(args))
    if not environment.has_module(args.array_module):
        raise RunnerError(
            f"--array-module {args.array_module}: {args.array_module} is not installed in "
            f"{sys.executable}; install it (for CUDA 13: pip install cupy-cuda13x)"
        )
    preload()
    measured: dict[str, Measurement] = {}
    result["measurements"] = {}
    start = time.perf_counter()
    cluster_class, facts = load_backend(args.backend, args.jit_unspill)
    import_s = time.perf_counter() - start
    result["cluster"] = facts
    try:
        with quiet_logs():
            if args.workload == "startup":
                measured.update(run_startup(args, cluster_class, import_s, result, progress))
            else:
                run_workload(args, cluster_class, result, progress, measured)
    finally:
        result["measurements"] = {k: v.to_json() for k, v in measured.items()}
    failed = [k for k, v in measured.items() if v.status != "ok"]
    if failed:
        raise RunnerError("; ".join(f"{k}: {measured[k].error}" for k in failed))


def check_honesty(
    backend: str, result: dict[str, Any], loaded: Sequence[str] | None = None
) -> None:
    """Record the cudask modules loaded here; refuse cluster code for other backends."""
    import cudask

    names = sys.modules if loaded is None else loaded
    here = sorted(m for m in names if m.split(".")[0] in spec.PACKAGES)
    result["cudask_modules"] = here
    result["cudask_path"] = os.path.dirname(cudask.__file__)
    if backend == "cudask":
        return
    stores = [result.get("store", {}), *result.get("stores", {}).values()]
    worker = [m for store in stores for m in store.get("cudask_modules", [])]
    leaked = [m for m in here + list(worker) if m.startswith(CLUSTER_MODULES)]
    if leaked:
        raise RunnerError(
            f"--backend {backend} loaded cudask cluster code ({', '.join(sorted(set(leaked)))}); "
            "the comparison would not be fair"
        )


def main(argv: Sequence[str] | None = None) -> int:
    from cudask_bench.measure import BenchFailure

    args = parse_args(argv)
    stopping.runner_lifeline()
    result: dict[str, Any] = {
        "format": spec.RESULT_FORMAT,
        "backend": args.backend,
        "workload": args.workload,
        "arguments": {k: v for k, v in vars(args).items() if k != "json"},
        "python": sys.executable,
        "pid": os.getpid(),
        "status": "ok",
        "error": None,
    }
    code = 0
    try:
        try:
            execute(args, result)
        finally:
            check_honesty(args.backend, result)
    except (RunnerError, BenchFailure) as exc:
        result.update(status="failed", error=str(exc))
        code = 1
    except stopping.Interrupted as exc:  # its cluster closed and its directory gone
        result.update(status="failed", error=f"stopped by {exc.name}")
        code = exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the parent needs the reason, not a crash
        result.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
        code = 1
    return environment.end_runner(result, args.json, code, "cudask bench runner")


if __name__ == "__main__":
    sys.exit(main())
