"""From the options of `cudask bench spill|cupy|startup` to a harness Plan, and running it.

Covers: every check that can be made before a process starts, in this order: the
backends and the dask-cuda paths, JIT-unspill modes, matplotlib for --chart, the
spelling of sizes, this interpreter's libraries, the dask-cuda environment, the GPU
(`build_plan`; without one, the error names `cpu_check_command`, a run on host memory
that ends in seconds, with the smaller defaults of --array-module numpy: `cpu_defaults`); --mode against --processes/--warm-runs and the --warmup default
(`mode_settings`); running a plan and printing its table (`run_plan`); `command`, which
turns cudask's user errors into one-line click errors (a bad value exit status 2, as a
bad flag), and SIGINT or SIGTERM into one line and exit status 130 or 143 after what the
command started is stopped. Does not cover: the options
(cudask_bench.cli.workload_options), the harness. Threading: the command's thread only.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from cudask.errors import CudaskError, DeviceError, NoGPUError, OptionError
from cudask.sizes import parse_size
from cudask_bench import environment, harness, spec, stopping, targets
from cudask_bench.report import format_table, write_json


def command(f: Callable[[click.Context, dict[str, Any]], None]) -> Callable[..., None]:
    """A click callback `f(ctx, options)` whose CudaskError is printed on one line, and
    which SIGINT or SIGTERM ends (once what it started is stopped) with one line and
    exit status 130 or 143."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> None:
        ctx = click.get_current_context()
        try:
            with stopping.interrupts():
                f(ctx, kw)
        except (OptionError, DeviceError) as exc:  # a bad value: a usage error, exit status 2
            raise click.UsageError(str(exc), ctx=ctx) from None
        except CudaskError as exc:
            raise click.ClickException(str(exc)) from None
        except stopping.Interrupted as exc:
            click.echo(
                f"{ctx.command_path}: interrupted by {exc.name}; its processes are "
                "stopped and its temporary files removed",
                err=True,
            )
            ctx.exit(exc.exit_code)

    return wrapper


def given(ctx: click.Context, name: str) -> bool:
    """Whether option `name` was given on the command line (not defaulted)."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def size(value: str, name: str) -> int | None:
    return parse_size(value, total=None, name=name)


def workload_size(value: str, name: str, example: str) -> int:
    """A workload's byte size, above 0 ("0" or "none" would mean none, which it cannot)."""
    nbytes = size(value, name)
    if nbytes is None:
        raise OptionError(
            f"{name}={value!r} is no size; accepted: a byte size above 0 such as {example!r}"
        )
    return nbytes


def _device_limit(value: str | None, total: int | None) -> tuple[int | None, bool]:
    """(bytes or None for no limit, whether to pass the keyword at all)."""
    if value is None or value.strip().lower() == "default":
        return None, False
    return (
        parse_size(value, total=total, name="--device-memory-limit", auto=1.0, maximum=total),
        True,
    )


#: The defaults --array-module numpy gives each workload's options that the command line
#: leaves out: a check of the harness on host memory, small enough to end within a minute on
#: two cores, with a progress line. With CuPy (on GPUs) the full-size defaults stand.
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    "spill": {"total": "256MiB", "chunk_size": "32MiB", "repeat": 1, "progress": True},
    "cupy": {
        "operations": ("dot",),
        "size": 2000,
        "array_chunk": 500,
        "repeat": 1,
        "progress": True,
    },
    "startup": {"repeat": 1, "progress": True},
}


def cpu_defaults(ctx: click.Context, kw: dict[str, Any], workload: str) -> None:
    """With --array-module numpy, CPU_DEFAULTS for the options not given."""
    if kw["array_module"] != "numpy":
        return
    for name, value in CPU_DEFAULTS[workload].items():
        if not given(ctx, name):
            kw[name] = value


def cpu_check_command(workload: str) -> str:
    """The command that checks `workload`'s harness without a GPU (CPU_DEFAULTS apply)."""
    return f"cudask bench {workload} --backend dict --array-module numpy"


def _check_device(workload: str, device: str, gpus: dict[str, Any], needs_gpu: bool) -> None:
    if not needs_gpu:
        return
    if not gpus.get("available"):
        raise NoGPUError(
            f"cudask bench needs an NVIDIA GPU and NVML finds none ({gpus.get('reason')}); "
            f"to check the harness without a GPU (host memory, under a minute): "
            f"{cpu_check_command(workload)}"
        )
    known = [str(d["index"]) for d in gpus["devices"]] + [
        str(d["uuid"]) for d in gpus["devices"] if d.get("uuid")
    ]
    if device not in known:
        indices = ", ".join(str(d["index"]) for d in gpus["devices"])
        raise DeviceError(
            f"--device={device!r} names no GPU; accepted: an index ({indices}) or a GPU UUID"
        )


def _backends(kw: dict[str, Any]) -> list[str]:
    """--backend, with dask-cuda added by --against; its paths checked."""
    backends: list[str] = list(dict.fromkeys(kw["backends"]))
    if kw["against"] == "dask-cuda" and "dask-cuda" not in backends:
        backends.append("dask-cuda")
    if (kw["dask_cuda_python"] or kw["dask_cuda_path"]) and "dask-cuda" not in backends:
        raise OptionError(
            "--dask-cuda-python/--dask-cuda-path given without --against dask-cuda; "
            "add --against dask-cuda"
        )
    if "dask-cuda" in backends:
        targets.check_dask_cuda_paths(kw["dask_cuda_python"], kw["dask_cuda_path"])
    return backends


def _jit_modes(ctx: click.Context, kw: dict[str, Any], backends: list[str]) -> tuple[str, str]:
    """(cudask's JIT-unspill mode, dask-cuda's); checks --chart's matplotlib on the way,
    where the checks always stood."""
    jit_mode = kw["jit_unspill"]
    if kw["no_jit_unspill"]:
        if given(ctx, "jit_unspill"):
            raise OptionError("--jit-unspill and --no-jit-unspill given together; give one")
        jit_mode = "off"
    if kw["chart"]:
        from cudask_bench.chart import require_matplotlib

        require_matplotlib()
    if jit_mode != "off" and set(backends) <= {"dict"}:
        raise OptionError("--jit-unspill needs --backend cudask or --against dask-cuda")
    if kw["against_jit_unspill"] and "dask-cuda" not in backends:
        raise OptionError(
            "--against-jit-unspill given without --against dask-cuda; add --against dask-cuda"
        )
    return jit_mode, kw["against_jit_unspill"] or jit_mode


def _check_spelling(kw: dict[str, Any]) -> None:
    """The spelling of sizes, before anything is installed or looked up (a huge stand-in
    total lets fractions through)."""
    for name, key in (
        ("--device-memory-limit", "device_memory_limit"),
        ("--rmm-pool-size", "rmm_pool_size"),
        ("--memory-limit", "memory_limit"),
    ):
        value = kw[key]
        if value is not None and value.strip().lower() != "default":
            parse_size(value, total=2**62, name=name)


def _targets(kw: dict[str, Any], backends: list[str], against_jit: str) -> dict[str, Any]:
    """Where each backend runs; installation problems are found here, no GPU needed."""
    targets.check_local(backends, kw["array_module"])
    found = {b: targets.Target(sys.executable) for b in backends if b != "dask-cuda"}
    if "dask-cuda" in backends:
        found["dask-cuda"] = targets.resolve_dask_cuda(
            kw["dask_cuda_python"],
            kw["dask_cuda_path"],
            jit_unspill=against_jit != "off",
            array_module=kw["array_module"],
        )
    return found


def _recorded(
    kw: dict[str, Any],
    found: dict[str, Any],
    backends: list[str],
    limit: int | str | None,
    jit_modes: tuple[str, str],
    rmm_pool: int | None,
) -> dict[str, Any]:
    """The parameters a result records of the common options, in their order."""
    return {
        "backends": backends,
        "device_memory_limit": limit,
        "jit_unspill": jit_modes[0],
        "against_jit_unspill": jit_modes[1],
        "baseline": kw["baseline"],
        "device": kw["device"],
        "memory_limit": kw["memory_limit"],
        "rmm_pool_size": rmm_pool,
        "protocol": kw["protocol"],
        "array_module": kw["array_module"],
        "dask_cuda_python": found["dask-cuda"].python if "dask-cuda" in found else None,
        "dask_cuda_path": kw["dask_cuda_path"],
    }


def build_plan(
    workload: str,
    ctx: click.Context,
    kw: dict[str, Any],
    workload_options: dict[str, Any],
    parameters: dict[str, Any],
) -> harness.Plan:
    """Check the common options of `workload` and decide its variants and runners."""
    backends = _backends(kw)
    jit_mode, against_jit = _jit_modes(ctx, kw, backends)
    needs_gpu = kw["array_module"] == "cupy" or bool({"cudask", "dask-cuda"} & set(backends))
    _check_spelling(kw)
    found = _targets(kw, backends, against_jit)
    gpus = environment.gpus() if needs_gpu else {"available": False, "devices": []}
    _check_device(workload, kw["device"], gpus, needs_gpu)
    total = environment.device_total(gpus, kw["device"])
    limit, limit_set = _device_limit(kw["device_memory_limit"], total)
    rmm_pool = (
        parse_size(kw["rmm_pool_size"], total=total, name="--rmm-pool-size", maximum=total)
        if kw["rmm_pool_size"]
        else None
    )
    variants = spec.build_variants(
        backends,
        device_memory_limit=limit,
        limit_set=limit_set,
        jit_mode=jit_mode,
        against_jit_mode=against_jit,
        baseline=kw["baseline"],
    )
    for variant in variants:  # baselines may add backends (the dict store) run here
        found.setdefault(variant.backend, targets.Target(sys.executable))
    runner_options = {
        "array_module": kw["array_module"],
        "device": kw["device"],
        "memory_limit": kw["memory_limit"],
        "rmm_pool_size": rmm_pool,
        "protocol": kw["protocol"],
        **workload_options,
    }
    recorded = _recorded(
        kw, found, backends, limit if limit_set else "default", (jit_mode, against_jit), rmm_pool
    )
    return harness.Plan(
        workload=workload,
        variants=variants,
        targets=found,
        runner_options=runner_options,
        repeat=kw["repeat"],
        warmup=kw["warmup"],
        processes=kw.get("processes", 1),
        timeout=kw["timeout"],
        parameters={**parameters, **recorded},
        argv=list(sys.argv),
    )


def mode_settings(ctx: click.Context, kw: dict[str, Any], workload: str) -> dict[str, Any]:
    """Check --mode against --processes/--warm-runs, resolve --warmup; the runner's
    mode options (also recorded in the result's parameters)."""
    mode = kw["mode"]
    if mode == "cold" and given(ctx, "processes"):
        raise OptionError(
            "--processes applies to --mode warm; in cold mode every repetition is its own process"
        )
    if mode == "warm" and given(ctx, "warm_runs"):
        raise OptionError(
            "--warm-runs applies to --mode cold; in warm mode every measured repetition "
            "is a warm run"
        )
    if kw["warmup"] is None:
        kw["warmup"] = spec.default_warmup(workload, mode)
    return {"mode": mode, "warm_runs": kw["warm_runs"] if mode == "cold" else None}


def _chart(document: dict[str, Any], output: str | None, path: str) -> None:
    """The chart of the file just written (its provenance and name in the caption), or
    of the unsaved result stamped here."""
    from cudask_bench import provenance
    from cudask_bench.chart import Origin, write_chart

    if output:
        with open(output) as fh:
            document, origin = json.load(fh), Origin.of_file(output)
    else:
        document, origin = provenance.stamp(dict(document)), None
    try:
        write_chart(document, path, origin)
        click.echo(f"chart: {path}")
    except ValueError as exc:
        click.echo(f"chart not written: {exc}", err=True)


def run_plan(plan: harness.Plan, kw: dict[str, Any]) -> None:
    """Run `plan`, print its table, write the JSON and chart asked for; exit 1 on failures."""
    progress = harness.ProgressLine(kw["progress"])
    try:
        document = harness.execute(plan, progress)
    except stopping.Interrupted:
        progress.end_line()
        raise
    click.echo(format_table(document))
    if kw["output"]:
        write_json(document, kw["output"])
        click.echo(f"results: {kw['output']}")
    if kw["chart"]:
        _chart(document, kw["output"], kw["chart"])
    failed = [v["name"] for v in document["variants"] if v["status"] != "ok"]
    if failed:
        raise click.ClickException(
            f"{len(failed)} of {len(document['variants'])} variants failed: {', '.join(failed)}"
        )


__all__ = [
    "CPU_DEFAULTS",
    "build_plan",
    "command",
    "cpu_check_command",
    "cpu_defaults",
    "given",
    "mode_settings",
    "run_plan",
    "size",
    "workload_size",
]
