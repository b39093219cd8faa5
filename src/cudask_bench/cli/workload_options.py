"""The options of `cudask bench spill`, `cupy` and `startup`, declared once as data.

Covers: COMMON, what all three take (backends, dask-cuda beside cudask, the device and
host limits, JIT-unspill, baselines, repetitions and warm-ups, the GPU, RMM, protocol,
array module, output, chart, progress and timeout); COMMAND_DEFAULTS, COMMON's defaults
and help texts that differ per command (`warmup_help` writes --warmup's, whose default
follows --mode); MODE, the cold and warm modes of spill and cupy; SPILL and CUPY, each
workload's own sizes and operations, their defaults named from cudask_bench.spec.
Does not cover: turning the lists into click options (cudask_bench.cli.options), checking
the values (cudask_bench.cli.plan and cudask_bench.cli.workloads), the other commands'
options (cudask_bench.cli.soak_options, transfer_options, chart_options). Threading:
immutable module data, built at import.
"""

from __future__ import annotations

from typing import Any

import click

from cudask_bench import spec
from cudask_bench.cli.options import Option, option


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


__all__ = ["COMMAND_DEFAULTS", "COMMON", "CUPY", "MODE", "SPILL", "warmup_help"]
