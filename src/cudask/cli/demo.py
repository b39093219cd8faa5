"""`cudask demo`: the main job — every GPU, a workload larger than device memory.

Covers: starting LocalCUDACluster on all GPUs with a device memory limit,
running a CuPy dask.array workload whose data outgrow that limit (so it
spills to host), with a progress bar, then printing per-GPU time and spill
figures and the dashboard address. Needs a GPU and CuPy; without them it says
so and exits 1; a bad flag is said first, with exit status 2. Does not cover: benchmarking (`cudask bench`). Threading: the
command's thread drives the cluster through a synchronous Client.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import click

from cudask.sizes import format_bytes, parse_size


def _worker_figures(dask_worker: Any) -> dict[str, Any]:
    metrics = getattr(dask_worker.data, "metrics", None)
    figures = dict(metrics()) if callable(metrics) else {}
    ctx = dask_worker.plugins.get("cudask-cuda-context")
    figures["gpu"] = getattr(ctx, "uuid", "?")
    figures["name"] = dask_worker.name
    figures["tasks"] = dask_worker.state.transition_counter
    return figures


def _rate(figures: dict[str, Any], direction: str) -> str:
    """Bytes per second of the copies' own time on their streams ("-" without copies)."""
    nbytes, seconds = figures.get(f"{direction}-bytes", 0), figures.get(f"{direction}-seconds", 0)
    return f"{nbytes / seconds / 1e9:.1f} GB/s" if nbytes and seconds else "-"


def _checksum(block: Any) -> Any:
    return block.sum(keepdims=True)


def _random_block(block_info: Any = None) -> Any:
    """One chunk of uniform [0, 1) values, generated on the GPU from its position."""
    import cupy

    info = block_info[None]
    seed = 1 + info["chunk-location"][0] * 100_003 + info["chunk-location"][1]
    return cupy.random.default_rng(seed).random(info["chunk-shape"], dtype="float64")


def _check_flags(
    device_memory_limit: str, size_factor: float, chunk: str, dashboard_address: str
) -> tuple[Any, int]:
    """The flags, checked before CuPy or a GPU is looked for (a bad one: exit status 2):
    the device limit as LocalCUDACluster takes it, and the chunk's bytes."""
    from cudask.deploy.check_network import check_dashboard_address
    from cudask.errors import OptionError
    from cudask.sizes import check_size

    if not (math.isfinite(size_factor) and size_factor > 0):
        raise click.BadParameter(
            f"--size {size_factor!r} is not accepted; accepted: a number "
            "above 0, e.g. 2 for twice the limit",
            param_hint="'--size'",
        )
    limit: Any = device_memory_limit
    try:
        limit = float(device_memory_limit)
    except ValueError:
        pass
    checks: list[tuple[str, Any]] = [
        ("--chunk", lambda: parse_size(chunk, total=None, name="--chunk")),
        ("--device-memory-limit", lambda: check_size(limit, name="--device-memory-limit")),
        (
            "--dashboard-address",
            lambda: check_dashboard_address("--dashboard-address", dashboard_address),
        ),
    ]
    results = {}
    for flag, check in checks:
        try:
            results[flag] = check()
        except OptionError as exc:
            raise click.BadParameter(str(exc), param_hint=f"'{flag}'") from None
    if not results["--chunk"]:
        raise click.BadParameter(
            f"--chunk {chunk} is no size; accepted: a size above 0 such as '256MiB'",
            param_hint="'--chunk'",
        )
    return limit, int(results["--chunk"])


@click.command("demo")
@click.option(
    "--device-memory-limit",
    default="0.1",
    show_default=True,
    help="Device memory each worker keeps before spilling (bytes, '4GB', or a fraction "
    "of the GPU).",
)
@click.option(
    "--size",
    "size_factor",
    default=2.0,
    show_default=True,
    type=float,
    help="Workload size as a multiple of the workers' total device memory limit.",
)
@click.option("--chunk", default="256MiB", show_default=True, help="Size of each CuPy chunk.")
@click.option("--dashboard-address", default=":8787", show_default=True)
def demo(device_memory_limit: str, size_factor: float, chunk: str, dashboard_address: str) -> None:
    """Run a CuPy workload larger than device memory on every GPU."""
    from cudask.options import require_library

    limit_value, chunk_bytes = _check_flags(
        device_memory_limit, size_factor, chunk, dashboard_address
    )
    require_library("cupy", "cudask demo")

    from distributed import Client

    from cudask import LocalCUDACluster
    from cudask.monitor.page import page_link

    started = time.perf_counter()
    with (
        LocalCUDACluster(
            device_memory_limit=limit_value,
            dashboard_address=dashboard_address,
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        startup = time.perf_counter() - started
        elapsed = _run_workload(cluster, size_factor, chunk_bytes)
        figures = client.run(_worker_figures)
    click.echo(f"\ncluster up in {startup:.2f} s; workload {elapsed:.2f} s")
    _print_figures(figures)
    click.echo(
        f"dashboard (while the cluster ran): {cluster.dashboard_link}, "
        f"GPU workers: {page_link(cluster.dashboard_link)}"
    )


def _run_workload(cluster: Any, size_factor: float, chunk_bytes: int) -> float:
    """Make, persist and sum `size_factor` times the workers' device limits of CuPy
    chunks, saying what it does; the workload's seconds."""
    import cupy
    import dask.array as da
    from distributed import progress

    from cudask.monitor.page import page_link

    limits = [
        s["options"]["data"][1].get("device_memory_limit")
        for s in cluster.worker_spec.values()
        if isinstance(s["options"]["data"], tuple)
    ]
    total_limit = sum(x or 0 for x in limits)
    n = len(cluster.worker_spec)
    target = int(total_limit * size_factor) if total_limit else 8 * n * chunk_bytes
    side = math.isqrt(chunk_bytes // 8)
    blocks = max(n, math.ceil(target / (side * side * 8)))
    rows = max(1, math.isqrt(blocks))
    cols = math.ceil(blocks / rows)
    click.echo(
        f"cudask demo: {n} GPU worker(s), device limit {format_bytes(total_limit // max(n, 1))}"
        f" each; dashboard {cluster.dashboard_link}"
    )
    click.echo(
        f"GPU workers live (device, host and disk tiers, spill rates): "
        f"{page_link(cluster.dashboard_link)}"
    )
    click.echo(
        f"workload: {rows}x{cols} CuPy chunks of {side}x{side} float64 = "
        f"{format_bytes(rows * cols * side * side * 8)} (x2 with its transpose sum)"
    )
    x = da.map_blocks(
        _random_block,
        dtype="float64",
        chunks=((side,) * rows, (side,) * cols),
        meta=cupy.empty((0, 0), dtype="float64"),
    )
    t0 = time.perf_counter()
    y = (x * 2 + 1).persist()
    progress(y)
    sums = y.map_blocks(_checksum, chunks=(1, 1)).sum().compute()
    elapsed = time.perf_counter() - t0
    click.echo(
        f"\nsum of all {y.size:,} values: {float(sums):.6e} (mean {float(sums) / y.size:.4f}, "
        "expected ~2.0)"
    )
    del y
    return elapsed


def _print_figures(figures: dict[str, dict[str, Any]]) -> None:
    """One line per worker: what it holds on each tier and how fast it moved data."""
    header = (
        f"{'worker':>6}  {'GPU':<40} {'on device':>10} {'on host':>10} {'on disk':>10} "
        f"{'spilled':>10} {'unspilled':>10} {'spill rate':>10} {'unspill':>10}"
    )
    click.echo(header)
    columns = (
        "device-bytes",
        "host-bytes",
        "disk-bytes",
        "spill-device-to-host-bytes",
        "unspill-host-to-device-bytes",
    )
    for f in sorted(figures.values(), key=lambda f: str(f["name"])):
        sizes = " ".join(f"{format_bytes(int(f.get(c, 0))):>10}" for c in columns)
        rates = " ".join(
            f"{_rate(f, direction):>10}"
            for direction in ("spill-device-to-host", "unspill-host-to-device")
        )
        click.echo(f"{f['name']!s:>6}  {f['gpu']:<40} {sizes} {rates}")
