"""`cudask bench etl`: dask-cuDF ETL beyond device memory, six settings side by side.

Covers: the command: its options, its checks in this order (settings, formats, the
libraries of the frames asked for, a GPU and --device, the device limit, the data against
3x the limit, the free disk for the data, the dask-cuda environment: its settings are
skipped when dask_cuda is not found and none was named in --settings), the plan, the
table it prints last and the JSON file (with provenance). Exit status 1 when a setting
failed or answered wrong (after the table), 130/143 when interrupted (its processes
stopped and its data removed). Does not cover: the runs (cudask_bench.etl).
Threading: the command's thread.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from typing import Any

import click
import dask
from dask.utils import format_bytes

from cudask.errors import MissingDependencyError, NoGPUError, OptionError
from cudask.sizes import parse_size
from cudask_bench import environment, harness, stopping, targets
from cudask_bench.cli.plan import command, given
from cudask_bench.etl import failures, run_etl, summary
from cudask_bench.etl_data import FACT_ROW_BYTES, FORMATS, FRAMES, SETTINGS, EtlPlan, setting_named
from cudask_bench.report import write_json

#: Bytes one row takes on disk, roughly, to check the free space before writing.
DISK_ROW_BYTES = {"csv": 56, "parquet": 30}
#: The data must be at least this many times the device limit.
OVER_LIMIT = 3


def _listed(text: str, accepted: tuple[str, ...], flag: str, example: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not chosen or any(p not in accepted for p in chosen):
        raise click.BadParameter(
            f"{text!r}; accepted: {', '.join(accepted)}, comma-separated, e.g. {example!r}",
            param_hint=flag,
        )
    return chosen


def _settings(text: str) -> tuple[str, ...]:
    """--settings: names of SETTINGS, or cudask settings with config values of their own,
    each checked (the cudask.memory.* values parsed, the worker's options resolved)
    before anything starts."""
    from cudask.memory.settings import check_memory_config
    from cudask.options import resolve

    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not chosen:
        raise click.BadParameter(
            f"{text!r}; accepted: {', '.join(SETTINGS)}, comma-separated, "
            "e.g. 'floor,cudask,cudask-jit'",
            param_hint="--settings",
        )
    for name in chosen:
        try:
            with dask.config.set(setting_named(name).dask_config()):
                check_memory_config()
                resolve({}, "cluster", libraries=False)
        except (ValueError, OptionError) as exc:
            said = str(exc) if repr(name) in str(exc) else f"{name!r}: {exc}"  # which setting
            raise click.BadParameter(said, param_hint="--settings") from None
    return chosen


class _Saver:
    """Writes the results so far to `output`; a failed write is said once on stderr and
    the run goes on (its results are written at the end, or shown). `written`: whether a
    write succeeded."""

    def __init__(self, output: str) -> None:
        self.output, self.written, self._said = output, False, False

    def __call__(self, partial: dict[str, Any]) -> None:
        try:
            write_json(partial, self.output)
            self.written = True
        except OSError as exc:
            if not self._said:
                self._said = True
                click.echo(
                    f"cudask bench etl: could not write the results so far to "
                    f"--output {self.output!r}: {exc}; going on",
                    err=True,
                )


def _gpu_total(frames: str, device: str) -> int | None:
    if frames != "cudf":
        return None
    gpus = environment.gpus()
    if not gpus.get("available"):
        raise NoGPUError(
            f"cudask bench etl needs an NVIDIA GPU for cuDF frames and NVML finds "
            f"none ({gpus.get('reason')}); to check the harness on host memory: "
            "cudask bench etl --frames pandas --files 3 --rows-per-file 100000 "
            "--device-memory-limit 1MB --settings floor,cudask"
        )
    total = environment.device_total(gpus, device)
    if total is None:
        known = ", ".join(str(d["index"]) for d in gpus["devices"])
        raise OptionError(
            f"--device={device!r} names no GPU; accepted: an index ({known}) or a GPU UUID"
        )
    return total


def _check_libraries(frames: str) -> None:
    if not environment.has_module("pyarrow"):
        raise MissingDependencyError("pyarrow", "cudask bench etl", "pip install pyarrow")
    if frames == "cudf" and not environment.has_module("dask_cudf"):
        raise MissingDependencyError(
            "dask_cudf",
            "cudask bench etl (cuDF frames)",
            "pip install dask-cudf-cu13  (or --frames pandas to check the harness on host memory)",
        )


def _check_sizes(plan: EtlPlan) -> None:
    if plan.device_bytes < OVER_LIMIT * plan.device_memory_limit:
        need = -(-OVER_LIMIT * plan.device_memory_limit // (plan.rows_per_file * FACT_ROW_BYTES))
        raise OptionError(
            f"--files {plan.files} x --rows-per-file {plan.rows_per_file:,} make "
            f"{format_bytes(plan.device_bytes)} on the device, less than {OVER_LIMIT}x "
            f"--device-memory-limit ({format_bytes(plan.device_memory_limit)}); accepted: at "
            f"least {format_bytes(OVER_LIMIT * plan.device_memory_limit)}, e.g. --files {need}"
        )


def _check_disk(plan: EtlPlan) -> None:
    where = plan.data_dir or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(where).free
    except OSError as exc:
        raise OptionError(
            f"--data-dir={where!r} cannot be used ({exc}); give an existing folder"
        ) from None
    need = int(plan.rows * sum(DISK_ROW_BYTES[f] for f in plan.formats) * 1.1)
    if free < need:
        raise OptionError(
            f"--data-dir={where!r} has {free / 1e9:.1f} GB free and the data need "
            f"about {need / 1e9:.1f} GB; give --data-dir on a larger disk, fewer "
            "--files or one --format"
        )


def resolve_targets(
    kw: dict[str, Any], plan: EtlPlan, asked: bool
) -> tuple[EtlPlan, dict[str, Any]]:
    """Where each backend runs; dask-cuda's settings skipped (recorded) when it is not
    found and --settings did not name them."""
    found: dict[str, Any] = {"cudask": targets.Target(sys.executable)}
    wanted = [s for s in plan.settings if setting_named(s).backend == "dask-cuda"]
    if not wanted:
        return plan, found
    try:
        found["dask-cuda"] = targets.resolve_dask_cuda(
            kw["dask_cuda_python"],
            kw["dask_cuda_path"],
            jit_unspill=False,
            array_module="cupy" if plan.frames == "cudf" else "numpy",
        )
    except MissingDependencyError as exc:
        if asked or kw["dask_cuda_python"] or kw["dask_cuda_path"]:
            raise
        why = f"dask_cuda is not found ({exc.needed_for}); give --dask-cuda-path DIR"
        plan = dataclasses.replace(
            plan,
            settings=tuple(s for s in plan.settings if s not in wanted),
            skipped={s: why for s in wanted},
        )
    return plan, found


def _limit(text: str, total: int | None) -> int:
    limit = parse_size(text, total=total, name="--device-memory-limit", maximum=total)
    if not limit:
        raise OptionError(
            f"--device-memory-limit={text!r}; accepted: a size such as '1.6GB' or a "
            "fraction of the GPU such as 0.02 (the floor setting runs without one)"
        )
    return limit


@click.command("etl")
@click.option(
    "--settings",
    default=",".join(SETTINGS),
    show_default=True,
    help="The settings compared, comma-separated: floor (cudask, no device limit), "
    "dask-cuda (its default spilling), dask-cuda-cudf-spill (enable_cudf_spill), "
    "cudask (its store), cudask-jit (jit_unspill), cudask-cudf-spill "
    "(enable_cudf_spill); a cudask one may carry values of its own for cudask.memory and "
    "cudask.worker.rmm-* keys, '@'-separated: cudask@memory.pinned-pool-size=16GiB, "
    "floor@worker.rmm-async=true. dask-cuda's run only where "
    "dask_cuda is found, unless named.",
)
@click.option(
    "--format",
    "formats",
    default="csv,parquet",
    show_default=True,
    help="File formats read, comma-separated: csv (read_csv), parquet (read_parquet).",
)
@click.option(
    "--device-memory-limit",
    default="1.6GB",
    show_default=True,
    help="Device limit of every setting but the floor (bytes or a fraction of the GPU).",
)
@click.option(
    "--files",
    default=24,
    show_default=True,
    type=click.IntRange(min=1),
    help="Fact files (each its partitions).",
)
@click.option(
    "--rows-per-file",
    default=8_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help=f"Rows of each fact file ({FACT_ROW_BYTES} bytes on the device each).",
)
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Repetitions: each a fresh process and cluster per setting and format, the "
    "settings' order rotated by one each time.",
)
@click.option(
    "--warm-runs",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Runs after the cold one in the same cluster (the warm figures).",
)
@click.option(
    "--timeout",
    default=900,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds one child process (the data, or a setting on a format) may take.",
)
@click.option(
    "--fuse/--no-fuse",
    default=False,
    show_default=True,
    help="Compute each phase's collection.optimize(): dask-expr fuses blockwise "
    "steps into one task per partition. Without it, what compute submits: "
    "Client.compute does not fuse (dask/distributed#8833), so the worker stores "
    "every intermediate.",
)
@click.option("--device", default="0", show_default=True, help="The GPU: an index or a UUID.")
@click.option(
    "--memory-limit", default="auto", show_default=True, help="Host memory limit of the worker."
)
@click.option(
    "--frames",
    type=click.Choice(list(FRAMES)),
    default="cudf",
    show_default=True,
    help="pandas: host frames on distributed's LocalCluster in place of every "
    "setting's cluster, a check of the harness without a GPU (not a benchmark).",
)
@click.option(
    "--data-dir",
    default=None,
    metavar="DIR",
    help="Where the temporary data folder is made (default: the temporary folder).",
)
@click.option(
    "--dask-cuda-path",
    default=None,
    metavar="DIR",
    help="Directory with dask-cuda installed (pip install --target), put on the "
    "dask-cuda children's PYTHONPATH.",
)
@click.option(
    "--dask-cuda-python",
    default=None,
    metavar="PATH",
    help="Python interpreter where dask-cuda is installed (default: this one).",
)
@click.option(
    "--progress/--no-progress",
    default=False,
    show_default=True,
    help="Show a progress line on stderr.",
)
@click.option(
    "--output",
    "-o",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the results as JSON, with their provenance; also after each child, "
    'status "partial", so an interrupted run keeps what finished.',
)
@command
def etl(ctx: click.Context, kw: dict[str, Any]) -> None:
    """dask-cuDF ETL on files beyond the device limit: read (CSV, Parquet) and persist,
    groupby-sum/count on the key, merge with a dimension table then groupby-sum,
    column means; timed from the first submit in a fresh cluster (cold), then
    --warm-runs more, with seconds and peak device memory per phase, each setting in a
    process of its own, the answers checked against pandas."""
    settings = _settings(kw["settings"])
    formats = _listed(kw["formats"], FORMATS, "--format", "parquet")
    _check_libraries(kw["frames"])
    total = _gpu_total(kw["frames"], kw["device"])
    plan = EtlPlan(
        settings=settings,
        formats=formats,
        files=kw["files"],
        rows_per_file=kw["rows_per_file"],
        device_memory_limit=_limit(kw["device_memory_limit"], total),
        device=kw["device"],
        memory_limit=kw["memory_limit"],
        repeat=kw["repeat"],
        warm_runs=kw["warm_runs"],
        timeout=float(kw["timeout"]),
        frames=kw["frames"],
        data_dir=kw["data_dir"],
        fuse=kw["fuse"],
    )
    _check_sizes(plan)
    _check_disk(plan)
    plan, found = resolve_targets(kw, plan, asked=given(ctx, "settings"))
    output = kw["output"]
    saver = _Saver(output) if output else None
    try:
        doc = run_etl(
            plan, found, harness.ProgressLine(kw["progress"]), argv=sys.argv, checkpoint=saver
        )
    except stopping.Interrupted:
        if saver is not None and saver.written:
            click.echo(
                f"cudask bench etl: the results so far (status partial) are in {output}", err=True
            )
        raise
    if output:
        with stopping.deferred():  # the whole document, not the last partial one
            write_json(doc, output)
        click.echo(f"results: {output}")
    for line in summary(doc):
        click.echo(line)
    bad = failures(doc)
    if bad:
        raise click.ClickException(
            f"{len(bad)} failed or answered wrong: " + "; ".join(line[:160] for line in bad)
        )


__all__ = ["etl", "resolve_targets"]
