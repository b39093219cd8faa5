"""The work of one ETL setting on its running cluster: the phases, timed and measured.

Covers: `all_runs`, the cold run then `warm_runs` more in the same cluster, each
released before the next; `one_run`, the PHASES timed from the first submit: load (the
fact files and the dimension table read and persisted), groupby (on the key), merge
(with the dimension table, then per category), mean (every column), answers made pandas
on the worker. Per phase: seconds, NVML's peak above the idle cluster, what the store
moved (read with the clock stopped), the task stream's compute and store seconds, the
largest working set (cudask_bench.working_set). A failed phase ends the runs
(PhaseFailed). Does not cover: the cluster and the runner process
(cudask_bench.etl_run), the sampling (cudask_bench.etl_sampler). Threading: the
runner's main thread. Light at import: worker processes import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from cudask_bench import working_set
from cudask_bench.counters import difference, stream_figures
from cudask_bench.etl_data import (
    DIM_DTYPES,
    FACT_DTYPES,
    EtlPlan,
    category_answer,
    dim_file,
    fact_files,
    sample_answer,
    sample_keys,
)
from cudask_bench.etl_sampler import MemorySampler

PHASES: tuple[str, ...] = ("load", "groupby", "merge", "mean")


class PhaseFailed(RuntimeError):
    """A phase of a run raised; the message names the phase and the error."""


# ----------------------------------------------------------------- on the worker


def _host(obj: Any) -> Any:
    """A pandas object or a number of a cuDF or pandas result (on the worker)."""
    if hasattr(obj, "to_pandas"):
        return obj.to_pandas()
    if type(obj).__module__.startswith("pandas"):
        return obj
    return obj.item() if hasattr(obj, "item") else obj


def _groupby_answer(frame: Any, keys: list[int]) -> tuple[int, Any]:
    """The number of groups of a groupby's result and its sample keys' rows, as pandas
    (on the worker)."""
    return len(frame), _host(frame[frame.index.isin(keys)])


def _on_worker(client: Any, collection: Any, func: Callable[..., Any], *args: Any) -> Any:
    """Compute `collection` on the cluster and return `func(result, *args)`, applied
    there: the result itself never reaches this process."""
    future = client.compute(collection)
    try:
        return client.submit(func, future, *args, pure=False).result()
    finally:
        future.release()


def _task_count(dask_scheduler: Any) -> int:
    return len(dask_scheduler.tasks)


# ---------------------------------------------------------------------- the runs


def _read(plan: EtlPlan, root: str, fmt: str) -> tuple[Any, Any]:
    """The fact and dimension frames, read as the seeds do: dask_cudf.read_csv and
    read_parquet with their defaults (dask.dataframe's for pandas frames)."""
    if plan.frames == "cudf":
        import dask_cudf as reader
    else:
        import dask.dataframe as reader
    if fmt == "csv":  # a glob: what every read_csv takes
        return (
            reader.read_csv(os.path.join(root, fmt, "fact", "*.csv"), dtype=FACT_DTYPES),
            reader.read_csv(dim_file(root, fmt), dtype=DIM_DTYPES),
        )
    return reader.read_parquet(fact_files(root, fmt)), reader.read_parquet(dim_file(root, fmt))


def _phases(client: Any, plan: EtlPlan, df: Any, dim: Any) -> Any:
    """The work after the read, phase by phase: yields (name, answers) as each ends."""
    from distributed import futures_of, wait

    df, dim = df.persist(), dim.persist()  # as users persist a collection
    for future in wait(futures_of([df, dim])).done:
        if future.status == "error":
            future.result()  # raises the task's error (wait does not)
    yield "load", {}

    def submitted(collection: Any) -> Any:
        return collection.optimize() if plan.fuse else collection

    groups = submitted(df.groupby("key").agg({"x": "sum", "y": "sum", "v": "count"}))
    count, sample = _on_worker(client, groups, _groupby_answer, sample_keys(plan.keys))
    yield "groupby", {"groups": int(count), "sample": sample_answer(sample)}
    merged = df.merge(dim, on="key", how="inner")
    by_cat = submitted(merged.groupby("cat").agg({"x": "sum", "w": "sum", "y": "count"}))
    yield "merge", {"by_category": category_answer(_on_worker(client, by_cat, _host))}
    means = _on_worker(client, submitted(df[list(FACT_DTYPES)].mean()), _host)
    yield "mean", {"means": {str(k): float(v) for k, v in means.items()}}


def one_run(
    client: Any,
    plan: EtlPlan,
    root: str,
    fmt: str,
    sampler: MemorySampler,
    idle: int | None,
    kind: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """One run of the work; the graph of the read is built before the clock starts.
    Between two phases the clock stops while the worker's store counters are read."""
    run: dict[str, Any] = {"kind": kind, "phases": {}, "answers": {}, "error": None}
    df, dim = _read(plan, root, fmt)
    # what persisting makes: dask-cuDF's reader joins small files into larger partitions
    # only when the expression is optimized
    run["partitions"] = df.optimize().npartitions
    run["idle_before_bytes"] = sampler.idle() if kind != "cold" else idle
    counters = _counters(client)
    work = _phases(client, plan, df, dim)
    del df, dim
    start = last = time.perf_counter()
    began = epoch = time.time()
    name, windows = PHASES[0], {}
    try:
        for name, answers in work:
            sampler.mark()
            now, windows[name] = time.perf_counter(), (epoch, time.time())
            phase: dict[str, Any] = {
                "seconds": now - last,
                "peak_bytes": _above(sampler.peak(last, now), idle),
            }
            run["phases"][name] = phase
            run["answers"].update(answers)
            after = _counters(client)
            phase["moved"] = difference(counters, after)
            counters = after
            progress(f"{kind}: {name}")
            name = PHASES[min(PHASES.index(name) + 1, len(PHASES) - 1)]
            last, epoch = time.perf_counter(), time.time()
    except Exception as exc:  # noqa: BLE001 - recorded; the runs end here
        run["error"] = f"{name}: {type(exc).__name__}: {exc}"
    finally:
        work.close()
    end = time.perf_counter()
    run["total_s"] = sum(p["seconds"] for p in run["phases"].values()) + (
        end - last if run["error"] else 0.0
    )
    run["wall_s"] = end - start
    run["peak_bytes"] = _above(sampler.peak(start, end), idle)
    stream = client.get_task_stream(start=began, stop=time.time())
    spans = _task_seconds(stream, windows)
    for phase_name, seconds in spans.items():
        run["phases"][phase_name].update(seconds)
    _working_sets(run, client.run_on_scheduler(working_set.records), stream, sampler, windows)
    return run


def _working_sets(
    run: dict[str, Any],
    found: list[working_set.Record],
    stream: Any,
    sampler: MemorySampler,
    windows: dict[str, tuple[float, float]],
) -> None:
    """Each phase's largest task: its inputs and output as the worker sized them, and its
    inputs plus the larger of its output and what NVML saw it add while it computed (and
    of how many tasks NVML saw that)."""
    grown = working_set.growth(sampler.by_epoch(), working_set.compute_spans(stream))
    sized, seen = working_set.largest(found, windows), working_set.largest(found, windows, grown)
    counted = working_set.measured(found, windows, grown)
    for phase_name in windows:
        run["phases"][phase_name].update(
            working_set_bytes=sized[phase_name],
            working_set_nvml_bytes=seen[phase_name],
            working_set_nvml_tasks=counted[phase_name],
        )


def _store_counters(dask_worker: Any) -> dict[str, float]:
    """The store's cumulative counters (on the worker): its moves (spill, unspill,
    disk; any store with `cumulative_metrics`) and, for cudask's, the pinned pool's
    pageable fallbacks and provisioning (`metrics()`)."""
    data, out = dask_worker.data, {}
    for k, v in dict(getattr(data, "cumulative_metrics", None) or {}).items():
        out["/".join(str(p) for p in (k if isinstance(k, tuple) else (k,)))] = float(v)
    metrics = getattr(data, "metrics", None)
    if callable(metrics):
        out.update(
            {
                k: float(v)
                for k, v in metrics().items()
                if k.startswith(("pageable-", "pinned-provision-", "spill-on-demand-"))
            }
        )
    return out


def _counters(client: Any) -> dict[str, float]:
    return dict(next(iter(client.run(_store_counters).values()), {}))


#: The task stream's spans a phase sums: the thread computing a task, and the worker's
#: event loop reading its inputs from the store and writing its output (distributed
#: records those two only when they take over 5 ms: an unspill, a spill).
SPANS = {"compute": "compute_s", "disk-read": "store_read_s", "disk-write": "store_write_s"}


def _task_seconds(
    records: Any, windows: dict[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Per phase window (epoch seconds), the seconds of each of SPANS (counters.stream_figures)."""
    out = {}
    for name, (a, b) in windows.items():
        figures = stream_figures(records, a, b)
        out[name] = {field: figures.get(f"{action}_s", 0.0) for action, field in SPANS.items()}
    return out


def _above(value: int | None, idle: int | None) -> int | None:
    return value - idle if value is not None and idle is not None else None


def _released(client: Any, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until the scheduler holds no task (what a run persisted is gone); how long
    that took and how many tasks were left at the end (0 unless `timeout` passed)."""
    start = time.monotonic()
    left = client.run_on_scheduler(_task_count)
    while left and time.monotonic() < start + timeout:
        time.sleep(0.1)
        left = client.run_on_scheduler(_task_count)
    return {"seconds": time.monotonic() - start, "tasks_left": left}


def all_runs(
    client: Any,
    plan: EtlPlan,
    root: str,
    fmt: str,
    sampler: MemorySampler,
    memory: dict[str, Any],
    result: dict[str, Any],
    progress: Callable[[str], None],
) -> None:
    """The cold run and `plan.warm_runs` warm ones, appended to `result["runs"]`, the idle
    figures into `memory`; a run with an error raises PhaseFailed after it is kept."""
    idle: int | None = None
    for i in range(1 + plan.warm_runs):
        kind = "cold" if i == 0 else f"warm {i}"
        if i == 0:
            _read(plan, root, fmt)  # the client's own set-up (cuDF's import) before idle
            idle = memory["idle_bytes"] = sampler.idle()
            memory["client_setup_bytes"] = _above(idle, memory.get("cluster_up_bytes"))
        run = one_run(client, plan, root, fmt, sampler, idle, kind, progress)
        result["runs"].append(run)
        if run["error"]:
            raise PhaseFailed(f"{kind} run, {run['error']}")
        run["released"] = _released(client)


__all__ = ["PHASES", "PhaseFailed", "all_runs", "one_run"]
