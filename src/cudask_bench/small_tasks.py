"""`cudask bench small-tasks`: small-task throughput with 1, 2 and 4 workers per GPU.

Covers: for each setting N of a plan (`workers_per_gpu`), a fresh Python process
(`python -m cudask_bench.small_tasks PLAN N`) that starts a LocalCUDACluster on the
plan's GPUs with N workers on each, then runs, timed from the first submit:
- tiny: `tasks` independent tasks of a few microseconds' work (Client.map), waited
  for, then gathered and summed;
- chunks: a dask.array of `chunks` int64 chunks of `chunk_size` bytes made on the
  workers (CuPy), doubled plus one and summed, and the differences of neighbours
  summed (x[1:] - x[:-1]: every chunk takes its neighbour's edge, a transfer between
  workers);
the first run of each is the cold figure, the median of `repeat` more the warm one.
Each setting's results (the sums) must be the same as every other's; the report says
whether they are, and each setting's speed-up over N = 1. `measure` runs the same on
any client (NumPy chunks where CuPy is absent: the CPU tests).

Does not cover: the command's checks and printing (cudask_bench.cli.small_tasks).
Threading: the command's thread; `_tiny` and `_block` run on workers.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

WORKLOADS = ("tiny", "chunks")


@dataclass(frozen=True)
class SmallTasksPlan:
    """What every setting runs; `gpus` is the cluster's CUDA_VISIBLE_DEVICES."""

    settings: tuple[int, ...] = (1, 2, 4)
    gpus: str = "0"
    tasks: int = 5000
    chunks: int = 2000
    chunk_size: int = 1 << 20
    repeat: int = 3
    threads_per_worker: int = 1
    device_memory_limit: str | None = None  # None: cudask's default
    timeout: float = 1800.0  # seconds one setting may take


def _tiny(i: int) -> int:
    return i + 1


def _block(n: int, module: str, block_info: Any = None) -> Any:
    import importlib

    xp = importlib.import_module(module)
    ((start, stop),) = block_info[None]["array-location"]
    return xp.arange(start, stop, dtype="int64")


def expected(plan: SmallTasksPlan) -> dict[str, int]:
    """The sums every setting must give."""
    n = plan.chunks * (plan.chunk_size // 8)
    return {"tiny": plan.tasks * (plan.tasks + 1) // 2, "chunks_sum": n * n, "chunks_diff": n - 1}


def _tiny_run(client: Any, plan: SmallTasksPlan, run: int) -> tuple[float, int]:
    from distributed import wait

    start = time.perf_counter()
    futures = client.map(
        _tiny, range(plan.tasks), key=[f"tiny-{run}-{i}" for i in range(plan.tasks)]
    )
    wait(futures)
    seconds = time.perf_counter() - start
    total = sum(client.gather(futures))
    del futures
    return seconds, int(total)


def _host_int(x: Any) -> int:
    return int(x)  # on the worker: the client receives a number, never a device array


def _chunks_graph(plan: SmallTasksPlan, module: str) -> tuple[Any, Any, int]:
    import dask
    import dask.array as da
    import numpy

    n = plan.chunk_size // 8
    # NumPy meta: building the graph here must not make a CUDA context in this process
    x = da.map_blocks(
        _block,
        n,
        module,
        chunks=((n,) * plan.chunks,),
        dtype="int64",
        meta=numpy.empty((0,), dtype="int64"),
    )
    total, diff = (x * 2 + 1).sum(), (x[1:] - x[:-1]).sum()
    keys = set(total.__dask_graph__()) | set(diff.__dask_graph__())
    as_ints = dask.delayed(_host_int)(total), dask.delayed(_host_int)(diff)
    return as_ints[0], as_ints[1], len(keys) + 2  # tasks as written (before optimization)


def _chunks_run(client: Any, plan: SmallTasksPlan, module: str) -> tuple[float, int, int, int]:
    total, diff, tasks = _chunks_graph(plan, module)
    start = time.perf_counter()
    got_total, got_diff = client.compute([total, diff], sync=True)
    seconds = time.perf_counter() - start
    return seconds, int(got_total), int(got_diff), tasks


def measure(client: Any, plan: SmallTasksPlan, module: str = "cupy") -> dict[str, Any]:
    """Both workloads on `client`'s cluster: cold and warm seconds, tasks per second
    (warm) and the results."""
    out: dict[str, Any] = {}
    times = [_tiny_run(client, plan, run) for run in range(plan.repeat + 1)]
    out["tiny"] = _figures([t for t, _ in times], plan.tasks)
    out["tiny"]["result"] = {"tiny": times[0][1], "same_every_run": len({r for _, r in times}) == 1}
    runs = [_chunks_run(client, plan, module) for _ in range(plan.repeat + 1)]
    out["chunks"] = _figures([r[0] for r in runs], runs[0][3])
    out["chunks"]["result"] = {
        "chunks_sum": runs[0][1],
        "chunks_diff": runs[0][2],
        "same_every_run": len({r[1:3] for r in runs}) == 1,
    }
    return out


def _figures(seconds: Sequence[float], tasks: int) -> dict[str, Any]:
    warm = statistics.median(seconds[1:]) if len(seconds) > 1 else None
    return {
        "tasks": tasks,
        "cold_s": seconds[0],
        "warm_s": warm,
        "times_s": list(seconds),
        "warm_tasks_per_s": tasks / warm if warm else None,
    }


def run_setting(plan: SmallTasksPlan, per_gpu: int) -> dict[str, Any]:
    """One setting, in this process: a fresh LocalCUDACluster with `per_gpu` workers
    on each of the plan's GPUs, both workloads, the workers it had."""
    from distributed import Client

    from cudask import LocalCUDACluster
    from cudask.testing import workers_info

    kwargs: dict[str, Any] = {}
    if plan.device_memory_limit is not None:
        kwargs["device_memory_limit"] = plan.device_memory_limit
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=plan.gpus,
            workers_per_gpu=per_gpu,
            threads_per_worker=plan.threads_per_worker,
            dashboard_address=":0",
            silence_logs=40,
            **kwargs,
        ) as cluster,
        Client(cluster) as client,
    ):
        names = sorted(str(w["name"]) for w in workers_info(client).values())
        return {"workers_per_gpu": per_gpu, "workers": names, **measure(client, plan)}


def run_plan(plan: SmallTasksPlan, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every setting in a fresh process, then whether their results agree and each
    one's warm speed-up over the first setting; `progress` gets a line as each
    setting ends."""
    rows = []
    for n in plan.settings:
        started = time.perf_counter()
        rows.append(_child(plan, n))
        if progress is not None:
            state = "failed" if "error" in rows[-1] else "done"
            progress(
                f"small-tasks: {n} worker(s) per GPU {state} in "
                f"{time.perf_counter() - started:.0f} s"
            )
    want = expected(plan)
    for row in rows:
        if "error" in row:
            continue
        got = {**row["tiny"]["result"], **row["chunks"]["result"]}
        row["correct"] = all(got[k] == v for k, v in want.items()) and got["same_every_run"]
    base = rows[0] if rows and "error" not in rows[0] else None
    for row in rows:
        for name in WORKLOADS:
            if base is None or "error" in row:
                continue
            a, b = base[name]["warm_tasks_per_s"], row[name]["warm_tasks_per_s"]
            row[name]["speedup"] = b / a if a and b else None
    ok = [r for r in rows if "error" not in r]
    return {
        "plan": asdict(plan),
        "expected": want,
        "settings": rows,
        "identical": bool(ok) and len(ok) == len(rows) and all(r["correct"] for r in ok),
    }


def _child(plan: SmallTasksPlan, per_gpu: int) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "cudask_bench.small_tasks",
        json.dumps(asdict(plan)),
        str(per_gpu),
    ]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=plan.timeout,
            env=dict(os.environ),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"workers_per_gpu": per_gpu, "error": f"timed out after {plan.timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"workers_per_gpu": per_gpu, "error": " | ".join(tail) or f"exit {done.returncode}"}
    return dict(json.loads(lines[-1]))


def summary(report: Mapping[str, Any]) -> list[str]:
    """The lines the command prints."""
    plan = report["plan"]
    lines = [
        (
            f"small tasks on GPU(s) {plan['gpus']}: {plan['tasks']} tiny tasks; "
            f"{plan['chunks']} chunks of {plan['chunk_size'] >> 10} KiB; cold = first run, "
            f"warm = median of {plan['repeat']}"
        ),
        (
            f"{'workers/GPU':>11}  {'tiny cold s':>11}  {'warm s':>7}  {'tasks/s':>8}  "
            f"{'x':>5}  {'chunks cold s':>13}  {'warm s':>7}  {'tasks/s':>8}  {'x':>5}  results"
        ),
    ]
    for row in report["settings"]:
        if "error" in row:
            lines.append(f"{row['workers_per_gpu']:>11}  failed: {row['error']}")
            continue
        cells = [f"{row['workers_per_gpu']:>11}"]
        for name, width in (("tiny", 11), ("chunks", 13)):
            f = row[name]
            cells += [
                f"{f['cold_s']:>{width}.2f}",
                _num(f["warm_s"], 7, ".2f"),
                _num(f["warm_tasks_per_s"], 8, ".0f"),
                _num(f.get("speedup"), 5, ".2f"),
            ]
        cells.append("right" if row.get("correct") else "WRONG")
        lines.append("  ".join(cells))
    lines.append("results identical in every setting: " + ("yes" if report["identical"] else "NO"))
    return lines


def _num(value: float | None, width: int, spec: str) -> str:
    return f"{value:>{width}{spec}}" if value is not None else " " * (width - 1) + "-"


def main(argv: Sequence[str]) -> None:
    """The child process: one setting, its figures as one JSON line on stdout."""
    plan = SmallTasksPlan(**{**json.loads(argv[0]), "settings": ()})
    print(json.dumps(run_setting(plan, int(argv[1]))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["SmallTasksPlan", "expected", "measure", "run_plan", "run_setting", "summary"]
