"""How `cudask bench` commands declare their options as data, and turn them into click's.

Covers: `Option`, one click option as its flag declarations and keyword arguments, and
`option(*decls, **attrs)`, which makes one; `with_options(options, overrides)`, the
decorator that turns a list of them into click options in the order listed (what
`--help` shows), with per-command overrides of keyword arguments (a default, a help
text), refusing overrides of a flag not in the list. The lists themselves live per
command family: cudask_bench.cli.workload_options (spill, cupy, startup),
soak_options, transfer_options and chart_options. Does not cover: what any command
takes, checking the values (cudask_bench.cli.plan and the commands). Threading:
immutable module data; the decorator runs at import, in the importing thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

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


__all__ = ["Option", "option", "with_options"]
