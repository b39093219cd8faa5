"""One declared option, and how one value given for it is read.

Covers: `Option` (name, kind, default, help, validation bounds, where it appears)
and `coerce`, which checks one value's type and form and turns it into its
canonical form: booleans by the one rule of cudask.config.as_bool, whole numbers
within bounds, lists, choices, paths, strings, the form of sizes and protocols.
cudask.options declares the table of options and the rules between them.

Does not cover: per-device sizes (cudask.worker.spec parses those against each
GPU's memory), rules that span options, or anything that starts.

Threading: pure functions of their arguments and dask.config; call them from any
thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from cudask import config
from cudask.errors import OptionError
from cudask.sizes import check_size

Kind = Literal["int", "str", "path", "size", "bool", "tristate", "list", "choice", "any"]
Surface = Literal["cluster", "worker", "cli"]

ALL: frozenset[Surface] = frozenset({"cluster", "worker", "cli"})
UCX_PROTOCOLS = ("ucx", "ucxx")


@dataclass(frozen=True)
class Option:
    """One option. `name` is the keyword; the flag is derived from it unless
    given. A `config` key under `cudask.worker` holds the default; `group` is the
    section of `cudask worker --help` it is listed in (cudask.options.GROUPS)."""

    name: str
    kind: Kind
    help: str
    config: str | None = None
    default: Any = None
    flag: str | None = None
    secondary: str | None = None  # the "off" flag of a boolean: --no-x / --disable-x
    choices: tuple[str, ...] = ()
    surfaces: frozenset[Surface] = ALL
    cluster_name: str | None = None  # LocalCUDACluster's keyword where it differs
    group: str = "workers"
    minimum: int | None = None
    maximum: int | None = None
    extra_flags: tuple[str, ...] = ()

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def cluster_keyword(self) -> str:
        return self.cluster_name or self.name

    def default_value(self) -> Any:
        if self.config is not None:
            return config.get(f"worker.{self.config}")
        return self.default



def _split_list(opt: Option, value: Any) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, Iterable):
        items = []
        for v in value:
            if not isinstance(v, str):
                raise OptionError(f"{opt.name}={value!r}: every entry must be a string; accepted: "
                                  "a comma-separated string or a list of strings, e.g. 'json,numpy'")
            items.extend(s.strip() for s in v.split(",") if s.strip())
    else:
        raise OptionError(
            f"{opt.name}={value!r} is not a list; give a comma-separated string such as "
            "'cupy,torch' or a list of strings"
        )
    if opt.choices:
        bad = [i for i in items if i not in opt.choices]
        if bad:
            raise OptionError(
                f"{opt.name}={value!r}: {', '.join(map(repr, bad))} not accepted; accepted: "
                f"{', '.join(opt.choices)}"
            )
    return items or None


def _bounds(opt: Option) -> str:
    if opt.minimum is not None and opt.maximum is not None:
        return f" from {opt.minimum} to {opt.maximum}"
    if opt.maximum is not None:
        return f" of at most {opt.maximum}"
    return f" of at least {opt.minimum}" if opt.minimum is not None else ""


def _int(opt: Option, value: Any) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    example = f"e.g. {opt.name}={max(opt.minimum or 0, 1)}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{opt.name}={value!r} is not an integer; accepted: a whole number"
                          f"{_bounds(opt)}, {example}")
    if opt.minimum is not None and value < opt.minimum:
        raise OptionError(f"{opt.name}={value!r} must be at least {opt.minimum}; accepted: a "
                          f"whole number{_bounds(opt)}, {example}")
    if opt.maximum is not None and value > opt.maximum:
        raise OptionError(f"{opt.name}={value!r} must be at most {opt.maximum}; accepted: a "
                          f"whole number{_bounds(opt)}, {example}")
    return value


_EXAMPLES = {"protocol": "tcp", "interface": "eth0", "host": "10.0.0.1",
             "worker_port": "9000:9003", "listen_address": "tcp://0.0.0.0:9000",
             "contact_address": "tcp://node1:9000", "dashboard_address": ":8787"}


def _example(opt: Option) -> str:
    return _EXAMPLES.get(opt.name, "value")


def coerce(opt: Option, value: Any) -> Any:
    """Check one value's type and turn it into its canonical form (sizes stay
    unparsed: they are parsed per device)."""
    if opt.kind in ("bool", "tristate"):
        if value is None and opt.kind == "tristate":
            return None
        flag = config.as_bool(value)
        if flag is None:
            raise OptionError(f"{opt.name}={value!r} is not a boolean; accepted: "
                              f"{config.BOOL_ACCEPTED}, e.g. {opt.name}=True")
        return flag
    if opt.kind == "int":
        return _int(opt, value)
    if opt.kind == "list":
        return _split_list(opt, value)
    if opt.kind == "choice":
        if value not in opt.choices:
            raise OptionError(
                f"{opt.name}={value!r} is not accepted; accepted: {', '.join(opt.choices)}, "
                f"e.g. {opt.name}={opt.choices[0]!r}"
            )
        return value
    if opt.kind == "path" and value is not None:
        if not isinstance(value, (str, os.PathLike)):
            raise OptionError(f"{opt.name}={value!r} is not a path; accepted: a string or "
                              f"os.PathLike, e.g. {opt.name}='/tmp/dask'")
        return os.fspath(value) or None  # "" (dask-mpi's default): not given
    if opt.kind == "str" and value is not None and not isinstance(value, str):
        raise OptionError(f"{opt.name}={value!r} is not a string; accepted: a string, e.g. "
                          f"{opt.name}={_example(opt)!r}")
    if opt.kind == "size" and value is not None:
        _check_size(opt, value)
    if opt.name == "protocol" and value is not None:
        return _protocol(value)
    return value


def _check_size(opt: Option, value: Any) -> None:
    """The form of a size ("banana", -1, 1.5 are refused); what a fraction or "auto"
    comes to is worked out per device (device sizes) or per host (memory_limit) later."""
    if opt.name == "memory_limit":
        if isinstance(value, str) and value.strip().lower() == "default":
            raise OptionError(f"memory_limit={value!r} is not accepted; accepted: bytes, a byte "
                              "string such as '40GB', a fraction of system memory such as 0.5, "
                              "'auto' or 0/None for no limit")
        if isinstance(value, float) and value > 1 and value.is_integer():
            return  # a byte count given as a float (1e9), as distributed accepts
    check_size(value, name=opt.name)


def known_protocols() -> list[str]:
    """Comm backends distributed knows (tcp, tls, inproc, ws, wss, ucx, ...) and UCX's."""
    from importlib.metadata import entry_points

    from distributed.comm.registry import backends

    names = set(backends) | set(UCX_PROTOCOLS)
    names |= {e.name for e in entry_points(group="distributed.comm.backends")}
    return sorted(names)


def _protocol(value: str) -> str:
    name = value.removesuffix("://")
    accepted = known_protocols()
    if name not in accepted:
        raise OptionError(f"protocol={value!r} is not a known protocol; accepted: "
                          f"{', '.join(accepted)} (e.g. protocol='tcp')")
    return name

