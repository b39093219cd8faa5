"""`cudask bench chart`: a PNG chart (and the table) from a result file written by --output.

Covers: reading and recognising a result file (its `format`), printing its table,
drawing its chart captioned with that file's name as given; a file that is not a result
ends in one line. Does not cover: the
drawing (cudask_bench.chart). Threading: the command's thread.
"""

from __future__ import annotations

import json

import click

from cudask_bench import spec
from cudask_bench.cli.chart_options import CHART
from cudask_bench.cli.options import with_options
from cudask_bench.report import format_table


@click.command("chart")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@with_options(CHART)
def chart(results: str, output: str, table: bool) -> None:
    """Draw a chart (and print the table) from a result JSON written by --output."""
    from cudask_bench.chart import Origin, write_chart

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
        click.echo(format_table(document))
    try:
        write_chart(document, output, Origin.of_file(results))
    except ValueError as exc:
        raise click.ClickException(f"{results}: {exc}") from None
    click.echo(f"chart: {output}")


__all__ = ["chart"]
