"""`cudask bench`: the spill, cupy and startup benchmarks, side by side with dask-cuda.

Covers: the click commands `bench spill`, `bench cupy`, `bench startup`,
`bench soak`, `bench transfer` and `bench chart`, their options (spill and cupy measure in --mode cold, the
default, or warm), and every check that can be made before a process starts
(sizes, names, the GPU, CuPy, matplotlib, the dask-cuda environment and
whether it has JIT-unspill). Bad input ends in one line
naming the value and what is accepted, never a traceback. Each variant then
runs in its own process (cudask.bench.harness), and the command prints a
table, and writes JSON and a PNG chart when asked.

Does not cover: the workloads, runner, harness or chart themselves
(cudask.bench.*). Wire it with `cli.add_command(bench)`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cudask.bench import environment, spec
from cudask.cli.errors import UserErrorGroup
from cudask.errors import CudaskError, DeviceError, MissingDependencyError, NoGPUError, OptionError
from cudask.sizes import parse_size

F = TypeVar("F", bound=Callable[..., Any])


@click.group(cls=UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Benchmarks: spilling, CuPy dask.array workloads, cluster start-up, soak,
    device data between workers (transfer).

    Each variant (backend x device limit x JIT-unspill) runs in a fresh
    process; --against dask-cuda runs the same workload with identical
    parameters on dask_cuda.LocalCUDACluster, from this or another Python
    environment, and reports cudask / dask-cuda ratios measured in the same run.
    """


def common_options(
    default_limit: str | None,
    default_repeat: int,
    default_warmup: int | None,
    warmup_help: str = "Unmeasured repetitions first.",
) -> Callable[[F], F]:
    """The options every workload command takes (a None warm-up default is resolved by
    the command, per --mode)."""

    def decorate(f: F) -> F:
        options = [
            click.option(
                "--backend",
                "backends",
                multiple=True,
                type=click.Choice(list(spec.BACKENDS)),
                default=("cudask",),
                show_default=True,
                help="Backend(s) to run (repeatable). dict: distributed's worker with a plain "
                "dict store, no spilling.",
            ),
            click.option(
                "--against",
                type=click.Choice(["dask-cuda"]),
                default=None,
                help="Also run every configuration on dask-cuda, side by side.",
            ),
            click.option(
                "--dask-cuda-python",
                metavar="PATH",
                default=None,
                help="Python interpreter where dask-cuda is installed (default: this one).",
            ),
            click.option(
                "--dask-cuda-path",
                metavar="DIR",
                default=None,
                help="Directory with dask-cuda installed (pip install --target DIR), put on "
                "the dask-cuda runner's PYTHONPATH.",
            ),
            click.option(
                "--device-memory-limit",
                default=default_limit,
                show_default=True,
                help='Device limit per worker: bytes ("4GB"), a fraction of the GPU (0.5), '
                '"none"/0 for no limit, or "default" for each backend\'s own default.',
            ),
            click.option(
                "--jit-unspill",
                "jit_unspill",
                type=click.Choice(list(spec.JIT_MODES)),
                default="off",
                show_default=True,
                is_flag=False,
                flag_value="on",
                help="JIT-unspill: off, on, or both (with and without). --jit-unspill alone "
                "means on.",
            ),
            click.option(
                "--against-jit-unspill",
                "against_jit_unspill",
                type=click.Choice(list(spec.JIT_MODES)),
                default=None,
                help="JIT-unspill of the dask-cuda runs when it should differ from "
                "--jit-unspill (default: the same). E.g. --jit-unspill both "
                "--against-jit-unspill on: cudask with and without it, dask-cuda 26.04 "
                "with it.",
            ),
            click.option(
                "--no-jit-unspill",
                "no_jit_unspill",
                is_flag=True,
                default=False,
                help="Same as --jit-unspill off.",
            ),
            click.option(
                "--baseline/--no-baseline",
                default=True,
                show_default=True,
                help="Also run the no-spilling baselines: the plain dict store and, with a "
                "device limit, cudask without one.",
            ),
            click.option(
                "--repeat",
                type=click.IntRange(min=1),
                default=default_repeat,
                show_default=True,
                help="Measured repetitions (median reported); for startup and --mode cold "
                "each is a fresh process, the configurations taking turns.",
            ),
            click.option(
                "--warmup",
                type=click.IntRange(min=0),
                default=default_warmup,
                show_default=default_warmup is not None,
                help=warmup_help,
            ),
            click.option(
                "--device",
                default="0",
                show_default=True,
                help="The GPU to use: an index or a UUID.",
            ),
            click.option(
                "--memory-limit",
                default="auto",
                show_default=True,
                help="Host memory limit of the worker (passed to every backend).",
            ),
            click.option(
                "--rmm-pool-size",
                default=None,
                help="RMM pool per worker, e.g. 20GB (cudask and dask-cuda).",
            ),
            click.option(
                "--protocol", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True
            ),
            click.option(
                "--array-module",
                type=click.Choice(list(spec.ARRAY_MODULES)),
                default="cupy",
                show_default=True,
                help="numpy runs the workloads on host memory: a harness check without a GPU, "
                "not a GPU benchmark (use with --backend dict).",
            ),
            click.option(
                "--output",
                "-o",
                "output",
                type=click.Path(dir_okay=False),
                default=None,
                help="Write the JSON result here.",
            ),
            click.option(
                "--chart",
                type=click.Path(dir_okay=False),
                default=None,
                help="Write a PNG chart here (needs matplotlib: cudask[bench]).",
            ),
            click.option(
                "--progress/--no-progress",
                default=False,
                show_default=True,
                help="Show a progress line on stderr.",
            ),
            click.option(
                "--timeout",
                type=click.FloatRange(min=1),
                default=3600.0,
                show_default=True,
                help="Seconds one runner process may take.",
            ),
        ]
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _device_limit(value: str | None, total: int | None) -> tuple[int | None, bool]:
    """(bytes or None for no limit, whether to pass the keyword at all)."""
    if value is None or value.strip().lower() == "default":
        return None, False
    return (
        parse_size(value, total=total, name="--device-memory-limit", auto=1.0, maximum=total),
        True,
    )


def _size(value: str, name: str) -> int | None:
    return parse_size(value, total=None, name=name)


def _check_device(device: str, gpus: dict[str, Any], needs_gpu: bool) -> None:
    if not needs_gpu:
        return
    if not gpus.get("available"):
        raise NoGPUError(
            f"cudask bench needs an NVIDIA GPU and NVML finds none ({gpus.get('reason')}); "
            "to check the harness without a GPU run --backend dict --array-module numpy"
        )
    known = [str(d["index"]) for d in gpus["devices"]] + [
        str(d["uuid"]) for d in gpus["devices"] if d.get("uuid")
    ]
    if device not in known:
        indices = ", ".join(str(d["index"]) for d in gpus["devices"])
        raise DeviceError(
            f"--device={device!r} names no GPU; accepted: an index ({indices}) or a GPU UUID"
        )


def _plan(
    workload: str,
    ctx: click.Context,
    kw: dict[str, Any],
    workload_options: dict[str, Any],
    parameters: dict[str, Any],
) -> Any:
    from cudask.bench import harness

    backends: list[str] = list(dict.fromkeys(kw["backends"]))
    if kw["against"] == "dask-cuda" and "dask-cuda" not in backends:
        backends.append("dask-cuda")
    if (kw["dask_cuda_python"] or kw["dask_cuda_path"]) and "dask-cuda" not in backends:
        raise OptionError(
            "--dask-cuda-python/--dask-cuda-path given without --against dask-cuda; "
            "add --against dask-cuda"
        )
    if "dask-cuda" in backends:
        harness.check_dask_cuda_paths(kw["dask_cuda_python"], kw["dask_cuda_path"])
    jit_mode = kw["jit_unspill"]
    if kw["no_jit_unspill"]:
        if ctx.get_parameter_source("jit_unspill") == click.core.ParameterSource.COMMANDLINE:
            raise OptionError("--jit-unspill and --no-jit-unspill given together; give one")
        jit_mode = "off"
    array_module = kw["array_module"]
    needs_gpu = array_module == "cupy" or bool({"cudask", "dask-cuda"} & set(backends))
    if kw["chart"]:
        from cudask.bench.chart import require_matplotlib

        require_matplotlib()
    if jit_mode != "off" and set(backends) <= {"dict"}:
        raise OptionError("--jit-unspill needs --backend cudask or --against dask-cuda")
    against_jit = kw["against_jit_unspill"] or jit_mode
    if kw["against_jit_unspill"] and "dask-cuda" not in backends:
        raise OptionError("--against-jit-unspill given without --against dask-cuda; "
                          "add --against dask-cuda")

    # the spelling of sizes first (a huge stand-in total lets fractions through)
    for name, key in (
        ("--device-memory-limit", "device_memory_limit"),
        ("--rmm-pool-size", "rmm_pool_size"),
        ("--memory-limit", "memory_limit"),
    ):
        value = kw[key]
        if value is not None and value.strip().lower() != "default":
            parse_size(value, total=2**62, name=name)
    # then installation problems (no GPU needed to find them), then the GPU
    harness.check_local(backends, array_module)
    targets = {b: harness.Target(sys.executable) for b in backends if b != "dask-cuda"}
    if "dask-cuda" in backends:
        targets["dask-cuda"] = harness.resolve_dask_cuda(
            kw["dask_cuda_python"],
            kw["dask_cuda_path"],
            jit_unspill=against_jit != "off",
            array_module=array_module,
        )
    gpus = environment.gpus() if needs_gpu else {"available": False, "devices": []}
    _check_device(kw["device"], gpus, needs_gpu)
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
        targets.setdefault(variant.backend, harness.Target(sys.executable))
    runner_options = {
        "array_module": array_module,
        "device": kw["device"],
        "memory_limit": kw["memory_limit"],
        "rmm_pool_size": rmm_pool,
        "protocol": kw["protocol"],
        **workload_options,
    }
    return harness.Plan(
        workload=workload,
        variants=variants,
        targets=targets,
        runner_options=runner_options,
        repeat=kw["repeat"],
        warmup=kw["warmup"],
        processes=kw.get("processes", 1),
        timeout=kw["timeout"],
        parameters={
            **parameters,
            "backends": backends,
            "device_memory_limit": limit if limit_set else "default",
            "jit_unspill": jit_mode,
            "against_jit_unspill": against_jit,
            "baseline": kw["baseline"],
            "device": kw["device"],
            "memory_limit": kw["memory_limit"],
            "rmm_pool_size": rmm_pool,
            "protocol": kw["protocol"],
            "array_module": array_module,
            "dask_cuda_python": targets["dask-cuda"].python if "dask-cuda" in targets else None,
            "dask_cuda_path": kw["dask_cuda_path"],
        },
        argv=list(sys.argv),
    )


def _run(plan: Any, kw: dict[str, Any]) -> None:
    from cudask.bench import harness

    progress = harness.ProgressLine(kw["progress"])
    document = harness.execute(plan, progress)
    click.echo(harness.format_table(document))
    if kw["output"]:
        harness.write_json(document, kw["output"])
        click.echo(f"results: {kw['output']}")
    if kw["chart"]:
        from cudask.bench.chart import write_chart

        try:
            write_chart(document, kw["chart"])
            click.echo(f"chart: {kw['chart']}")
        except ValueError as exc:
            click.echo(f"chart not written: {exc}", err=True)
    failed = [v["name"] for v in document["variants"] if v["status"] != "ok"]
    if failed:
        raise click.ClickException(
            f"{len(failed)} of {len(document['variants'])} variants failed: {', '.join(failed)}"
        )


def mode_options() -> Callable[[F], F]:
    """--mode, --warm-runs and --processes of `spill` and `cupy`."""

    def decorate(f: F) -> F:
        options = [
            click.option(
                "--mode",
                type=click.Choice(list(spec.MODES)),
                default=spec.DEFAULT_MODE,
                show_default=True,
                help=f"cold: {spec.MODE_DESCRIPTIONS['cold']}, every measured repetition a "
                "fresh process and cluster (the headline figure), with --warm-runs more runs "
                f"in that cluster beside it (*{spec.WARM_SUFFIX}). "
                f"warm: {spec.MODE_DESCRIPTIONS['warm']} in one cluster "
                f"(*{spec.WARM_SUFFIX} only).",
            ),
            click.option(
                "--warm-runs",
                type=click.IntRange(min=0),
                default=spec.DEFAULT_WARM_RUNS,
                show_default=True,
                help=f"--mode cold: runs after the first one, in the same cluster, reported as "
                f"*{spec.WARM_SUFFIX}.",
            ),
            click.option(
                "--processes",
                type=click.IntRange(min=1),
                default=1,
                show_default=True,
                help="--mode warm: fresh processes per configuration, each with the warm-up "
                "and the repetitions. The configurations take turns, so drift on the machine "
                "falls on all of them alike; medians are over every process's repetitions.",
            ),
        ]
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _warmup_help(workload: str) -> str:
    return (
        f"Unmeasured warm-ups first. --mode cold: whole processes per configuration, taking "
        f"turns, that warm the disk cache of the libraries and CuPy's kernel cache "
        f"(default {spec.COLD_WARMUP}); --mode warm: repetitions in each process before the "
        f"measured ones (default {spec.WARM_WARMUP[workload]})."
    )


def _mode_settings(ctx: click.Context, kw: dict[str, Any], workload: str) -> dict[str, Any]:
    """Check --mode against --processes/--warm-runs, resolve --warmup; the runner's
    mode options (also recorded in the result's parameters)."""

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE

    mode = kw["mode"]
    if mode == "cold" and given("processes"):
        raise OptionError(
            "--processes applies to --mode warm; in cold mode every repetition is its own process"
        )
    if mode == "warm" and given("warm_runs"):
        raise OptionError(
            "--warm-runs applies to --mode cold; in warm mode every measured repetition "
            "is a warm run"
        )
    if kw["warmup"] is None:
        kw["warmup"] = spec.default_warmup(workload, mode)
    return {"mode": mode, "warm_runs": kw["warm_runs"] if mode == "cold" else None}


def _command(f: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(f)
    def wrapper(**kw: Any) -> None:
        try:
            f(click.get_current_context(), kw)
        except CudaskError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


@bench.command("spill")
@common_options(
    default_limit="4GB", default_repeat=3, default_warmup=None, warmup_help=_warmup_help("spill")
)
@click.option(
    "--total",
    default="16GiB",
    show_default=True,
    help="Bytes of device data to create (beyond the device limit to spill).",
)
@click.option(
    "--chunk-size",
    default="256MiB",
    show_default=True,
    help="Bytes per chunk (one dask future each).",
)
@mode_options()
@_command
def spill(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Create device chunks beyond the device limit, then read all back and verify every value.

    Chunk i holds uint64 values base_i + j; reading back compares every
    element on the device against that formula. Reports seconds and GB/s.

    \b
    --mode cold (default): every measured repetition is a fresh process
    with a fresh one-worker cluster, the configurations taking turns.
      create, read_verify: the first run, timed from the first submit
      create_warm, read_verify_warm: the --warm-runs runs after it,
        in the same cluster
    --mode warm: --warmup, then --repeat runs in one cluster (steady state).
      create_warm, read_verify_warm
    """
    modes = _mode_settings(ctx, kw, "spill")
    total, chunk = spec.check_spill_sizes(
        _size(kw["total"], "--total"), _size(kw["chunk_size"], "--chunk-size")
    )
    plan = _plan(
        "spill",
        ctx,
        kw,
        {"total": total, "chunk_size": chunk, **modes},
        {"total": total, "chunk_size": chunk, "chunks": total // chunk, **modes},
    )
    _run(plan, kw)


@bench.command("cupy")
@common_options(
    default_limit="4GB", default_repeat=3, default_warmup=None, warmup_help=_warmup_help("cupy")
)
@click.option(
    "--operation",
    "operations",
    multiple=True,
    metavar="NAME",
    help=f"Operation(s) to run, repeatable or comma-separated; default all: "
    f"{', '.join(spec.CUPY_OPERATIONS)}.",
)
@click.option(
    "--size",
    type=click.IntRange(min=16),
    default=None,
    help="Array size n of n x n (svd: rows). Default per operation: "
    + ", ".join(f"{k} {v.size}" for k, v in spec.CUPY_OPERATIONS.items())
    + ".",
)
@click.option(
    "--chunk-size",
    "array_chunk",
    type=click.IntRange(min=1),
    default=None,
    help="Chunk size in elements per dimension (svd: rows). Default per operation: "
    + ", ".join(f"{k} {v.chunk}" for k, v in spec.CUPY_OPERATIONS.items())
    + ".",
)
@click.option(
    "--second-size",
    type=click.IntRange(min=1),
    default=None,
    help="svd: number of columns (default 1000).",
)
@mode_options()
@_command
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
    modes = _mode_settings(ctx, kw, "cupy")
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
    plan = _plan(
        "cupy",
        ctx,
        kw,
        {
            "operations": operations,
            "size": kw["size"],
            "array_chunk": kw["array_chunk"],
            "second_size": kw["second_size"],
            **modes,
        },
        {"operations": operations, "shapes": shapes, **modes},
    )
    _run(plan, kw)


@bench.command("startup")
@common_options(default_limit=None, default_repeat=5, default_warmup=1)
@_command
def startup(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Time until a fresh 1-GPU cluster answers a task round trip (a new process each time).

    startup = importing the backend's cluster class + constructing the cluster
    + connecting a client and running one task. The device limit defaults to
    each backend's own default.
    """
    plan = _plan("startup", ctx, kw, {}, {})
    _run(plan, kw)


@bench.command("soak")
@click.option("--duration", default="120s", show_default=True,
              help="How long to draw steps: seconds or a time such as '5 minutes'.")
@click.option("--device-memory-limit", default="1GiB", show_default=True,
              help="Device limit of each worker (small, so data keep moving).")
@click.option("--memory-limit", default="4GiB", show_default=True,
              help="Host memory limit of each worker.")
@click.option("--host-fraction", default=0.25, show_default=True, type=float,
              help="distributed.worker.memory.target for the run: the host tier's share of "
              "--memory-limit before data go to disk.")
@click.option("--max-held", default="3GiB", show_default=True,
              help="Most bytes held by the client at once (creates turn into deletes above).")
@click.option("--kill-every", default="20s", show_default=True,
              help="Least time between two worker kills (SIGKILL); 0: no kills.")
@click.option("--min-kills", default=0, show_default=True, type=click.IntRange(min=0),
              help="Kills the soak must make: it goes on past --duration (killing only) until "
              "this many happened, for at most 10 minutes more. Needs --kill-every above 0.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the steps drawn.")
@click.option("--n-workers", default=None, type=click.IntRange(min=1),
              help="Workers (one per GPU); default: every visible GPU.")
@click.option("--jit-unspill/--no-jit-unspill", default=False, show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="JSON file to write the report to, with the machine and versions.")
@_command
def soak(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Random create / read / combine / spill / delete / worker-kill steps for a bounded
    time at a small device limit; then every held key is checked byte for byte.

    Reports steps, bytes created and moved between tiers, kills, and keys
    checked, lost and changed. Exit status 1 when any key was lost or changed.
    """
    from dask.utils import parse_timedelta

    from cudask.bench import harness
    from cudask.bench import soak as soak_run

    seconds: dict[str, float] = {}
    for name in ("duration", "kill_every"):
        try:
            seconds[name] = float(parse_timedelta(kw[name], default="seconds") or 0)
        except (ValueError, KeyError, TypeError):
            raise click.BadParameter(f"{kw[name]!r} is not a time; accepted: seconds or a "
                                     "time such as '90s', '5m', '5 minutes'",
                                     param_hint=f"--{name.replace('_', '-')}") from None
    if seconds["duration"] <= 0:
        raise click.BadParameter(f"{kw['duration']!r} must be more than 0 seconds",
                                 param_hint="--duration")
    if not 0 < kw["host_fraction"] <= 1:
        raise click.BadParameter(f"{kw['host_fraction']!r}; accepted: a fraction in (0, 1]",
                                 param_hint="--host-fraction")
    sizes: dict[str, int | None] = {}
    for name in ("device_memory_limit", "memory_limit", "max_held"):
        try:
            sizes[name] = value = _size(kw[name], "--" + name.replace("_", "-"))
        except OptionError as exc:
            raise click.UsageError(str(exc)) from None
        if not value:
            raise click.BadParameter(f"{kw[name]!r}; accepted: a size above 0 such as '1GiB'",
                                     param_hint="--" + name.replace("_", "-"))
    try:
        plan = soak_run.SoakPlan(
            duration=seconds["duration"], device_memory_limit=int(sizes["device_memory_limit"] or 0),
            memory_limit=int(sizes["memory_limit"] or 0), host_fraction=kw["host_fraction"],
            max_held=int(sizes["max_held"] or 0), kill_every=seconds["kill_every"],
            min_kills=kw["min_kills"], seed=kw["seed"], n_workers=kw["n_workers"],
            jit_unspill=kw["jit_unspill"])
    except ValueError as exc:  # --min-kills against --kill-every and --duration, in option names
        said = str(exc).replace("min_kills", "--min-kills").replace("kill_every", "--kill-every")
        raise click.UsageError(said.replace("duration", "--duration")) from None
    gpus = environment.gpus()
    if not gpus.get("available"):
        raise NoGPUError(f"cudask bench soak needs an NVIDIA GPU and NVML finds none "
                         f"({gpus.get('reason')})")
    if not environment.has_module("cupy"):
        raise click.ClickException("cudask bench soak needs CuPy: pip install 'cudask[cuda]'")
    progress = harness.ProgressLine(enabled=sys.stderr.isatty())

    def show(elapsed: float, counts: Any) -> None:
        progress.update("soak", f"{counts['kill'] - counts['kill-missed']} kills",
                        int(elapsed), int(plan.duration), f"s, {sum(counts.values())} steps")

    report = soak_run.run_soak(plan, progress=show)
    progress.finish("soak: done")
    document = {"workload": "soak", "report": report, "machine": environment.machine(),
                "versions": environment.versions()}
    if kw["output"]:
        harness.write_json(document, kw["output"])
    moved = sum(report["bytes_moved"].values())
    click.echo(f"soak: {report['cycles']} steps in {report['seconds']} s, {report['kills']} kills, "
               f"{report['bytes_created'] / 2**30:.1f} GiB created, {moved / 2**30:.1f} GiB moved "
               f"between tiers; keys checked {report['keys_checked']}, lost "
               f"{report['keys_lost']}, changed {report['keys_changed']}; reads "
               f"{report['reads_checked']}, differing {report['reads_differing']}")
    for line in report["errors"][:5]:
        click.echo(f"  {line}")
    if not report["ok"]:
        ctx.exit(1)


@bench.command("transfer")
@click.option("--placement", default=None,
              help="The GPUs of each worker process, comma-separated, '+' joining the GPUs of one "
              "process (a worker per GPU, the others visible to it): '0+1' one process over GPUs 0 "
              "and 1, as `dask cuda worker` on a node or LocalCUDACluster; '0,1' a process per GPU, "
              "each seeing its own alone; '0,0' two workers on GPU 0. Default: '0+1' with two or "
              "more GPUs, else '0,0'.")
@click.option("--sizes", default="64MiB,512MiB,2GiB", show_default=True,
              help="Array sizes sent point to point, comma-separated.")
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(min=0),
              help="Warm transfers of each size after the cold one.")
@click.option("--n", "side", default=20000, show_default=True, type=click.IntRange(min=2),
              help="Side of the float64 array rechunked all-to-all (20000: 3.2 GB).")
@click.option("--blocks", default=8, show_default=True, type=click.IntRange(min=1),
              help="Row blocks rechunked into as many column blocks.")
@click.option("--shuffle-rows", default=None, type=click.IntRange(min=0),
              help="Rows of the dask-cuDF DataFrame shuffled on a key (16 bytes each; 0: no "
                   "shuffle). Default: 50000000 when dask-cuDF is installed, else 0.")
@click.option("--shuffle-methods", default="tasks,p2p,explicit", show_default=True,
              help="Shuffle methods to run, comma-separated: tasks, p2p, explicit (cudask's "
                   "explicit-comms shuffle).")
@click.option("--device-memory-limit", default="30GB", show_default=True,
              help="Device limit of each worker.")
@click.option("--rmm-pool-size", default=None,
              help="RMM pool of each worker, cudask's and dask-cuda's alike (bytes or '40GB'; "
              "default: no pool), CuPy allocating from it (--set-rmm-allocator-for-libs cupy). "
              "A cudask worker keeps a peer's pool slab mapped between transfers "
              "(cudask.comm.lifetimes).")
@click.option("--protocols", default="tcp", show_default=True,
              help="Comma-separated: tcp (cudask with CUDA IPC on and off), ucx (cudask over "
              "UCX; needs distributed-ucxx). dask-cuda runs over each with --against.")
@click.option("--against", type=click.Choice(["dask-cuda"]), default=None,
              help="Also run dask-cuda's workers (`python -m dask_cuda.cli`) in the same run.")
@click.option("--dask-cuda-python", default=None,
              help="Python interpreter where dask-cuda is installed (default: this one).")
@click.option("--dask-cuda-path", default=None,
              help="Directory where dask-cuda is installed (pip install --target), put on "
              "PYTHONPATH.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="JSON file to write the report to, with the machine and versions; the "
              "workers' logs go beside it (transfer-SETTING/).")
@_command
def transfer(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Device data between workers of one host: cudask with CUDA IPC
    (cudask.comm.device-ipc) against TCP through host memory, cudask over UCX and
    dask-cuda over TCP and UCX when asked; point to point, all-to-all rechunk and,
    with dask-cuDF, a DataFrame shuffle (tasks and P2P), each setting in a fresh
    cluster of worker processes."""
    import os

    from dask.utils import parse_bytes

    from cudask.bench import harness
    from cudask.bench import transfer as transfer_run

    sizes = []
    for text in str(kw["sizes"]).split(","):
        try:
            size = parse_bytes(text.strip())
        except (ValueError, TypeError):
            size = 0
        if size < 8:
            raise click.BadParameter(f"{text!r}; accepted: sizes of at least 8 bytes such as "
                                     "'512MiB', comma-separated", param_hint="--sizes")
        sizes.append(size)
    protocols = tuple(p.strip() for p in str(kw["protocols"]).split(",") if p.strip())
    if not protocols or any(p not in transfer_run.PROTOCOLS for p in protocols):
        raise click.BadParameter(f"{kw['protocols']!r}; accepted: {', '.join(transfer_run.PROTOCOLS)}, "
                                 "comma-separated, e.g. 'tcp,ucx'", param_hint="--protocols")
    if kw["side"] % kw["blocks"]:
        raise click.BadParameter(f"--n {kw['side']} is not a multiple of --blocks {kw['blocks']}",
                                 param_hint="--n")
    try:
        _size(kw["device_memory_limit"], "--device-memory-limit")
        if kw["rmm_pool_size"] is not None:
            _size(kw["rmm_pool_size"], "--rmm-pool-size")
    except OptionError as exc:
        raise click.UsageError(str(exc)) from None
    from cudask.bench.shuffle import METHODS as SHUFFLE_METHODS

    methods = tuple(m.strip() for m in str(kw["shuffle_methods"]).split(",") if m.strip())
    if not methods or any(m not in SHUFFLE_METHODS for m in methods):
        raise click.BadParameter(f"{kw['shuffle_methods']!r}; accepted: {', '.join(SHUFFLE_METHODS)}, "
                                 "comma-separated", param_hint="--shuffle-methods")
    has_dask_cudf = environment.has_module("dask_cudf")
    shuffle_rows = kw["shuffle_rows"]
    if shuffle_rows is None:
        shuffle_rows = 50_000_000 if has_dask_cudf else 0
    elif shuffle_rows and not has_dask_cudf:
        raise MissingDependencyError("dask_cudf", f"--shuffle-rows {shuffle_rows}",
                                     "pip install dask-cudf-cu13  (or --shuffle-rows 0)")
    if 0 < shuffle_rows < kw["blocks"]:
        raise click.BadParameter(f"{shuffle_rows}; accepted: 0 (no shuffle) or at least --blocks "
                                 f"({kw['blocks']}) rows", param_hint="--shuffle-rows")
    if "ucx" in protocols and not environment.has_module("distributed_ucxx"):
        raise MissingDependencyError("distributed_ucxx", "--protocols ucx",
                                     "pip install 'cudask[ucx]'  (distributed-ucxx-cu13)")
    dask_cuda = None
    if kw["against"] == "dask-cuda":
        target = harness.resolve_dask_cuda(kw["dask_cuda_python"], kw["dask_cuda_path"],
                                           jit_unspill=False, array_module="cupy")
        found = (target.probe or {}).get("found", {})
        if "ucx" in protocols and not found.get("distributed_ucxx"):
            raise MissingDependencyError("distributed_ucxx", "--protocols ucx against dask-cuda",
                                         "install distributed-ucxx-cu13 where dask-cuda is")
        dask_cuda = transfer_run.Setting("dask-cuda", "dask-cuda", "tcp", python=target.python,
                                         pythonpath=target.pythonpath)
    elif kw["dask_cuda_python"] or kw["dask_cuda_path"]:
        raise click.UsageError("--dask-cuda-python / --dask-cuda-path need --against dask-cuda")
    gpus = environment.gpus()
    if not gpus.get("available"):
        raise NoGPUError(f"cudask bench transfer needs an NVIDIA GPU and NVML finds none "
                         f"({gpus.get('reason')})")
    count = len(gpus.get("devices") or [])
    placement = kw["placement"] or ("0+1" if count >= 2 else "0,0")
    entries = [[g.strip() for g in p.split("+")] for p in placement.split(",")]
    indices = [g for entry in entries for g in entry]
    if len(indices) < 2 or any(not (g.isascii() and g.isdigit()) or int(g) >= count for g in indices) \
            or any(len({int(g) for g in entry}) < len(entry) for entry in entries):
        raise click.BadParameter(f"{placement!r}; accepted: two or more GPU indices below {count} "
                                 "(this machine's GPUs), comma-separated, '+' joining the distinct "
                                 "GPUs of one process, e.g. '0,0' or '0+1'", param_hint="--placement")
    if not environment.has_module("cupy"):
        raise click.ClickException("cudask bench transfer needs CuPy: pip install 'cudask[cuda]'")
    log_dir = os.path.dirname(os.path.abspath(kw["output"])) if kw["output"] else None
    plan = transfer_run.TransferPlan(
        placement=tuple(",".join(str(int(g)) for g in entry) for entry in entries), sizes=tuple(sizes), repeat=kw["repeat"], n=kw["side"],
        blocks=kw["blocks"], device_memory_limit=kw["device_memory_limit"],
        rmm_pool_size=kw["rmm_pool_size"], settings=transfer_run.settings(protocols, dask_cuda), log_dir=log_dir,
        shuffle_rows=shuffle_rows, shuffle_methods=methods if shuffle_rows else ())
    report = transfer_run.run_transfer(plan)
    document = {"workload": "transfer", "report": report, "machine": environment.machine(),
                "versions": environment.versions()}
    if kw["output"]:
        harness.write_json(document, kw["output"])
    for line in transfer_run.summary(report):
        click.echo(line)


@bench.command("chart")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--output",
    "-o",
    "output",
    type=click.Path(dir_okay=False),
    required=True,
    help="PNG file to write.",
)
@click.option(
    "--table/--no-table", default=True, show_default=True, help="Also print the result as a table."
)
def chart(results: str, output: str, table: bool) -> None:
    """Draw a chart (and print the table) from a result JSON written by --output."""
    import json

    from cudask.bench import harness
    from cudask.bench.chart import write_chart

    try:
        with open(results) as fh:
            document = json.load(fh)
    except ValueError as exc:
        raise click.ClickException(f"{results} is not a JSON result file: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != spec.RESULT_FORMAT:
        raise click.ClickException(
            f"{results} is not a cudask bench result (expected format {spec.RESULT_FORMAT!r})"
        )
    if table:
        click.echo(harness.format_table(document))
    try:
        write_chart(document, output)
    except ValueError as exc:
        raise click.ClickException(f"{results}: {exc}") from None
    click.echo(f"chart: {output}")


__all__ = ["bench"]
