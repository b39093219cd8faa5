"""The options of `cudask bench soak`, declared once as data.

Covers: SOAK, the soak's options in the order `--help` shows them: how long steps are
drawn (--duration), each worker's device and host limits and the host tier's share of
the host limit before data go to disk (--host-fraction), the most bytes the client
holds at once, how often a worker is killed and how many kills the soak must make,
the seed of the steps, the number of workers (one per GPU), JIT-unspill, and the JSON
report's path; each with its default and help text. Does not cover: turning the list
into click options (cudask_bench.cli.options), checking the values, in option names,
and running the soak (cudask_bench.cli.soak, cudask_bench.soak), the other commands'
options. Threading: immutable module data, built at import.
"""

from __future__ import annotations

import click

from cudask_bench.cli.options import Option, option

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


__all__ = ["SOAK"]
