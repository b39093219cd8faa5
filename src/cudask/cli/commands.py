"""The `cudask` command group and the `dask cudask` / `dask cuda` command groups.

Covers: wiring subcommands together. `cudask worker`/`cudask config`/`cudask top`/
`cudask kubernetes`, `dask cudask worker|config|top|kubernetes` and `dask cuda
worker|config|top|kubernetes` (through dask's `dask_cli` entry points) are the same
commands; `python -m cudask.cli worker` works too. `cudask bench` lives in the
cudask_bench package and is attached by name (cudask.cli.lazy): it is imported only when
`cudask bench ...` runs, never by another command. Does not cover: the commands (one
module each), the entry point that runs the group (cudask.cli.main), nor when `dask cuda`
is cudask's rather than dask-cuda's (cudask.cli.dask_cli decides). Threading: click runs
a command in the calling thread.
"""

from __future__ import annotations

import shutil

import click

from cudask.cli.alias import alias
from cudask.cli.cluster_config import config
from cudask.cli.demo import demo
from cudask.cli.info import info
from cudask.cli.kube_manifest import kubernetes
from cudask.cli.lazy import LazyCommand, LazyGroup
from cudask.cli.top import top
from cudask.cli.user_errors import UserErrorGroup
from cudask.cli.worker import worker

#: Subcommands of `cudask` from other packages of the distribution, imported when they run.
LAZY_COMMANDS = (
    LazyCommand(
        "bench",
        "cudask_bench.cli:bench",
        "Benchmarks: spilling, CuPy dask.array workloads, cluster start-up, soak, "
        "device data between workers (transfer).",
    ),
)


@click.group(
    cls=LazyGroup, lazy=LAZY_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="cudask")
def cli() -> None:
    """cudask: one dask.distributed worker per NVIDIA GPU."""


@click.group(cls=UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cuda() -> None:
    """GPU workers for dask (cudask; the same as `dask cudask`)."""


@click.group("cudask", cls=UserErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
def dask_cudask() -> None:
    """GPU workers for dask (cudask), also beside dask-cuda."""


cli.add_command(info)
cli.add_command(demo)
cli.add_command(alias)


@cli.command("options")
@click.option(
    "--markdown", is_flag=True, help="Print the Markdown table of docs/options.md instead."
)
def options_command(markdown: bool) -> None:
    """List the worker options: keyword, flag, default and meaning of each."""
    if markdown:
        from cudask.options import reference

        click.echo(reference(), nl=False)
        return
    from cudask.cli.flags import listing

    width = min(shutil.get_terminal_size((100, 24)).columns, 100)
    click.echo(listing(width - 2), nl=False)


for command in (worker, config, top, kubernetes):
    cli.add_command(command)
    cuda.add_command(command)
    dask_cudask.add_command(command)
