"""The options of `cudask bench transfer`, declared once as data.

Covers: TRANSFER, the transfer benchmark's options in the order `--help` shows them:
where the workers run (--placement: a process per GPU or one over several), the sizes
sent point to point, the all-to-all rechunk's side and blocks, the dask-cuDF shuffle's
rows and methods, each worker's device limit and RMM pools, the protocols and settings
to run, the rounds, warm runs, warm-ups and time budget, dask-cuda beside cudask and
where it is installed, and the JSON report's path; each with its default and help
text. Does not cover: turning the list into click options (cudask_bench.cli.options),
checking the values and building the plan (cudask_bench.cli.transfer), the
measurements (cudask_bench.transfer), the other commands' options. Threading:
immutable module data, built at import.
"""

from __future__ import annotations

import click

from cudask_bench.cli.options import Option, option

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


__all__ = ["TRANSFER"]
