"""`cudask bench limit`: how far above `device_memory_limit` a worker's GPU memory goes.

Covers: for each backend of a plan (cudask; dask-cuda's LocalCUDACluster with
`--against dask-cuda`), in a fresh process of its own (`python -m cudask_bench.limit
PLAN BACKEND`), round after round with the backends' order rotated each round: a
one-worker cluster on one GPU at the plan's device limit; NVML's used memory of that
GPU sampled every `interval` seconds (`cudask_bench.gpu_memory`), less the idle
worker's (read once the worker has run the workload's kernels on tiny arrays); then
three phases, each timed from its first submit: persist (`chunks` int64 CuPy chunks
of `chunk_size` bytes), sum, and tasks (a map_blocks whose every task makes a
`temporary`-byte temporary, summed); the same again warm (`warm_runs` times) in the
same cluster once the first run's keys are gone. Each phase reports its seconds, its
peak above idle and its bound: the limit plus the running tasks' working set (per
thread: the output chunk; the input chunk; input, output and temporary). Sums are
checked against closed forms. `measure` runs the phases on any client (NumPy chunks
and any reader on a CPU: the tests).

Does not cover: the command's checks and printing (cudask_bench.cli.limit). The
module imports nothing of cudask at module level: dask-cuda's run imports no cudask
cluster code.

Threading: the command's thread, and the sampler's; `_chunk`, `_with_temporary` and
`_host_int` run on workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PHASES = ("persist", "sum", "tasks")
BACKENDS = ("cudask", "dask-cuda")
#: A phase is within the target when its peak is at most this times its bound.
SLACK = 1.10


@dataclass(frozen=True)
class LimitPlan:
    """What every run does. `gpu`: the cluster's CUDA_VISIBLE_DEVICES (one GPU);
    `nvml_device`: the same GPU in NVML's terms (UUID), None: `gpu`."""

    backends: tuple[str, ...] = ("cudask",)
    rounds: int = 1
    gpu: str = "0"
    nvml_device: str | None = None
    device_memory_limit: int = 4 * 10**9
    chunks: int = 64
    chunk_size: int = 256 << 20
    temporary: int = 1 << 30
    warm_runs: int = 1
    threads_per_worker: int = 1
    interval: float = 0.02
    dask_cuda_python: str | None = None
    timeout: float = 900.0


# ---------------------------------------------------------------- on the workers
def _chunk(module: str, run: int, block_info: Any = None) -> Any:
    import importlib

    xp = importlib.import_module(module)
    ((start, stop),) = block_info[None]["array-location"]
    return xp.arange(start, stop, dtype="int64") % 1000


def _with_temporary(block: Any, nbytes: int, module: str) -> Any:
    import importlib

    xp = importlib.import_module(module)
    temporary = xp.ones(max(nbytes // 8, 1), dtype="int64")
    one = temporary.sum() // temporary.size  # uses all of it; 1
    return block + one


def _host_int(x: Any) -> int:
    return int(x)  # the client receives a number, never a device array


def _keys(dask_worker: Any) -> int:
    return len(dask_worker.data)


def _store_metrics(dask_worker: Any) -> dict[str, float]:
    metrics = getattr(dask_worker.data, "metrics", None)
    return dict(metrics()) if callable(metrics) else {}


def _warm_up(module: str) -> int:
    """The workload's kernels on tiny arrays, then CuPy's cached blocks given back:
    what stays is the idle worker's."""
    import importlib

    xp = importlib.import_module(module)
    x = xp.arange(1000, dtype="int64") % 1000
    total = int((_with_temporary(x, 8000, module)).sum()) + int(x.sum())
    del x
    if module == "cupy":  # the pool this worker's CuPy allocates from (cudask.comm.leases)
        from cudask.comm.leases import current_pool

        current_pool().free_all_blocks()
    return total


# ---------------------------------------------------------------- in the client
def expected(plan: LimitPlan) -> dict[str, int]:
    """The sums every run must give: of the array, and of the tasks' outputs."""
    n = plan.chunks * (plan.chunk_size // 8)
    full, rest = divmod(n, 1000)
    total = full * 499_500 + rest * (rest - 1) // 2
    return {"sum": total, "tasks": total + n}


def working_sets(plan: LimitPlan) -> dict[str, int]:
    """Device bytes the running tasks of each phase hold (one task per thread)."""
    per_task = {
        "persist": plan.chunk_size,
        "sum": plan.chunk_size,
        "tasks": 2 * plan.chunk_size + plan.temporary,
    }
    return {p: plan.threads_per_worker * n for p, n in per_task.items()}


def _array(plan: LimitPlan, module: str, run: int) -> Any:
    import dask.array as da
    import numpy

    n = plan.chunk_size // 8
    # NumPy meta: building the graph here makes no CUDA context in this process
    return da.map_blocks(
        _chunk,
        module,
        run,
        chunks=((n,) * plan.chunks,),
        dtype="int64",
        meta=numpy.empty((0,), dtype="int64"),
    )


class _Clock:
    """Seconds and peak of one phase: `with clock(name): ...`."""

    def __init__(self, sampler: Any, tag: str) -> None:
        self.sampler, self.tag = sampler, tag
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with self.sampler.phase(f"{self.tag}-{name}"):
            start = time.perf_counter()
            yield
            self.seconds[name] = time.perf_counter() - start


def run_phases(client: Any, plan: LimitPlan, sampler: Any, module: str, run: int) -> dict[str, Any]:
    """One run of the three phases; the keys are released before it returns."""
    import dask
    import numpy
    from distributed import wait

    clock = _Clock(sampler, f"run{run}")
    with clock("persist"):
        held = _array(plan, module, run).persist()
        wait(held)
    with clock("sum"):
        got_sum = client.compute(dask.delayed(_host_int)(held.sum()), sync=True)
    y = held.map_blocks(
        _with_temporary,
        plan.temporary,
        module,
        dtype="int64",
        meta=numpy.empty((0,), dtype="int64"),
    )
    with clock("tasks"):
        got_tasks = client.compute(dask.delayed(_host_int)(y.sum()), sync=True)
    del held, y
    _wait_until_empty(client)
    return {
        "seconds": clock.seconds,
        "peaks": {p: sampler.peaks[f"{clock.tag}-{p}"] for p in PHASES},
        "result": {"sum": int(got_sum), "tasks": int(got_tasks)},
    }


def _wait_until_empty(client: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while any(client.run(_keys).values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def measure(client: Any, plan: LimitPlan, sampler: Any, module: str = "cupy") -> dict[str, Any]:
    """The cold run and the warm runs, each phase's seconds and peak above the
    idle reading, its bound and whether it is within SLACK of it; the results."""
    client.submit(_warm_up, module, pure=False).result()
    idle = int(sampler.read())
    runs = [run_phases(client, plan, sampler, module, run) for run in range(1 + plan.warm_runs)]
    bounds = {p: plan.device_memory_limit + ws for p, ws in working_sets(plan).items()}
    want = expected(plan)
    out: dict[str, Any] = {"idle_bytes": idle, "phases": {}}
    for p in PHASES:
        peaks = [r["peaks"][p] - idle for r in runs]
        warm = [r["seconds"][p] for r in runs[1:]]
        out["phases"][p] = {
            "cold_s": runs[0]["seconds"][p],
            "warm_s": min(warm) if warm else None,
            "peak_bytes": peaks[0],
            "warm_peak_bytes": max(peaks[1:], default=None),
            "bound_bytes": bounds[p],
            "within": max(peaks) <= SLACK * bounds[p],
        }
    out["results"] = [r["result"] for r in runs]
    out["correct"] = all(r["result"] == want for r in runs)
    out["samples"] = sampler.samples
    return out


def _cluster(plan: LimitPlan, backend: str) -> Any:
    kwargs: dict[str, Any] = {
        "CUDA_VISIBLE_DEVICES": plan.gpu,
        "device_memory_limit": plan.device_memory_limit,
        "threads_per_worker": plan.threads_per_worker,
        "dashboard_address": ":0",
        "silence_logs": 40,
    }
    if backend == "dask-cuda":
        from dask_cuda import LocalCUDACluster as DaskCudaCluster

        return DaskCudaCluster(n_workers=1, **kwargs)
    from cudask import LocalCUDACluster

    return LocalCUDACluster(**kwargs)


def run_backend(plan: LimitPlan, backend: str) -> dict[str, Any]:
    """One backend, in this process: a fresh cluster, the runs, the store's metrics."""
    from distributed import Client

    from cudask_bench.gpu_memory import MemorySampler, nvml_used

    started = time.perf_counter()
    with _cluster(plan, backend) as cluster, Client(cluster) as client:
        start_s = time.perf_counter() - started
        with MemorySampler(nvml_used(plan.nvml_device or plan.gpu), plan.interval) as sampler:
            figures = measure(client, plan, sampler)
        store: dict[str, float] = next(iter(client.run(_store_metrics).values()), {})
    return {
        "backend": backend,
        "cluster_start_s": start_s,
        **figures,
        "store": {k: v for k, v in store.items() if k.startswith(("spill-", "device-"))},
    }


# ---------------------------------------------------------------- the plan
def order(backends: Sequence[str], round_: int) -> list[str]:
    """The backends of round `round_`: rotated by one each round."""
    k = round_ % len(backends)
    return list(backends[k:]) + list(backends[:k])


def run_plan(plan: LimitPlan) -> dict[str, Any]:
    """Every round, each backend in a fresh process, the order rotated."""
    rows = []
    for r in range(plan.rounds):
        for backend in order(plan.backends, r):
            rows.append({"round": r, **_child(plan, backend)})
    ok = [row for row in rows if "error" not in row]
    return {
        "plan": asdict(plan),
        "expected": expected(plan),
        "runs": rows,
        "correct": len(ok) == len(rows) and all(row["correct"] for row in ok),
        "within": bool(ok)
        and all(
            row["phases"][p]["within"] for row in ok if row["backend"] == "cudask" for p in PHASES
        ),
    }


def _child(plan: LimitPlan, backend: str) -> dict[str, Any]:
    python = (
        plan.dask_cuda_python
        if backend == "dask-cuda" and plan.dask_cuda_python
        else sys.executable
    )
    env = dict(os.environ)
    if python != sys.executable:  # cudask_bench from this checkout, on the other Python's path
        here = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    argv = [python, "-m", "cudask_bench.limit", json.dumps(asdict(plan)), backend]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=plan.timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"backend": backend, "error": f"timed out after {plan.timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"backend": backend, "error": " | ".join(tail) or f"exit {done.returncode}"}
    return dict(json.loads(lines[-1]))


def summary(report: Mapping[str, Any]) -> list[str]:
    """The lines the command prints."""
    plan = report["plan"]
    gb = 1e9
    lines = [
        (
            f"device_memory_limit {plan['device_memory_limit'] / gb:.2f} GB on GPU {plan['gpu']}: "
            f"{plan['chunks']} chunks of {plan['chunk_size'] >> 20} MiB, a "
            f"{plan['temporary'] >> 20} MiB temporary per task; peaks are NVML's used memory "
            "above the idle worker, in GB; cold = first run, warm = best of "
            f"{plan['warm_runs']}"
        ),
        f"{'backend':>10} {'round':>5}  "
        + "  ".join(f"{p + ' s':>10} {'warm':>6} {'peak':>6} {'bound':>6}" for p in PHASES)
        + "  results",
    ]
    for row in report["runs"]:
        if "error" in row:
            lines.append(f"{row['backend']:>10} {row['round']:>5}  failed: {row['error']}")
            continue
        cells = []
        for p in PHASES:
            f = row["phases"][p]
            mark = "" if f["within"] else "!"
            cells.append(
                f"{f['cold_s']:>10.2f} {_num(f['warm_s'], 6)} "
                f"{f['peak_bytes'] / gb:>5.2f}{mark or ' '} {f['bound_bytes'] / gb:>6.2f}"
            )
        lines.append(
            f"{row['backend']:>10} {row['round']:>5}  "
            + "  ".join(cells)
            + ("  right" if row["correct"] else "  WRONG")
        )
    lines.append(
        f"cudask within {SLACK:.2f}x the bound in every phase: "
        + ("yes" if report["within"] else "NO (marked !)")
    )
    lines.append("results right in every run: " + ("yes" if report["correct"] else "NO"))
    return lines


def _num(value: float | None, width: int) -> str:
    return f"{value:>{width}.2f}" if value is not None else " " * (width - 1) + "-"


def main(argv: Sequence[str]) -> None:
    """The child process: one backend, its figures as one JSON line on stdout."""
    fields = json.loads(argv[0])
    fields["backends"] = tuple(fields["backends"])
    print(json.dumps(run_backend(LimitPlan(**fields), argv[1])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = [
    "BACKENDS",
    "PHASES",
    "LimitPlan",
    "expected",
    "measure",
    "order",
    "run_backend",
    "run_phases",
    "run_plan",
    "summary",
    "working_sets",
]
