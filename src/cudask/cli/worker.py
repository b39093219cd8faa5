"""`dask cuda worker` / `cudask worker`: start one worker per local GPU.

Covers: the click command, whose flags are generated from cudask.options
(declared once), and running CUDAWorker until it finishes or is interrupted.
Errors in flags, the scheduler's address, config, devices or optional libraries
are reported before any process starts, on one line with exit status 2; one from
an environment variable or a config file names it, without click's usage block.
Workers that cannot reach the scheduler within --death-timeout exit with status 1.
An address on the command line and --scheduler-file conflict; a file given beats
DASK_SCHEDULER_ADDRESS. Does not cover: the workers (cudask.deploy.node). Threading: the
command's thread runs the workers' event loop until they finish.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import click
import dask.config
from click.core import ParameterSource

from cudask import config
from cudask.cli.flags import SectionedCommand, help_text
from cudask.cli.user_errors import ConfigError
from cudask.options import BY_NAME, Option, WorkerOptions, options_for

logger = logging.getLogger("distributed.cli.cudask_worker")

SCHEDULER_HELP = (
    "Address of the scheduler, e.g. tcp://10.0.0.1:8786; or use --scheduler-file or "
    "DASK_SCHEDULER_ADDRESS."
)


def click_option(opt: Option) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option generated from one declared Option (unset -> config default).
    Values reach cudask.options as given (counts too), so that a bad one is told with
    what the option accepts."""
    default = opt.default_value()
    shown = f" [default: {default}]" if default not in (None, "", ()) else ""
    text = help_text(opt) + shown
    if opt.kind in ("bool", "tristate"):
        flags = f"{opt.cli_flag}/{opt.secondary}"
        return click.option(flags, opt.name, default=None, help=text)
    decls = [opt.cli_flag, *opt.extra_flags, opt.name]
    if opt.kind == "int":
        return click.option(*decls, type=str, default=None, metavar="INTEGER", help=text)
    if opt.kind == "choice":
        return click.option(*decls, type=click.Choice(opt.choices), default=None, help=text)
    if opt.name == "preload":
        return click.option(*decls, multiple=True, default=None, metavar="MODULE", help=text)
    metavar = {"size": "SIZE", "path": "PATH", "list": "LIST"}.get(opt.kind, "TEXT")
    return click.option(*decls, type=str, default=None, metavar=metavar, help=text)


def worker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(options_for("cli")):
        fn = click_option(opt)(fn)
    return fn


async def _run(scheduler: str | None, options: WorkerOptions) -> int:
    """Run the node's workers until they finish or a signal stops them; the exit status:
    1 when they could not reach the scheduler within --death-timeout, as `dask worker`."""
    from cudask.deploy.node import CUDAWorker

    worker = CUDAWorker.from_options(scheduler, options)  # checked already: check_flags
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker
    except TimeoutError:  # the nannies logged why and closed
        logger.info("Timed out starting the workers (death timeout %s)", options.death_timeout)
        return 1
    done = asyncio.ensure_future(worker.finished())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([done, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not done.done():
        await worker.close()
    for task in (done, stopped):
        task.cancel()
    return 0


@click.command(
    "worker",
    cls=SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.argument("scheduler", required=False, envvar="DASK_SCHEDULER_ADDRESS")
@worker_options
@click.pass_context
def worker(ctx: click.Context, scheduler: str | None, **values: Any) -> None:
    """Start one dask worker per local GPU, joined to SCHEDULER.

    GPUs are those of CUDA_VISIBLE_DEVICES (all when unset): under mpirun, set
    it from the local rank to get one worker per rank.
    """
    given = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in values.items()
        if v is not None and v != ()
    }
    origin = None
    if ctx.get_parameter_source("scheduler") is ParameterSource.ENVIRONMENT:
        origin = "environment variable DASK_SCHEDULER_ADDRESS"
        if given.get("scheduler_file"):
            scheduler = origin = None  # a file given on the command line beats the environment
    elif scheduler is None and not given.get("scheduler_file"):
        scheduler = dask.config.get("scheduler-address", None)
        origin = config.origin("scheduler-address")
    options = check_flags(given, scheduler, origin)
    if scheduler is None and not given.get("scheduler_file"):
        raise click.UsageError(
            "no scheduler: give its address (e.g. tcp://10.0.0.1:8786), "
            "--scheduler-file FILE, or set DASK_SCHEDULER_ADDRESS"
        )
    # CUDAWorker validates the rest (devices, sizes per GPU) before any process starts.
    ctx.exit(asyncio.run(_run(scheduler, options)))


def check_flags(
    given: dict[str, Any], scheduler: str | None = None, origin: str | None = None
) -> WorkerOptions:
    """Every check that needs no GPU (cudask.deploy.checks), before any GPU is looked
    for: a bad flag, config value or CUDA_VISIBLE_DEVICES is a usage error (exit 2);
    one from an environment variable or a config file says which, without click's
    usage block (cli.user_errors.ConfigError). distributed's own settings come first, before
    anything imports distributed (which reads some of them when imported)."""
    from cudask.deploy.check_config import check_distributed_config
    from cudask.errors import OptionError

    try:
        check_distributed_config()
        from cudask.deploy.checks import check_input

        return check_input(
            given,
            "cli",
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            visible_origin="environment variable CUDA_VISIBLE_DEVICES",
            scheduler=scheduler,
            scheduler_origin=origin,
        )
    except OptionError as exc:
        if exc.origin is not None:
            raise ConfigError(str(exc)) from None
        if exc.option == "scheduler":
            raise click.BadParameter(str(exc), param_hint="'SCHEDULER'") from None
        opt = BY_NAME.get(exc.option or "")
        if opt is not None and opt.name in given:
            raise click.BadParameter(str(exc), param_hint=f"'{opt.cli_flag}'") from None
        raise click.UsageError(str(exc)) from None
