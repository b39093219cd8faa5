"""How the worker options read on a command line: their help, and `--help` in sections.

Covers: `help_text(opt)`, an option's declared help (cudask.options) with the other
options it names written as their flags ("needs rmm_async" -> "needs --rmm-async"),
as `dask cuda worker --help` names them; `SectionedCommand`, a click command whose
`--help` lists its options under titled sections, each in declaration order: the
worker options by their group (cudask.options.GROUPS), other options under the
titles the command gives, and the rest (--help) last; `listing()`, the options as
`cudask options` prints them for a terminal. Does not cover: the options themselves,
docs/options.md (cudask.options.reference), error messages (each command's).
Threading: pure functions; click formats help in the command's thread.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from typing import Any

import click

from cudask.options import BY_NAME, GROUPS, OPTIONS, Option

COLUMN = 30  # click's widest column of flags (longer ones get a line of their own)
_KEYWORD = re.compile(r"(?<![\w.\-'=])([a-z]+(?:_[a-z0-9]+)+)(?![\w'(])")


def help_text(opt: Option) -> str:
    """`opt.help` with option keywords written as flags."""

    def flag(m: re.Match[str]) -> str:
        other = BY_NAME.get(m.group(1))
        return other.cli_flag if other is not None else m.group(0)

    return _KEYWORD.sub(flag, opt.help)


class SectionedCommand(click.Command):
    """A click command whose --help groups its options: worker options (by
    parameter name) under their group's title, others under `sections[name]`."""

    def __init__(
        self, *args: Any, sections: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sections = dict(sections or {})

    def _title(self, name: str | None) -> str:
        if name in self.sections:
            return self.sections[name]
        opt = BY_NAME.get(name or "")
        return GROUPS[opt.group] if opt is not None else "Other options"

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        titles = [*dict.fromkeys(self.sections.values()), *GROUPS.values(), "Other options"]
        rows: dict[str, list[tuple[str, str]]] = {title: [] for title in titles}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                rows[self._title(param.name)].append(record)
        # one column for the flags of every section, as one list would have
        width = min(max((len(flag) for r in rows.values() for flag, _ in r), default=0), COLUMN)
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(
                        [(flag.ljust(width), text) for flag, text in records], col_max=COLUMN
                    )


def listing(width: int = 100) -> str:
    """The worker options for a terminal (`cudask options`): by section, each with its
    keyword, flag and default on one line and its meaning wrapped beneath."""
    rows = [(opt, _keyword(opt), _flags(opt), _default(opt)) for opt in OPTIONS]
    kw_width = max(len(r[1]) for r in rows) + 2
    flag_width = max(len(r[2]) for r in rows) + 2
    lines = [
        "Worker options: the LocalCUDACluster keyword, the `cudask worker` flag and the",
        "default of each (* CUDAWorker and `cudask worker` only). Defaults come from the",
        "cudask.worker config (cudask.yaml; DASK_CUDASK__WORKER__<NAME> variables set them).",
        "`cudask options --markdown` prints docs/options.md.",
    ]
    for group, title in GROUPS.items():
        lines += ["", f"{title}:"]
        for opt, keyword, flags, default in (r for r in rows if r[0].group == group):
            head = f"  {keyword:<{kw_width}}{flags:<{flag_width}}"
            lines.append(
                head + default
                if len(head) <= 2 + kw_width + flag_width
                else f"{head.rstrip()}  {default}"
            )
            also = "".join(f" (also {flag})" for flag in opt.extra_flags)
            lines += textwrap.wrap(
                help_text(opt) + also,
                width=width,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
            )
    return "\n".join(lines) + "\n"


def _keyword(opt: Option) -> str:
    if "cluster" not in opt.surfaces:
        return opt.name + "*"
    if opt.cluster_keyword != opt.name:
        return f"{opt.cluster_keyword} ({opt.name})"
    return opt.name


def _flags(opt: Option) -> str:
    return opt.cli_flag + (f" / {opt.secondary}" if opt.secondary else "")


def _default(opt: Option) -> str:
    value = opt.default_value()
    return "-" if value is None else str(value)


__all__ = ["COLUMN", "SectionedCommand", "help_text", "listing"]
