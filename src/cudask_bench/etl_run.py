"""The ETL runner: one setting, one file format, a fresh cluster, one JSON result
(`python -m cudask_bench.etl_run --plan JSON --root DIR --setting NAME --format FMT
--json PATH`).

Covers: a one-worker cluster for the setting (cudask's or dask-cuda's LocalCUDACluster
with the plan's device limit, none for `floor`, JIT-unspill or cuDF spilling; with
pandas frames distributed's LocalCluster stands in for every setting: a harness check),
then the work, timed from the first submit, cold and `warm_runs` more times in the same
cluster (all released between runs): load (read_csv or read_parquet of the fact files
and the dimension table, persisted), groupby (on the key), merge (with the dimension
table, then per category) and mean (every column). Answers reach this process as pandas
objects, converted on the worker (no CUDA context here for them). Per phase: seconds,
peak of NVML's used memory (`MemorySampler`, every 20 ms) above the idle cluster, what
the store moved (its counters, read with the clock stopped) and, from the task stream,
the seconds the worker computed and its event loop read inputs from the store and wrote
outputs to it, and the largest working set of a task: as the worker sized its inputs and
output, and with what NVML's samples (stamped in both clocks) saw it add while it
computed (cudask_bench.working_set). A failure (OOM, lost worker, crash) ends the runs
as the result's error.

Honesty: for dask-cuda settings no cudask cluster code is loaded here or on the worker
(cudask_bench.run.check_honesty). Does not cover: the files and their answers
(cudask_bench.etl_data), comparing settings (cudask_bench.etl). Threading: the main
thread, and the sampler's daemon thread, which only appends samples under its lock.
Light at import: worker processes re-import the main module.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from cudask_bench import environment, stopping, working_set
from cudask_bench.counters import difference, stream_figures
from cudask_bench.etl_data import (
    DIM_DTYPES,
    FACT_DTYPES,
    EtlPlan,
    Setting,
    category_answer,
    dim_file,
    fact_files,
    sample_answer,
    sample_keys,
    setting_named,
)

PHASES: tuple[str, ...] = ("load", "groupby", "merge", "mean")
#: Seconds between two NVML samples.
SAMPLE_INTERVAL = 0.02


class PhaseFailed(RuntimeError):
    """A phase of a run raised; the message names the phase and the error."""


class MemorySampler:
    """NVML's used memory of one GPU (or what `read` returns), sampled every `interval`
    seconds in a daemon thread and on `mark`; no GPU (`device` None, or no NVML) reads
    None."""

    def __init__(
        self,
        device: str | None,
        interval: float = SAMPLE_INTERVAL,
        read: Callable[[], int] | None = None,
    ) -> None:
        self.interval = interval
        self.reason: str | None = None
        self._read: Callable[[], int] | None = read
        self._samples: list[tuple[float, float, int]] = []  # (perf_counter, epoch, bytes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if read is not None:
            return
        if device is None:
            self.reason = "no GPU (pandas frames)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = (
                pynvml.nvmlDeviceGetHandleByUUID(device)
                if device.startswith(("GPU-", "MIG-"))
                else pynvml.nvmlDeviceGetHandleByIndex(int(device))
            )
            self._read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            self._read()
        except Exception as exc:  # noqa: BLE001 - no NVML here: figures without memory
            self._read, self.reason = None, f"NVML: {type(exc).__name__}: {exc}"

    def mark(self) -> int | None:
        """Read now, keep the sample, return it."""
        if self._read is None:
            return None
        before, epoch = time.perf_counter(), time.time()
        value = self._read()
        middle = (time.perf_counter() - before) / 2  # stamped halfway through the read
        with self._lock:
            self._samples.append((before + middle, epoch + middle, value))
        return value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.mark()

    def start(self) -> None:
        if self._read is not None and self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name="cudask-bench-nvml-sampler"
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def idle(self, count: int = 5) -> int | None:
        """The median of `count` reads `interval` apart."""
        values = []
        for _ in range(count):
            values.append(self.mark())
            time.sleep(self.interval)
        known = [v for v in values if v is not None]
        return int(statistics.median(known)) if known else None

    def peak(self, start: float, end: float) -> int | None:
        """The largest sample taken from `start` to `end` (perf_counter seconds)."""
        with self._lock:
            inside = [v for t, _, v in self._samples if start <= t <= end]
        return max(inside) if inside else None

    def by_epoch(self) -> list[tuple[float, int]]:
        """Every sample so far as (epoch seconds, bytes): the clock of the task stream."""
        with self._lock:
            return [(epoch, v) for _, epoch, v in self._samples]


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


def _ping() -> int:
    return os.getpid()


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


def cluster_kwargs(setting: Setting, plan: EtlPlan, local_directory: str) -> dict[str, Any]:
    """The one-worker cluster of `setting`, spelled as each cluster class takes it."""
    kwargs: dict[str, Any] = {
        "n_workers": 1,
        "threads_per_worker": 1,
        "memory_limit": plan.memory_limit,
        "protocol": "tcp",
        "dashboard_address": None,
        "silence_logs": logging.ERROR,
        "local_directory": local_directory,
    }
    if plan.frames == "pandas":
        return {**kwargs, "processes": True}
    kwargs["CUDA_VISIBLE_DEVICES"] = plan.device
    kwargs["device_memory_limit"] = plan.device_memory_limit if setting.limited else 0
    if setting.jit_unspill:
        kwargs["jit_unspill"] = True
    if setting.cudf_spill:
        kwargs["enable_cudf_spill"] = True
    return kwargs


def _cluster_class(setting: Setting, plan: EtlPlan) -> tuple[Any, dict[str, Any]]:
    if plan.frames == "pandas":
        from distributed import LocalCluster

        return LocalCluster, {"class": "distributed.LocalCluster", "stand_in": True}
    from cudask_bench.run import load_backend

    return load_backend(setting.backend, False)


def _config_values(keys: list[str]) -> dict[str, Any]:
    """On a worker: its values of these dask config keys."""
    import dask

    return {key: dask.config.get(key, None) for key in keys}


def execute(
    plan: EtlPlan,
    root: str,
    setting: Setting,
    fmt: str,
    result: dict[str, Any],
    progress: Callable[[str], None],
) -> None:
    """Run the setting on the `fmt` files into `result` (a failure keeps what ran)."""
    from distributed import Client

    from cudask_bench import tasks

    sampler = MemorySampler(plan.device if plan.frames == "cudf" else None)
    memory: dict[str, Any] = {
        "nvml": sampler.reason or f"sampled every {sampler.interval * 1000:.0f} ms",
        "before_cluster_bytes": sampler.mark(),
    }
    result["memory"] = memory
    cluster_class, facts = _cluster_class(setting, plan)
    sampler.start()
    try:
        with tempfile.TemporaryDirectory(prefix="cudask-bench-etl-") as local:
            kwargs = cluster_kwargs(setting, plan, local)
            result["cluster"] = {
                **facts,
                "kwargs": {
                    k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                    for k, v in kwargs.items()
                },
            }
            cluster = None
            try:
                with stopping.deferred():  # SIGTERM waits until the cluster is there to close
                    cluster = cluster_class(**kwargs)
                with Client(cluster) as client:
                    client.wait_for_workers(1)
                    client.submit(_ping, pure=False).result()
                    client.get_task_stream(count=1)  # the scheduler records from now on
                    client.register_plugin(working_set.WorkingSets())
                    if setting.config:  # what the worker runs with, not only this process
                        result["worker_config"] = next(
                            iter(client.run(_config_values, list(setting.dask_config())).values())
                        )
                    memory["cluster_up_bytes"] = sampler.idle()
                    progress("cluster up")
                    _runs(client, plan, root, fmt, sampler, memory, result, progress)
                    result["store"] = next(iter(client.run(tasks.store_facts).values()), {})
                    result["worker_versions"] = next(
                        iter(client.run(environment.versions).values())
                    )
            finally:
                if cluster is not None:
                    cluster.close()
    finally:
        sampler.stop()


def _runs(
    client: Any,
    plan: EtlPlan,
    root: str,
    fmt: str,
    sampler: MemorySampler,
    memory: dict[str, Any],
    result: dict[str, Any],
    progress: Callable[[str], None],
) -> None:
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


def _setting(name: str) -> Setting:
    try:
        return setting_named(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    from cudask_bench.run import Progress, check_honesty

    p = argparse.ArgumentParser(
        prog="python -m cudask_bench.etl_run",
        description="Run one setting of `cudask bench etl` on one "
        "format and write a JSON result. Normally started by "
        "`cudask bench etl`.",
    )
    p.add_argument("--plan", required=True, help="the EtlPlan as JSON")
    p.add_argument("--root", required=True, help="the data directory (cudask_bench.etl_data)")
    p.add_argument(
        "--setting",
        required=True,
        type=_setting,
        help="a setting of cudask_bench.etl_data (setting_named)",
    )
    p.add_argument("--format", required=True, choices=["csv", "parquet"])
    p.add_argument("--json", required=True, help="where to write the result")
    args = p.parse_args(argv)
    stopping.runner_lifeline()
    plan, setting = EtlPlan.from_json(args.plan), args.setting
    result: dict[str, Any] = {
        "setting": setting.name,
        "format": args.format,
        "backend": setting.backend,
        "frames": plan.frames,
        "pid": os.getpid(),
        "python": sys.executable,
        "status": "ok",
        "error": None,
        "runs": [],
    }
    code = 0
    try:
        try:
            import dask

            with dask.config.set(setting.dask_config()):  # the setting's own cudask.* values
                result["config"] = _config_values(list(setting.dask_config()))
                execute(
                    plan,
                    args.root,
                    setting,
                    args.format,
                    result,
                    Progress(1 + len(PHASES) * (1 + plan.warm_runs)),
                )
        finally:
            check_honesty(setting.backend if plan.frames == "cudf" else "local", result)
    except stopping.Interrupted as exc:
        result.update(status="failed", error=f"stopped by {exc.name}")
        code = exc.exit_code
    except Exception as exc:  # noqa: BLE001 - a crash or OOM is the setting's result
        error = str(exc) if isinstance(exc, PhaseFailed) else f"{type(exc).__name__}: {exc}"
        result.update(status="failed", error=error, traceback=traceback.format_exc())
        code = 1
    return environment.end_runner(result, args.json, code, "cudask bench etl runner")


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["PHASES", "MemorySampler", "PhaseFailed", "cluster_kwargs", "execute", "main", "one_run"]
