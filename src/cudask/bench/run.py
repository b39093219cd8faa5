"""The benchmark runner: one process, one backend, one variant, one JSON result.

    python -m cudask.bench.run --backend cudask|dask-cuda|dict --workload spill|cupy|startup \
        [--device-memory-limit BYTES] [--jit-unspill] ... --json result.json

Covers: importing the backend's cluster class (cudask.LocalCUDACluster,
dask_cuda.LocalCUDACluster, or distributed.LocalCluster with `data=dict` as the
plain-dict-store baseline), starting a one-worker cluster on one GPU with the
given options, running one workload (cudask.bench.workloads), and writing a
JSON result: status, error, measurements, versions seen by this process and
by the worker, the worker's store facts. Progress events go to stderr as
lines starting with PROGRESS_PREFIX. Exit status 0 when the run succeeded,
1 when it failed (the JSON then says why), 2 for bad arguments.

Honesty: with --backend dask-cuda this process never imports cudask's cluster,
store or worker code; the result lists the cudask modules loaded here and on
the worker, and the run fails if any of them is cluster code. It may run under
another interpreter, where cudask is only on PYTHONPATH.

Does not cover: choosing variants, comparing them, charts (cudask.bench.harness).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from cudask.bench import environment, spec

# Nothing heavier at module level (numpy comes with cudask.bench.workloads): with
# multiprocessing's "spawn", every worker process the cluster starts first re-runs the
# parent's main module, which is this one, so its imports would count in every
# backend's start-up. `main` and `execute` import the workloads.

#: cudask modules that must not be loaded when another backend runs.
CLUSTER_MODULES = ("cudask.deploy", "cudask.memory", "cudask.worker")


class RunnerError(Exception):
    """A runner-level failure with a message meant for the user."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cudask.bench.run",
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
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=0)
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
        self.done += 1
        event = {"done": self.done, "total": self.total, "label": label}
        sys.stderr.write(spec.PROGRESS_PREFIX + json.dumps(event) + "\n")
        sys.stderr.flush()


def planned_steps(args: argparse.Namespace) -> int:
    runs = args.warmup + args.repeat
    if args.workload == "spill":
        return 1 + 2 * runs
    if args.workload == "cupy":
        return 1 + len(args.operation or spec.CUPY_OPERATIONS) * runs
    return 1


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


def execute(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Run the workload and fill `result` in place (so a failure keeps what ran)."""
    from cudask.bench import workloads

    progress = Progress(planned_steps(args))
    if not environment.has_module(args.array_module):
        raise RunnerError(
            f"--array-module {args.array_module}: {args.array_module} is not installed in "
            f"{sys.executable}; install it (for CUDA 13: pip install cupy-cuda13x)"
        )
    from distributed import Client

    measured: dict[str, workloads.Measurement] = {}
    result["measurements"] = {}
    start = time.perf_counter()
    cluster_class, facts = load_backend(args.backend, args.jit_unspill)
    import_s = time.perf_counter() - start
    result["cluster"] = facts
    with tempfile.TemporaryDirectory(prefix="cudask-bench-") as local_directory, quiet_logs():
        kwargs = cluster_kwargs(args, cluster_class, local_directory)
        result["cluster"]["kwargs"] = {
            k: (v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
            for k, v in kwargs.items()
        }
        t0 = time.perf_counter()
        cluster = cluster_class(**kwargs)
        t1 = time.perf_counter()
        try:
            with Client(cluster) as client:
                client.wait_for_workers(1)
                client.submit(_ping, pure=False).result()
                t2 = time.perf_counter()
                progress("cluster up")
                if args.workload == "startup":
                    total = client.submit(workloads.first_array_task, args.array_module,
                                          pure=False).result()
                    t_array = time.perf_counter()
                    expected = 1023 * 1024 // 2  # sum(0..1023)
                    if total != expected:
                        raise RunnerError(f"the first array task returned {total}, not {expected}")
                worker = client.run(workloads.device_facts, args.array_module)
                result["worker"] = next(iter(worker.values()), {})
                if args.workload == "startup":
                    for name, seconds in (
                        ("startup", import_s + (t2 - t0)),
                        ("import", import_s),
                        ("cluster", t1 - t0),
                        ("first_roundtrip", t2 - t1),
                        ("first_array_task", t_array - t2),
                        ("ready_for_arrays", import_s + (t_array - t0)),
                    ):
                        m = workloads.Measurement()
                        m.record(seconds, args.warmup > 0)
                        measured[name] = m
                elif args.workload == "spill":
                    measured.update(
                        workloads.run_spill(
                            client,
                            module=args.array_module,
                            total=args.total,
                            chunk_size=args.chunk_size,
                            repeat=args.repeat,
                            warmup=args.warmup,
                            progress=progress,
                        )
                    )
                else:
                    ops = args.operation or list(spec.CUPY_OPERATIONS)
                    shapes = {
                        op: spec.operation_shape(op, args.size, args.array_chunk, args.second_size)
                        for op in ops
                    }
                    measured.update(
                        workloads.run_cupy(
                            client,
                            module=args.array_module,
                            operations=ops,
                            shapes=shapes,
                            repeat=args.repeat,
                            warmup=args.warmup,
                            progress=progress,
                        )
                    )
                store = client.run(workloads.store_facts)
                result["store"] = next(iter(store.values()), {})
                result["worker_versions"] = next(iter(client.run(environment.versions).values()))
        finally:
            t3 = time.perf_counter()
            cluster.close()
            close_s = time.perf_counter() - t3
            result["measurements"] = {k: v.to_json() for k, v in measured.items()}
        if args.workload == "startup":
            m = workloads.Measurement()
            m.record(close_s, args.warmup > 0)
            result["measurements"]["close"] = m.to_json()
    failed = [k for k, v in measured.items() if v.status != "ok"]
    if failed:
        raise RunnerError("; ".join(f"{k}: {measured[k].error}" for k in failed))


def check_honesty(
    backend: str, result: dict[str, Any], loaded: Sequence[str] | None = None
) -> None:
    """Record the cudask modules loaded here; refuse cluster code for other backends."""
    import cudask

    names = sys.modules if loaded is None else loaded
    here = sorted(m for m in names if m.split(".")[0] == "cudask")
    result["cudask_modules"] = here
    result["cudask_path"] = os.path.dirname(cudask.__file__)
    if backend == "cudask":
        return
    worker = result.get("store", {}).get("cudask_modules", [])
    leaked = [m for m in here + list(worker) if m.startswith(CLUSTER_MODULES)]
    if leaked:
        raise RunnerError(
            f"--backend {backend} loaded cudask cluster code ({', '.join(sorted(set(leaked)))}); "
            "the comparison would not be fair"
        )


def main(argv: Sequence[str] | None = None) -> int:
    from cudask.bench import workloads

    args = parse_args(argv)
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
    except (RunnerError, workloads.BenchFailure) as exc:
        result.update(status="failed", error=str(exc))
        code = 1
    except Exception as exc:  # noqa: BLE001 - the parent needs the reason, not a crash
        result.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
        )
        code = 1
    result["versions"] = environment.versions()
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    if code:
        sys.stderr.write(f"cudask bench runner: {result['error']}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
