"""`cudask bench spill`, `cudask bench cupy` and `cudask bench startup`.

Covers: the three timed commands: their own checks (spill sizes, cupy operations and
shapes) and the harness plan each builds from its options (cudask_bench.cli.plan);
every variant then runs in its own process, and the command prints a table and writes
JSON and a PNG chart when asked. Does not cover: the options
(cudask_bench.cli.workload_options), the workloads themselves (cudask_bench.workloads).
Threading: the command's thread.
"""

from __future__ import annotations

from typing import Any

import click

from cudask.errors import OptionError
from cudask_bench import spec
from cudask_bench.cli.options import with_options
from cudask_bench.cli.plan import (
    build_plan,
    command,
    cpu_defaults,
    mode_settings,
    run_plan,
    size,
    workload_size,
)
from cudask_bench.cli.workload_options import COMMAND_DEFAULTS, COMMON, CUPY, MODE, SPILL


@click.command("spill")
@with_options(COMMON + SPILL + MODE, COMMAND_DEFAULTS["spill"])
@command
def spill(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Create device chunks beyond the device limit, read all back and verify every
    value, then read all back again and sum each chunk.

    Chunk i holds uint64 values base_i + j; reading back compares every
    element on the device against that formula, and each sum against its
    closed form. Reports seconds and GB/s; first, the disk the workers spill
    to (--disk-size), and per pass the worker's disk I/O beside it.

    \b
    --mode cold (default): every measured repetition is a fresh process
    with a fresh one-worker cluster, the configurations taking turns.
      create, read_verify, read_sum: the first run, timed from the first submit
      create_warm, read_verify_warm, read_sum_warm: the --warm-runs runs after
        it, in the same cluster
    --mode warm: --warmup, then --repeat runs in one cluster (steady state).
      create_warm, read_verify_warm, read_sum_warm
    """
    cpu_defaults(ctx, kw, "spill")
    modes = mode_settings(ctx, kw, "spill")
    total, chunk = spec.check_spill_sizes(
        workload_size(kw["total"], "--total", "16GiB"),
        workload_size(kw["chunk_size"], "--chunk-size", "256MiB"),
    )
    # the disk is measured where data go to it: a host limit given (the default "auto" is the
    # worker's share of the host, which 16 GiB of chunks rarely fills)
    spills_to_disk = str(kw["memory_limit"]).strip().lower() != "auto"
    default = spec.DISK_SIZE[kw["array_module"]] if spills_to_disk else "0"
    disk_size = size(kw["disk_size"] or default, "--disk-size") or 0
    plan = build_plan(
        "spill",
        ctx,
        kw,
        {"total": total, "chunk_size": chunk, **modes},
        {
            "total": total,
            "chunk_size": chunk,
            "chunks": total // chunk,
            "disk_size": disk_size,
            **modes,
        },
    )
    plan.disk_size = disk_size
    run_plan(plan, kw)


@click.command("cupy")
@with_options(COMMON + CUPY + MODE, COMMAND_DEFAULTS["cupy"])
@command
def cupy(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Time dask.array CuPy operations on persisted random input.

    \b
    transpose_sum: (x + x.T).sum()
    dot: x.dot(y), result persisted
    svd: da.linalg.svd(x) of a tall-skinny (size, second) array
    sum: x.sum()
    mean: x.mean()
    slice: x[::3, ::2], strided views persisted
    map_overlap: 5-point stencil through x.map_overlap(depth=1, boundary='reflect')

    \b
    --mode cold (default): every measured repetition is a fresh process,
    the configurations taking turns, and each operation gets a fresh
    one-worker cluster in it.
      OP_input: creating and persisting the random input, timed from the
        first submit (where the input exceeds the device limit, it spills here)
      OP: the operation on that input, its first run in the cluster
      OP_total: OP_input + OP, the time from the first submit to the result
      OP_warm: the --warm-runs runs after it, on the same input
    --mode warm: --warmup, then --repeat runs of each operation on input
    persisted beforehand, in one cluster (steady state).
      OP_warm

    Each result is checked once after the timed runs (not timed).
    """
    cpu_defaults(ctx, kw, "cupy")
    modes = mode_settings(ctx, kw, "cupy")
    operations = spec.check_operations(kw["operations"])
    shapes = {
        op: spec.operation_shape(op, kw["size"], kw["array_chunk"], kw["second_size"])
        for op in operations
    }
    svd = shapes.get("svd")
    if svd is not None and (svd["second"] or 0) > (svd["chunk"] or 0):
        raise OptionError(
            f"svd: --second-size={svd['second']} is larger than the row chunk {svd['chunk']}; "
            "a tall-skinny SVD needs chunks with at least as many rows as columns"
        )
    runner = {
        "operations": operations,
        "size": kw["size"],
        "array_chunk": kw["array_chunk"],
        "second_size": kw["second_size"],
        **modes,
    }
    plan = build_plan(
        "cupy", ctx, kw, runner, {"operations": operations, "shapes": shapes, **modes}
    )
    run_plan(plan, kw)


@click.command("startup")
@with_options(COMMON, COMMAND_DEFAULTS["startup"])
@command
def startup(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Time until a fresh 1-GPU cluster answers a task round trip (a new process each time).

    startup = importing the backend's cluster class + constructing the cluster
    + connecting a client and running one task. The device limit defaults to
    each backend's own default.
    """
    cpu_defaults(ctx, kw, "startup")
    plan = build_plan("startup", ctx, kw, {}, {})
    run_plan(plan, kw)


__all__ = ["cupy", "spill", "startup"]
