"""One declared option, and how one value given for it is read.

Covers: `Option` (name, kind, default, help, validation bounds, where it appears)
and `coerce`, which checks one value's type and form and turns it into its
canonical form: booleans by the one rule of cudask.config.as_bool, whole numbers
within bounds (digits only where the value was text), durations in seconds, lists (no
empty entry), choices, paths, strings, the form of sizes and protocols; an empty value is
refused, saying what the option accepts (`accepted_text`). cudask.options declares the
table of options and the rules between them.

Does not cover: per-device sizes (cudask.worker.spec parses those against each
GPU's memory), rules that span options, or anything that starts.

Threading: pure functions of their arguments and dask.config; call them from any
thread.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from dask.utils import parse_timedelta

from cudask import config
from cudask.errors import OptionError
from cudask.sizes import ACCEPTED, check_size

Kind = Literal["int", "str", "path", "size", "seconds", "bool", "tristate", "list", "choice", "any"]
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


_LIST_EXAMPLES = {
    "pre_import": "'numpy,json'",
    "preload": "['cudask.monitor']",
    "rmm_allocator_external_lib_list": "'cupy,torch'",
}


def _split_list(opt: Option, value: Any) -> list[str] | None:
    """A comma-separated string or a list of strings ("" or []: none); an empty entry
    ('numpy,,json', a trailing comma, '') is refused rather than dropped."""
    if value is None or value == "" or value == []:
        return None
    accepted = (
        f"accepted: names separated by commas, or a list of names, e.g. "
        f"{opt.name}={_LIST_EXAMPLES.get(opt.name, repr('a,b'))}"
    )
    if isinstance(value, str):
        entries = [value]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict)):
        entries = list(value)
        if any(not isinstance(v, str) for v in entries):
            raise OptionError(f"{opt.name}={value!r}: every entry must be a string; {accepted}")
    else:
        raise OptionError(f"{opt.name}={value!r} is not a list; {accepted}")
    items = [item.strip() for entry in entries for item in entry.split(",")]
    if not all(items):
        raise OptionError(f"{opt.name}={value!r} has an empty entry; {accepted}")
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


def _int(opt: Option, value: Any, text: bool) -> int:
    """A whole number within the option's bounds; digits as text too where `text` (a
    flag, an environment variable or a config file), not as a keyword."""
    if text and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    example = f"e.g. {opt.name}={max(opt.minimum or 0, 1)}"
    if isinstance(value, bool) or not isinstance(value, int):
        what = (
            "not an integer but a string"
            if isinstance(value, str) and not text
            else "not an integer"
        )
        raise OptionError(
            f"{opt.name}={value!r} is {what}; accepted: a whole number{_bounds(opt)}, {example}"
        )
    if opt.minimum is not None and value < opt.minimum:
        raise OptionError(
            f"{opt.name}={value!r} must be at least {opt.minimum}; accepted: a "
            f"whole number{_bounds(opt)}, {example}"
        )
    if opt.maximum is not None and value > opt.maximum:
        raise OptionError(
            f"{opt.name}={value!r} must be at most {opt.maximum}; accepted: a "
            f"whole number{_bounds(opt)}, {example}"
        )
    return value


_EXAMPLES = {
    "protocol": "tcp",
    "interface": "eth0",
    "host": "10.0.0.1",
    "worker_port": "9000:9003",
    "listen_address": "tcp://0.0.0.0:9000",
    "contact_address": "tcp://node1:9000",
    "dashboard_address": ":8787",
    "dashboard_prefix": "/worker",
    "name": "node1",
    "resources": "GPU=1 MEM=10e9",
    "death_timeout": "60s",
    "worker_class": "distributed.Worker",
    "tls_ca_file": "/etc/dask/ca.pem",
    "tls_cert": "/etc/dask/worker.pem",
    "tls_key": "/etc/dask/worker-key.pem",
}


def _example(opt: Option) -> str:
    return _EXAMPLES.get(opt.name, "value")


def accepted_text(opt: Option) -> str:
    """What `opt` accepts, for messages."""
    if opt.kind == "size":
        return ACCEPTED
    if opt.kind == "int":
        return f"a whole number{_bounds(opt)}, e.g. {opt.name}={max(opt.minimum or 0, 1)}"
    if opt.kind == "path":
        return f"a path, e.g. {opt.name}='/tmp/dask'"
    if opt.kind == "choice":
        return f"{', '.join(opt.choices)}, e.g. {opt.name}={opt.choices[0]!r}"
    return f"a value, e.g. {opt.name}={_example(opt)!r}"


def coerce(opt: Option, value: Any, *, text: bool = True) -> Any:
    """Check one value's type and turn it into its canonical form (sizes stay
    unparsed: they are parsed per device). `text`: the value was written as text (a
    flag, an environment variable, a config file), so digits are a number; a keyword
    given '2' for a count is refused, as n_workers='2' is."""
    if (
        isinstance(value, str)
        and not value.strip()
        and opt.kind not in ("list", "bool", "tristate")
    ):
        raise OptionError(
            f"{opt.name}={value!r} is empty; accepted: {accepted_text(opt)}; "
            "leave it out for the default"
        )
    if opt.kind in ("bool", "tristate"):
        if value is None and opt.kind == "tristate":
            return None
        flag = config.as_bool(value)
        if flag is None:
            raise OptionError(
                f"{opt.name}={value!r} is not a boolean; accepted: "
                f"{config.BOOL_ACCEPTED}, e.g. {opt.name}=True"
            )
        return flag
    if opt.kind == "int":
        return _int(opt, value, text)
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
            raise OptionError(
                f"{opt.name}={value!r} is not a path; accepted: a string or "
                f"os.PathLike, e.g. {opt.name}='/tmp/dask'"
            )
        return os.fspath(value)
    if opt.kind == "str" and value is not None and not isinstance(value, str):
        raise OptionError(
            f"{opt.name}={value!r} is not a string; accepted: a string, e.g. "
            f"{opt.name}={_example(opt)!r}"
        )
    if opt.kind == "size" and value is not None:
        _check_size(opt, value)
    if opt.kind == "seconds" and value is not None:
        return _seconds(opt, value)
    if opt.name == "protocol" and value is not None:
        return _protocol(value)
    return value


def _seconds(opt: Option, value: Any) -> float:
    """A duration given as seconds (60, 2.5) or as dask writes one ("90s", "2 minutes")."""
    try:
        seconds = parse_timedelta(value, default="seconds") if not isinstance(value, bool) else None
    except (TypeError, ValueError, KeyError):
        seconds = None
    if seconds is None or not 0 < seconds < math.inf:
        raise OptionError(
            f"{opt.name}={value!r} is not a duration; accepted: seconds above 0 "
            f"or a string such as '90s' or '2 minutes', e.g. {opt.name}=60"
        )
    return float(seconds)


def _check_size(opt: Option, value: Any) -> None:
    """The form of a size ("banana", -1, 1.5 are refused); what a fraction or "auto"
    comes to is worked out per device (device sizes) or per host (memory_limit) later."""
    if opt.name == "memory_limit":
        if isinstance(value, str) and value.strip().lower() == "default":
            raise OptionError(
                f"memory_limit={value!r} is not accepted; accepted: bytes, a byte "
                "string such as '40GB', a fraction of system memory such as 0.5, "
                "'auto' or 0/None for no limit"
            )
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
        raise OptionError(
            f"protocol={value!r} is not a known protocol; accepted: "
            f"{', '.join(accepted)} (e.g. protocol='tcp')"
        )
    return name
