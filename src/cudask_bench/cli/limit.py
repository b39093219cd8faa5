"""`cudask bench limit`: peak GPU memory against `device_memory_limit`, beside dask-cuda.

Covers: the command: its options, its checks in this order (the sizes, one GPU in
--gpu against this machine's GPUs, CuPy, dask-cuda when asked for), the plan it
builds (the GPU named by UUID for NVML), the lines it prints and the JSON file
(with provenance). Bad input ends in one line naming the value and what is
accepted. Does not cover: the measurements (cudask_bench.limit).
Threading: the command's thread.
"""

from __future__ import annotations

from typing import Any

import click

from cudask.errors import CudaskError, MissingDependencyError
from cudask_bench import environment
from cudask_bench.limit import LimitPlan, run_plan, summary
from cudask_bench.report import write_json


def _size(text: str, option: str, *, multiple: int = 1) -> int:
    from dask.utils import parse_bytes

    try:
        nbytes = int(parse_bytes(text))
    except (ValueError, TypeError):
        nbytes = 0
    if nbytes < multiple or nbytes % multiple:
        raise click.BadParameter(
            f"{text!r}; accepted: a size of at least {multiple} bytes"
            + (f", a multiple of {multiple}" if multiple > 1 else "")
            + ", e.g. '256MiB'",
            param_hint=option,
        )
    return nbytes


def _gpu_uuid(gpus: str) -> str:
    """The UUID of the one GPU `gpus` names (NVML's name for it)."""
    from cudask.devices import discover, parse_visible_devices, require_gpus
    from cudask.devices.discovery import check_visible_devices

    check_visible_devices(gpus)
    devices = parse_visible_devices(gpus, require_gpus(discover()))
    if len(devices) != 1:
        raise click.BadParameter(
            f"{gpus!r} names {len(devices)} GPUs; accepted: one GPU, e.g. '0'", param_hint="--gpu"
        )
    return devices[0].uuid


def _check_libraries(against: str | None, dask_cuda_python: str | None) -> None:
    if not environment.has_module("cupy"):
        raise MissingDependencyError(
            "cupy", "cudask bench limit", "pip install 'cudask[cuda]'  (cupy-cuda13x)"
        )
    if (
        against == "dask-cuda"
        and dask_cuda_python is None
        and not environment.has_module("dask_cuda")
    ):
        raise MissingDependencyError(
            "dask_cuda", "--against dask-cuda", "pip install dask-cuda, or --dask-cuda-python PATH"
        )


def plan_of(kw: dict[str, Any]) -> LimitPlan:
    """The plan the options describe (sizes checked; the GPU not yet)."""
    chunk = _size(kw["chunk_size"], "--chunk-size", multiple=8)
    data = _size(kw["data"], "--data", multiple=8)
    if data < chunk:
        raise click.BadParameter(
            f"{kw['data']!r} is less than one chunk "
            f"({kw['chunk_size']}); accepted: at least --chunk-size",
            param_hint="--data",
        )
    return LimitPlan(
        backends=("cudask", "dask-cuda") if kw["against"] else ("cudask",),
        rounds=kw["rounds"],
        gpu=kw["gpu"],
        device_memory_limit=_size(kw["device_memory_limit"], "--device-memory-limit"),
        chunks=data // chunk,
        chunk_size=chunk,
        temporary=_size(kw["temporary"], "--temporary", multiple=8),
        warm_runs=kw["warm_runs"],
        interval=kw["interval"],
        dask_cuda_python=kw["dask_cuda_python"],
        timeout=float(kw["timeout"]),
    )


@click.command("limit")
@click.option(
    "--gpu",
    default="0",
    show_default=True,
    help="The one GPU of the cluster (CUDA_VISIBLE_DEVICES: an index or UUID).",
)
@click.option(
    "--device-memory-limit",
    default="4GB",
    show_default=True,
    help="The worker's device memory limit.",
)
@click.option("--data", default="16GiB", show_default=True, help="Bytes of the persisted array.")
@click.option(
    "--chunk-size",
    default="256MiB",
    show_default=True,
    help="Bytes of each chunk (int64 elements); data / chunk-size tasks per phase.",
)
@click.option(
    "--temporary",
    default="1GiB",
    show_default=True,
    help="Bytes of the temporary each task of the last phase makes.",
)
@click.option(
    "--warm-runs",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runs after the cold one, in the same cluster.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rounds of every backend, each in a fresh process, the order rotated.",
)
@click.option(
    "--interval",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0.001),
    help="Seconds between NVML readings.",
)
@click.option(
    "--against",
    type=click.Choice(["dask-cuda"]),
    default=None,
    help="Run the same on dask-cuda's LocalCUDACluster beside cudask.",
)
@click.option(
    "--dask-cuda-python",
    default=None,
    metavar="PATH",
    help="The Python that runs dask-cuda's side (default: this one).",
)
@click.option(
    "--timeout",
    default=900,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds one backend's run may take.",
)
@click.option("--output", "-o", default=None, metavar="PATH", help="Write the results as JSON.")
def limit(**kw: Any) -> None:
    """How far above device_memory_limit a worker's GPU memory goes: a fresh
    one-worker cluster persists an array several times the limit, sums it, then
    runs a map_blocks whose tasks each make a large temporary, summed; NVML's used
    memory is sampled throughout. Reports per phase the seconds (cold, warm), the
    peak above the idle worker and the bound (the limit plus the running tasks'
    working set); results are checked."""
    try:
        plan = plan_of(kw)
        uuid = _gpu_uuid(plan.gpu)
        _check_libraries(kw["against"], plan.dask_cuda_python)
    except CudaskError as exc:
        raise click.ClickException(str(exc)) from None
    from dataclasses import replace

    report = run_plan(replace(plan, nvml_device=uuid))
    if kw["output"]:
        write_json(
            {
                "workload": "limit",
                "report": report,
                "machine": environment.machine(),
                "versions": environment.versions(),
            },
            kw["output"],
        )
    for line in summary(report):
        click.echo(line)
    if not report["correct"]:
        raise click.ClickException("a run failed or gave a wrong result: see above")


__all__ = ["limit", "plan_of"]
