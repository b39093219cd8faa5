"""The ETL runner: one setting, one file format, a fresh cluster, one JSON result
(`python -m cudask_bench.etl_run --plan JSON --root DIR --setting NAME --format FMT
--json PATH`).

Covers: the command line; the setting's dask config, here and as the worker reads it; a
one-worker cluster (`cluster_kwargs`: cudask's or dask-cuda's LocalCUDACluster with the
plan's device limit, none for `floor`, JIT-unspill or cuDF spilling; with pandas frames
distributed's LocalCluster stands in: a harness check); the store's facts and the
worker's versions after the runs; a failure (OOM, lost worker, crash, a stop signal) as
the result's error. For dask-cuda settings no cudask cluster code is loaded here or on
the worker (cudask_bench.run.check_honesty). Does not cover: the runs
(cudask_bench.etl_phases), the files (cudask_bench.etl_data), comparing settings
(cudask_bench.etl). Threading: the main thread, and the sampler's daemon thread. Light
at import: worker processes re-import the main module.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from cudask_bench import environment, stopping, working_set
from cudask_bench.etl_data import EtlPlan, Setting, setting_named
from cudask_bench.etl_phases import PHASES, PhaseFailed, all_runs
from cudask_bench.etl_sampler import MemorySampler


def _ping() -> int:
    return os.getpid()


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
                    all_runs(client, plan, root, fmt, sampler, memory, result, progress)
                    result["store"] = next(iter(client.run(tasks.store_facts).values()), {})
                    result["worker_versions"] = next(
                        iter(client.run(environment.versions).values())
                    )
            finally:
                if cluster is not None:
                    cluster.close()
    finally:
        sampler.stop()


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


__all__ = ["cluster_kwargs", "execute", "main"]
