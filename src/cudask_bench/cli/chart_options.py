"""The options of `cudask bench chart`, declared once as data.

Covers: CHART, the chart command's options beside its RESULTS argument, in the order
`--help` shows them: --output/-o, the PNG file to write (required: the command has
nothing else to make), and --table/--no-table, whether the result is also printed as
a table (on by default). Declared here as data, as the spill, cupy, startup, soak and
transfer options are in their own modules, so that one decorator
(`with_options`) builds every command's click options the same way. Does not cover:
turning the list into click options (cudask_bench.cli.options), reading the result
file and drawing the chart (cudask_bench.cli.chart, cudask_bench.chart), the other
commands' options. Threading: immutable module data, built at import.
"""

from __future__ import annotations

import click

from cudask_bench.cli.options import Option, option

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


__all__ = ["CHART"]
