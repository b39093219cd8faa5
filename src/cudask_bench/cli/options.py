"""The options of every `cudask bench` command, declared once as data.

Covers: `Option`, one click option as its flag declarations and keyword arguments;
the declared lists (COMMON for spill, cupy and startup; MODE for spill and cupy; each
command's own); `with_options(options, overrides)`, the decorator that turns a list
into click options in the order listed (what `--help` shows), with per-command
overrides of keyword arguments (a default, a help text). Does not cover: checking the
values (cudask_bench.cli.plan and the commands). Threading: immutable module data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from cudask_bench import spec

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Option:
    """One click option: its declarations ("--flag", "-f", "dest") and keyword arguments."""

    decls: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        """The first long flag ("--device-memory-limit"), by which overrides name it."""
        return next(d for d in self.decls if d.startswith("--")).split("/")[0]


def option(*decls: str, **attrs: Any) -> Option:
    return Option(decls, attrs)


def with_options(
    options: Sequence[Option], overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> Callable[[F], F]:
    """Click options from `options`, in order; `overrides[flag]` replaces keyword
    arguments of the option with that flag."""
    changes = dict(overrides or {})
    unknown = set(changes) - {o.flag for o in options}
    if unknown:
        raise ValueError(f"overrides for options not declared: {sorted(unknown)}")

    def decorate(f: F) -> F:
        for o in reversed(options):
            f = click.option(*o.decls, **{**o.attrs, **changes.get(o.flag, {})})(f)
        return f

    return decorate


def warmup_help(workload: str) -> str:
    """--warmup of spill and cupy, whose default follows --mode."""
    return (
        f"Unmeasured warm-ups first. --mode cold: whole processes per configuration, taking "
        f"turns, that warm the disk cache of the libraries and CuPy's kernel cache "
        f"(default {spec.COLD_WARMUP}); --mode warm: repetitions in each process before the "
        f"measured ones (default {spec.WARM_WARMUP[workload]})."
    )


#: What spill, cupy and startup take (defaults of --device-memory-limit, --repeat and
#: --warmup are each command's: see COMMAND_DEFAULTS).
COMMON: tuple[Option, ...] = (
    option(
        "--backend",
        "backends",
        multiple=True,
        type=click.Choice(list(spec.BACKENDS)),
        default=("cudask",),
        show_default=True,
        help="Backend(s) to run (repeatable). dict: distributed's worker with a plain "
        "dict store, no spilling.",
    ),
    option(
        "--against",
        type=click.Choice(["dask-cuda"]),
        default=None,
        help="Also run every configuration on dask-cuda, side by side.",
    ),
    option(
        "--dask-cuda-python",
        metavar="PATH",
        default=None,
        help="Python interpreter where dask-cuda is installed (default: this one).",
    ),
    option(
        "--dask-cuda-path",
        metavar="DIR",
        default=None,
        help="Directory with dask-cuda installed (pip install --target DIR), put on "
        "the dask-cuda runner's PYTHONPATH.",
    ),
    option(
        "--device-memory-limit",
        default=None,
        show_default=True,
        help='Device limit per worker: bytes ("4GB"), a fraction of the GPU (0.5), '
        '"none"/0 for no limit, or "default" for each backend\'s own default.',
    ),
    option(
        "--jit-unspill",
        "jit_unspill",
        type=click.Choice(list(spec.JIT_MODES)),
        default="off",
        show_default=True,
        is_flag=False,
        flag_value="on",
        help="JIT-unspill: off, on, or both (with and without). --jit-unspill alone means on.",
    ),
    option(
        "--against-jit-unspill",
        "against_jit_unspill",
        type=click.Choice(list(spec.JIT_MODES)),
        default=None,
        help="JIT-unspill of the dask-cuda runs when it should differ from "
        "--jit-unspill (default: the same). E.g. --jit-unspill both "
        "--against-jit-unspill on: cudask with and without it, dask-cuda 26.04 "
        "with it.",
    ),
    option(
        "--no-jit-unspill",
        "no_jit_unspill",
        is_flag=True,
        default=False,
        help="Same as --jit-unspill off.",
    ),
    option(
        "--baseline/--no-baseline",
        default=True,
        show_default=True,
        help="Also run the no-spilling baselines: the plain dict store and, with a "
        "device limit, cudask without one.",
    ),
    option(
        "--repeat",
        type=click.IntRange(min=1),
        default=3,
        show_default=True,
        help="Measured repetitions (median reported); for startup and --mode cold "
        "each is a fresh process, the configurations taking turns.",
    ),
    option(
        "--warmup",
        type=click.IntRange(min=0),
        default=None,
        show_default=False,
        help="Unmeasured repetitions first.",
    ),
    option("--device", default="0", show_default=True, help="The GPU to use: an index or a UUID."),
    option(
        "--memory-limit",
        default="auto",
        show_default=True,
        help="Host memory limit of the worker (passed to every backend).",
    ),
    option(
        "--rmm-pool-size",
        default=None,
        help="RMM pool per worker, e.g. 20GB (cudask and dask-cuda).",
    ),
    option("--protocol", type=click.Choice(["tcp", "ucx"]), default="tcp", show_default=True),
    option(
        "--array-module",
        type=click.Choice(list(spec.ARRAY_MODULES)),
        default="cupy",
        show_default=True,
        help="numpy runs the workloads on host memory: a harness check without a GPU, "
        "not a GPU benchmark (use with --backend dict). Its defaults are then small, so "
        "that a run ends within a minute: spill --total 256MiB --chunk-size 32MiB, cupy "
        "--operation dot --size 2000 --chunk-size 500, --repeat 1 and --progress.",
    ),
    option(
        "--output",
        "-o",
        "output",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write the JSON result here.",
    ),
    option(
        "--chart",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write a PNG chart here (needs matplotlib: cudask[bench]).",
    ),
    option(
        "--progress/--no-progress",
        default=False,
        show_default=True,
        help="Show a progress line on stderr.",
    ),
    option(
        "--timeout",
        type=click.FloatRange(min=1),
        default=3600.0,
        show_default=True,
        help="Seconds one runner process may take.",
    ),
)

#: COMMON's defaults that differ per command.
COMMAND_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "spill": {
        "--device-memory-limit": {"default": "4GB"},
        "--warmup": {"help": warmup_help("spill")},
    },
    "cupy": {
        "--device-memory-limit": {"default": "4GB"},
        "--warmup": {"help": warmup_help("cupy")},
    },
    "startup": {"--repeat": {"default": 5}, "--warmup": {"default": 1, "show_default": True}},
}

#: --mode, --warm-runs and --processes of spill and cupy.
MODE: tuple[Option, ...] = (
    option(
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
    option(
        "--warm-runs",
        type=click.IntRange(min=0),
        default=spec.DEFAULT_WARM_RUNS,
        show_default=True,
        help=f"--mode cold: runs after the first one, in the same cluster, reported as "
        f"*{spec.WARM_SUFFIX}.",
    ),
    option(
        "--processes",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="--mode warm: fresh processes per configuration, each with the warm-up "
        "and the repetitions. The configurations take turns, so drift on the machine "
        "falls on all of them alike; medians are over every process's repetitions.",
    ),
)

SPILL: tuple[Option, ...] = (
    option(
        "--total",
        default="16GiB",
        show_default=True,
        help="Bytes of device data to create (beyond the device limit to spill; beyond "
        "the host tier too, e.g. --memory-limit 8GB, to spill on to disk).",
    ),
    option(
        "--chunk-size",
        default="256MiB",
        show_default=True,
        help="Bytes per chunk (one dask future each).",
    ),
    option(
        "--disk-size",
        default=None,
        help=f"Bytes of the disk measurement made first, on the filesystem the workers "
        f"spill to: one file written and read sequentially, buffered and with O_DIRECT, "
        f"whose GB/s each pass's disk I/O is compared with; 0: none. Default, with "
        f"--memory-limit given: {spec.DISK_SIZE['cupy']} (--array-module numpy: "
        f"{spec.DISK_SIZE['numpy']}); without: none.",
    ),
)


def _per_operation(attribute: str) -> str:
    return ", ".join(f"{k} {getattr(v, attribute)}" for k, v in spec.CUPY_OPERATIONS.items())


CUPY: tuple[Option, ...] = (
    option(
        "--operation",
        "operations",
        multiple=True,
        metavar="NAME",
        help=f"Operation(s) to run, repeatable or comma-separated; default all: "
        f"{', '.join(spec.CUPY_OPERATIONS)}.",
    ),
    option(
        "--size",
        type=click.IntRange(min=16),
        default=None,
        help="Array size n of n x n (svd: rows). Default per operation: "
        + _per_operation("size")
        + ".",
    ),
    option(
        "--chunk-size",
        "array_chunk",
        type=click.IntRange(min=1),
        default=None,
        help="Chunk size in elements per dimension (svd: rows). Default per operation: "
        + _per_operation("chunk")
        + ".",
    ),
    option(
        "--second-size",
        type=click.IntRange(min=1),
        default=None,
        help="svd: number of columns (default 1000).",
    ),
)

SOAK: tuple[Option, ...] = (
    option(
        "--duration",
        default="120s",
        show_default=True,
        help="How long to draw steps: seconds or a time such as '5 minutes'.",
    ),
    option(
        "--device-memory-limit",
        default="1GiB",
        show_default=True,
        help="Device limit of each worker (small, so data keep moving).",
    ),
    option(
        "--memory-limit",
        default="4GiB",
        show_default=True,
        help="Host memory limit of each worker.",
    ),
    option(
        "--host-fraction",
        default=0.25,
        show_default=True,
        type=float,
        help="distributed.worker.memory.target for the run: the host tier's share of "
        "--memory-limit before data go to disk.",
    ),
    option(
        "--max-held",
        default="3GiB",
        show_default=True,
        help="Most bytes held by the client at once (creates turn into deletes above).",
    ),
    option(
        "--kill-every",
        default="20s",
        show_default=True,
        help="Least time between two worker kills (SIGKILL); 0: no kills.",
    ),
    option(
        "--min-kills",
        default=0,
        show_default=True,
        type=click.IntRange(min=0),
        help="Kills the soak must make: it goes on past --duration (killing only) until "
        "this many happened, for at most 10 minutes more. Needs --kill-every above 0.",
    ),
    option("--seed", default=0, show_default=True, type=int, help="Seed of the steps drawn."),
    option(
        "--n-workers",
        default=None,
        type=click.IntRange(min=1),
        help="Workers (one per GPU); default: every visible GPU.",
    ),
    option("--jit-unspill/--no-jit-unspill", default=False, show_default=True),
    option(
        "--output",
        "-o",
        type=click.Path(dir_okay=False),
        default=None,
        help="JSON file to write the report to, with the machine and versions.",
    ),
)

TRANSFER: tuple[Option, ...] = (
    option(
        "--placement",
        default=None,
        help="The GPUs of each worker process, comma-separated, '+' joining the GPUs of "
        "one process (a worker per GPU, the others visible to it): '0+1' one process over "
        "GPUs 0 and 1, as `dask cuda worker` on a node or LocalCUDACluster; '0,1' a "
        "process per GPU, each seeing its own alone; '0,0' two workers on GPU 0. "
        "Default: '0+1' with two or more GPUs, else '0,0'.",
    ),
    option(
        "--sizes",
        default="64MiB,512MiB,2GiB",
        show_default=True,
        help="Array sizes sent point to point, comma-separated.",
    ),
    option(
        "--repeat",
        default=3,
        show_default=True,
        type=click.IntRange(min=0),
        help="Warm transfers of each size after the cold one.",
    ),
    option(
        "--n",
        "side",
        default=20000,
        show_default=True,
        type=click.IntRange(min=2),
        help="Side of the float64 array rechunked all-to-all (20000: 3.2 GB).",
    ),
    option(
        "--blocks",
        default=8,
        show_default=True,
        type=click.IntRange(min=1),
        help="Row blocks rechunked into as many column blocks.",
    ),
    option(
        "--shuffle-rows",
        default=None,
        type=click.IntRange(min=0),
        help="Rows of the dask-cuDF DataFrame shuffled on a key (16 bytes each; 0: no "
        "shuffle). Default: 50000000 when dask-cuDF is installed, else 0.",
    ),
    option(
        "--shuffle-methods",
        default="tasks,p2p,explicit",
        show_default=True,
        help="Shuffle methods to run, comma-separated: tasks, p2p, explicit (cudask's "
        "explicit-comms shuffle).",
    ),
    option(
        "--device-memory-limit",
        default="30GB",
        show_default=True,
        help="Device limit of each worker.",
    ),
    option(
        "--rmm-pool-size",
        default=None,
        help="RMM pools of each worker, comma-separated, 'none' for none: every setting "
        "runs with each (e.g. 'none,40GB'; default: no pool), cudask's and dask-cuda's "
        "alike, CuPy allocating from it (--set-rmm-allocator-for-libs cupy). A cudask "
        "worker keeps a peer's pool slab mapped between transfers (cudask.comm.lifetimes).",
    ),
    option(
        "--protocols",
        default="auto",
        show_default=True,
        help="Comma-separated: tcp (cudask with CUDA IPC on, also without pinning ahead of "
        "spills, without a staging area, with gc_freeze, with spill-target 0.9 and without "
        "spilling on demand, and off), ucx (cudask over UCX; needs distributed-ucxx); auto: tcp, and "
        "ucx where distributed-ucxx is installed. dask-cuda runs over each with --against.",
    ),
    option(
        "--settings",
        "only",
        default=None,
        help="Run only these settings, comma-separated (e.g. 'cudask-ipc,dask-cuda-ucx'); "
        "default: every one the protocols and --against give.",
    ),
    option(
        "--rounds",
        default=2,
        show_default=True,
        type=click.IntRange(min=1),
        help="Rounds: each runs every setting once, each in a fresh cluster (cold, then "
        "warm), the order rotated by one setting each round.",
    ),
    option(
        "--warm-runs",
        default=1,
        show_default=True,
        type=click.IntRange(min=1),
        help="All-to-all runs after the cold one in each fresh cluster, measured (unlike "
        "--warmup's); a round's warm figure is the run of their median time.",
    ),
    option(
        "--warmup",
        default=1,
        show_default=True,
        type=click.IntRange(min=0),
        help="Runs of the first round's first setting before the rounds, in fresh "
        "clusters, left out of the figures: the machine's first-use costs (driver, page "
        "cache) fall on them, not on whichever setting comes first.",
    ),
    option(
        "--budget",
        default=0.0,
        show_default=True,
        type=click.FloatRange(min=0),
        help="Seconds after which no further setting starts (0: no limit); the ones left "
        "are recorded as skipped. The JSON file is rewritten after each setting.",
    ),
    option(
        "--against",
        type=click.Choice(["dask-cuda"]),
        default=None,
        help="Also run dask-cuda's workers (`python -m dask_cuda.cli`) in the same run.",
    ),
    option(
        "--dask-cuda-python",
        default=None,
        help="Python interpreter where dask-cuda is installed (default: this one).",
    ),
    option(
        "--dask-cuda-path",
        default=None,
        help="Directory where dask-cuda is installed (pip install --target), put on PYTHONPATH.",
    ),
    option(
        "--output",
        "-o",
        type=click.Path(dir_okay=False),
        default=None,
        help="JSON file to write the report to, with the machine and versions; the "
        "workers' logs go beside it (transfer-SETTING/).",
    ),
)

CHART: tuple[Option, ...] = (
    option(
        "--output",
        "-o",
        "output",
        type=click.Path(dir_okay=False),
        required=True,
        help="PNG file to write.",
    ),
    option(
        "--table/--no-table",
        default=True,
        show_default=True,
        help="Also print the result as a table.",
    ),
)


__all__ = [
    "CHART",
    "COMMAND_DEFAULTS",
    "COMMON",
    "CUPY",
    "MODE",
    "SOAK",
    "SPILL",
    "TRANSFER",
    "Option",
    "option",
    "warmup_help",
    "with_options",
]
