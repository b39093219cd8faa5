"""The entry point of the `cudask` command (and `python -m cudask.cli`).

Covers: `main()`, which first has dask read its config files (DASK_CONFIG,
~/.config/dask, /etc/dask): a file that YAML cannot read, or whose top level is no
mapping, is said on one line naming the file and where it breaks, exit status 2, for
every command and `--help` alike (dask raises on it when imported, so nothing that
imports dask can say it); then it runs the command group (cudask.cli.commands). The
groups `cli`, `cuda` and `dask_cudask` are also reachable here by name, for
`cudask.cli.dask_cli` and for code that imports them from this module. Importing this
module imports neither dask nor the commands.

Does not cover: the commands and their groups (cudask.cli.commands), bad values inside a
readable config file (each command's checks). Threading: the calling thread.
"""

from __future__ import annotations

import re
import sys
from typing import Any

#: The start of dask's error for a config file it cannot read (dask.config._load_config_file).
_UNREADABLE = re.compile(r"A dask config file at (?P<path>'.*?'|\".*?\") is malformed")
_GROUPS = ("cli", "cuda", "dask_cudask", "LAZY_COMMANDS")


def config_file_error() -> str | None:
    """Why dask cannot read one of its config files, on one line naming the file, or
    None when it reads them all. Imports dask, which reads them."""
    try:
        import dask.config  # noqa: F401
    except ValueError as exc:
        found = _UNREADABLE.match(str(exc))
        if found is None:
            raise
        return _explain(found.group("path")[1:-1], str(exc))
    return None


def _explain(path: str, message: str) -> str:
    """The reason a config file is unreadable: where YAML stops, or what dask found."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            yaml.safe_load(f)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        reason = f"not YAML ({where}{exc.problem or exc.context})"
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text (byte {exc.start}: {exc.reason})"
    except (OSError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
    else:  # read, but not a mapping at the top
        reason = message.split(" - ", 1)[-1].replace("config files must", "a config file must")
    return (
        f"the dask config file {path} cannot be read: {reason}; accepted: a YAML mapping "
        "such as 'cudask: {worker: {device-memory-limit: 0.8}}'. Fix the file, or move it "
        "out of the folders dask reads (DASK_CONFIG, ~/.config/dask, /etc/dask)"
    )


def main() -> None:
    """Run `cudask` once dask has read its config files."""
    problem = config_file_error()
    if problem is not None:
        print(f"Error: {problem}", file=sys.stderr)
        sys.exit(2)
    from cudask.cli.commands import cli

    cli()


def __getattr__(name: str) -> Any:
    if name in _GROUPS:
        from cudask.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
