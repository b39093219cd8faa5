"""`cudask bench soak`: minutes of random work and worker kills, then every key checked.

Covers: the command: its checks (times, sizes, the host fraction, --min-kills against
--kill-every and --duration, in option names; a GPU and CuPy), a progress line on a
terminal, the one-line report, the JSON file, exit status 1 when a key was lost or
changed. Does not cover: the soak itself (cudask_bench.soak), its options
(cudask_bench.cli.soak_options). Threading: the command's thread.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from cudask.errors import NoGPUError, OptionError
from cudask_bench import environment, harness
from cudask_bench import soak as soak_run
from cudask_bench.cli.options import with_options
from cudask_bench.cli.plan import command, size
from cudask_bench.cli.soak_options import SOAK
from cudask_bench.report import write_json


def _seconds(kw: dict[str, Any]) -> dict[str, float]:
    from dask.utils import parse_timedelta

    seconds: dict[str, float] = {}
    for name in ("duration", "kill_every"):
        try:
            seconds[name] = float(parse_timedelta(kw[name], default="seconds") or 0)
        except (ValueError, KeyError, TypeError):
            raise click.BadParameter(
                f"{kw[name]!r} is not a time; accepted: seconds or a "
                "time such as '90s', '5m', '5 minutes'",
                param_hint=f"--{name.replace('_', '-')}",
            ) from None
    if seconds["duration"] <= 0:
        raise click.BadParameter(
            f"{kw['duration']!r} must be more than 0 seconds", param_hint="--duration"
        )
    return seconds


def _plan(kw: dict[str, Any]) -> soak_run.SoakPlan:
    """The soak's plan from the options, every value checked and named as an option."""
    seconds = _seconds(kw)
    if not 0 < kw["host_fraction"] <= 1:
        raise click.BadParameter(
            f"{kw['host_fraction']!r}; accepted: a fraction in (0, 1]", param_hint="--host-fraction"
        )
    sizes: dict[str, int | None] = {}
    for name in ("device_memory_limit", "memory_limit", "max_held"):
        try:
            sizes[name] = value = size(kw[name], "--" + name.replace("_", "-"))
        except OptionError as exc:
            raise click.UsageError(str(exc)) from None
        if not value:
            raise click.BadParameter(
                f"{kw[name]!r}; accepted: a size above 0 such as '1GiB'",
                param_hint="--" + name.replace("_", "-"),
            )
    try:
        return soak_run.SoakPlan(
            duration=seconds["duration"],
            device_memory_limit=int(sizes["device_memory_limit"] or 0),
            memory_limit=int(sizes["memory_limit"] or 0),
            host_fraction=kw["host_fraction"],
            max_held=int(sizes["max_held"] or 0),
            kill_every=seconds["kill_every"],
            min_kills=kw["min_kills"],
            seed=kw["seed"],
            n_workers=kw["n_workers"],
            jit_unspill=kw["jit_unspill"],
        )
    except ValueError as exc:  # --min-kills against --kill-every and --duration, in option names
        said = str(exc).replace("min_kills", "--min-kills").replace("kill_every", "--kill-every")
        raise click.UsageError(said.replace("duration", "--duration")) from None


def _echo(report: dict[str, Any]) -> None:
    moved = sum(report["bytes_moved"].values())
    click.echo(
        f"soak: {report['cycles']} steps in {report['seconds']} s, {report['kills']} kills, "
        f"{report['bytes_created'] / 2**30:.1f} GiB created, {moved / 2**30:.1f} GiB moved "
        f"between tiers; keys checked {report['keys_checked']}, lost "
        f"{report['keys_lost']}, changed {report['keys_changed']}; reads "
        f"{report['reads_checked']}, differing {report['reads_differing']}"
    )
    for line in report["errors"][:5]:
        click.echo(f"  {line}")


@click.command("soak")
@with_options(SOAK)
@command
def soak(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Random create / read / combine / spill / delete / worker-kill steps for a bounded
    time at a small device limit; then every held key is checked byte for byte.

    Reports steps, bytes created and moved between tiers, kills, and keys
    checked, lost and changed. Exit status 1 when any key was lost or changed.
    """
    plan = _plan(kw)
    gpus = environment.gpus()
    if not gpus.get("available"):
        raise NoGPUError(
            f"cudask bench soak needs an NVIDIA GPU and NVML finds none ({gpus.get('reason')})"
        )
    if not environment.has_module("cupy"):
        raise click.ClickException("cudask bench soak needs CuPy: pip install 'cudask[cuda]'")
    progress = harness.ProgressLine(enabled=sys.stderr.isatty())

    def show(elapsed: float, counts: Any) -> None:
        progress.update(
            "soak",
            f"{counts['kill'] - counts['kill-missed']} kills",
            int(elapsed),
            int(plan.duration),
            f"s, {sum(counts.values())} steps",
        )

    report = soak_run.run_soak(plan, progress=show)
    progress.finish("soak: done")
    document = {
        "workload": "soak",
        "report": report,
        "machine": environment.machine(),
        "versions": environment.versions(),
    }
    if kw["output"]:
        write_json(document, kw["output"])
    _echo(report)
    if not report["ok"]:
        ctx.exit(1)


__all__ = ["soak"]
