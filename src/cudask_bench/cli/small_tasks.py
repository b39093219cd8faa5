"""`cudask bench small-tasks`: thousands of tiny tasks and many small CuPy chunks with
1, 2 and 4 workers per GPU.

Covers: the command: its options, its checks in this order (the settings, the sizes,
a GPU and --gpus against this machine's GPUs, CuPy), the plan it builds, the lines it
prints and the JSON file. Bad input ends in one line naming the value and what is
accepted. Does not cover: the measurements (cudask_bench.small_tasks).
Threading: the command's thread.
"""

from __future__ import annotations

from typing import Any

import click

from cudask.errors import CudaskError, MissingDependencyError
from cudask_bench import environment
from cudask_bench.report import write_json
from cudask_bench.small_tasks import SmallTasksPlan, run_plan, summary


def _settings(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if (
        not parts
        or any(not (p.isascii() and p.isdigit()) or int(p) < 1 for p in parts)
        or len(set(parts)) < len(parts)
    ):
        raise click.BadParameter(
            f"{text!r}; accepted: distinct whole numbers of at least 1, "
            "comma-separated, e.g. '1,2,4'",
            param_hint="--workers-per-gpu",
        )
    return tuple(int(p) for p in parts)


def _chunk_size(text: str) -> int:
    from dask.utils import parse_bytes

    try:
        nbytes = parse_bytes(text)
    except (ValueError, TypeError):
        nbytes = 0
    if nbytes < 8 or nbytes % 8:
        raise click.BadParameter(
            f"{text!r}; accepted: a size of at least 8 bytes, a multiple "
            "of 8 (int64 elements), e.g. '1MiB'",
            param_hint="--chunk-size",
        )
    return nbytes


def _check_gpus(gpus: str) -> None:
    from cudask.devices import discover, parse_visible_devices, require_gpus
    from cudask.devices.discovery import check_visible_devices

    check_visible_devices(gpus)
    parse_visible_devices(gpus, require_gpus(discover()))
    if not environment.has_module("cupy"):
        raise MissingDependencyError(
            "cupy", "cudask bench small-tasks", "pip install 'cudask[cuda]'  (cupy-cuda13x)"
        )


@click.command("small-tasks")
@click.option(
    "--workers-per-gpu",
    "settings",
    default="1,2,4",
    show_default=True,
    help="The settings compared: workers on each GPU, comma-separated.",
)
@click.option(
    "--gpus",
    default="0",
    show_default=True,
    help="The cluster's CUDA_VISIBLE_DEVICES (indices or UUIDs).",
)
@click.option(
    "--tasks",
    default=5000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tiny independent tasks of the first workload.",
)
@click.option(
    "--chunks",
    default=2000,
    show_default=True,
    type=click.IntRange(min=2),
    help="Chunks of the CuPy array of the second workload.",
)
@click.option(
    "--chunk-size", default="1MiB", show_default=True, help="Bytes of each chunk (int64 elements)."
)
@click.option(
    "--repeat",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Warm runs of each workload after the cold one, in the same cluster.",
)
@click.option(
    "--threads-per-worker",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Threads of each worker.",
)
@click.option(
    "--device-memory-limit",
    default=None,
    help="The GPU's device memory limit (shared by its workers); default: cudask's.",
)
@click.option(
    "--timeout",
    default=1800,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds one setting may take.",
)
@click.option("--output", "-o", default=None, metavar="PATH", help="Write the results as JSON.")
def small_tasks(**kw: Any) -> None:
    """Small-task throughput with several workers per GPU: thousands of tiny tasks,
    then a CuPy array of many small chunks (elementwise, reductions, neighbours'
    edges), each setting in a fresh cluster of its own process; the results must be
    identical in every setting. Reports cold and warm seconds, tasks per second and
    the speed-up over the first setting."""
    try:
        plan = SmallTasksPlan(
            settings=_settings(kw["settings"]),
            gpus=kw["gpus"],
            tasks=kw["tasks"],
            chunks=kw["chunks"],
            chunk_size=_chunk_size(kw["chunk_size"]),
            repeat=kw["repeat"],
            threads_per_worker=kw["threads_per_worker"],
            device_memory_limit=kw["device_memory_limit"],
            timeout=float(kw["timeout"]),
        )
        _check_gpus(plan.gpus)
    except CudaskError as exc:
        raise click.ClickException(str(exc)) from None
    report = run_plan(plan, progress=lambda line: click.echo(line, err=True))
    if kw["output"]:
        write_json(
            {
                "workload": "small-tasks",
                "report": report,
                "machine": environment.machine(),
                "versions": environment.versions(),
            },
            kw["output"],
        )
    for line in summary(report):
        click.echo(line)
    if not report["identical"]:
        raise click.ClickException("the settings' results differ (or a setting failed): see above")


__all__ = ["small_tasks"]
