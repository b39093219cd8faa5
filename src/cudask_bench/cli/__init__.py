"""`cudask bench`: the spill, cupy and startup benchmarks side by side with dask-cuda,
the soak, device transfers between workers, dask-cuDF ETL, and charts of results.

Covers: the `bench` click group and its commands `spill`, `cupy`, `startup` (one module,
cudask_bench.cli.workloads), `soak`, `transfer` and `chart`, whose options are declared
as data per command family (cudask_bench.cli.workload_options, soak_options,
transfer_options, chart_options; cudask_bench.cli.options turns them into click's), and
`small-tasks`, `etl` and `limit` (their options in their own modules). Bad input ends in
one line naming the value and what is accepted, never a traceback. cudask's `cudask` command attaches this group by
name (cudask.cli.commands), importing it only when `cudask bench ...` runs. Does not cover:
the benchmarks themselves (cudask_bench.*). Threading: click runs a command in the
calling thread.
"""

from __future__ import annotations

import click

from cudask.cli.user_errors import UserErrorGroup
from cudask_bench.cli.chart import chart
from cudask_bench.cli.etl import etl
from cudask_bench.cli.limit import limit
from cudask_bench.cli.small_tasks import small_tasks
from cudask_bench.cli.soak import soak
from cudask_bench.cli.transfer import transfer
from cudask_bench.cli.workloads import cupy, spill, startup


@click.group(cls=UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Benchmarks: spilling, CuPy dask.array workloads, cluster start-up, soak,
    device data between workers (transfer).

    Each variant (backend x device limit x JIT-unspill) runs in a fresh
    process; --against dask-cuda runs the same workload with identical
    parameters on dask_cuda.LocalCUDACluster, from this or another Python
    environment, and reports cudask / dask-cuda ratios measured in the same run.

    Without a GPU, `cudask bench spill --backend dict --array-module numpy` checks
    the harness on host memory in under a minute.
    """


for _command in (spill, cupy, startup, soak, transfer, chart, small_tasks, etl, limit):
    bench.add_command(_command)


__all__ = ["bench"]
