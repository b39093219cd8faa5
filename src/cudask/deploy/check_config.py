"""distributed's own settings, checked before anything starts, against distributed's schema.

Covers: `check_distributed_config`, which reads the `distributed.*` keys set in Python,
in a config file or in the environment (those that differ from distributed.yaml's
defaults, and every one a file or variable gives) and checks each against
distributed's config schema (distributed-schema.yaml): a key the schema does not know
is refused with the closest known key; a section given a plain value, or a value of
the wrong type, outside its bounds or not among its choices, is refused saying what
the schema accepts. Values are read as distributed reads them: durations also as
numbers of seconds, sizes also as numbers of bytes. Each error is one OptionError
naming the key, where it was set (cudask.config.origin) and what is accepted.

Does not cover: the `cudask.*` keys (cudask.options, cudask.deploy.checks), keys of
other namespaces (jobqueue, kubernetes). Never imports distributed, so a value that
distributed reads when imported (distributed.admin.tick.limit) is said before that.

Threading: reads two files of distributed's once (cached) and dask.config; call it
from any thread.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from cudask import config
from cudask.errors import OptionError

Node = Mapping[str, Any]

#: Sections distributed reads that its schema leaves out, or that dask renames keys into
#: (dask.config.deprecations), and whose keys are therefore not checked.
FREE_SECTIONS = ("distributed.logging", "distributed.comm.ucx", "distributed.ucx")
#: Durations and sizes whose default (null, false) does not show their form, so that
#: the schema's "string" is all that is known of them otherwise.
DURATIONS = (
    "distributed.scheduler.idle-timeout",
    "distributed.scheduler.no-workers-timeout",
    "distributed.worker.lifetime.duration",
)
SIZES = ("distributed.worker.memory.max-spill",)
SCHEMA = "distributed's config schema, distributed/distributed-schema.yaml"


@functools.cache
def _files() -> tuple[Node, Node]:
    """(the schema of `distributed`, distributed.yaml's defaults), found without
    importing distributed."""
    spec = importlib.util.find_spec("distributed")
    folder = Path(next(iter(spec.submodule_search_locations or ()))) if spec else Path()
    with open(folder / "distributed-schema.yaml") as f:
        schema = yaml.safe_load(f)["properties"]["distributed"]
    with open(folder / "distributed.yaml") as f:
        defaults = yaml.safe_load(f)["distributed"]
    return schema, defaults


def _canonical(key: str) -> str:
    return key.lower().replace("_", "-")


def _get(tree: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(tree, Mapping):
            return dask.config.no_default
        match = [k for k in tree if _canonical(str(k)) == _canonical(part)]
        if not match:
            return dask.config.no_default
        tree = tree[match[-1]]
    return tree


def _leaves(tree: Any, parts: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(path, value) of every value that is not a mapping; an empty mapping is none."""
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            yield from _leaves(value, [*parts, _canonical(str(name))])
    else:
        yield parts, tree


def _set_values() -> dict[str, tuple[list[str], Any]]:
    """Every `distributed.*` leaf set by the user: given by a config file or an
    environment variable, or set in Python to other than distributed's default."""
    _, defaults = _files()
    found: dict[str, tuple[list[str], Any]] = {}
    user = config.user_config().get("distributed", dask.config.no_default)
    if user is not dask.config.no_default:
        for parts, value in _leaves(user, []):
            found[".".join(parts)] = (parts, value)
    current = dask.config.config.get("distributed")
    if isinstance(current, Mapping):
        for parts, value in _leaves(current, []):
            if _get(defaults, parts) != value:
                found.setdefault(".".join(parts), (parts, value))
    return found


def _registered(parts: list[str]) -> bool:
    """Whether a package registered this key as a default (dask.config.defaults): one the
    schema does not know is then another package's."""
    return bool(parts) and any(
        _get(d, ["distributed", *parts]) is not dask.config.no_default
        for d in dask.config.defaults
        if isinstance(d, Mapping)
    )


def _schema_keys(node: Node, prefix: str) -> Iterator[str]:
    for name, child in (node.get("properties") or {}).items():
        yield f"{prefix}.{name}"
        yield from _schema_keys(child, f"{prefix}.{name}")


def check_distributed_config() -> None:
    """Every `distributed.*` key set by the user known to distributed's schema, and
    its value accepted by it; OptionError otherwise (its `origin` says where)."""
    schema, defaults = _files()
    for dotted, (parts, value) in sorted(_set_values().items()):
        key = "distributed" + (f".{dotted}" if dotted else "")
        if key.startswith(FREE_SECTIONS):
            continue
        node: Node = schema
        for depth, part in enumerate(parts):
            children = {_canonical(k): v for k, v in (node.get("properties") or {}).items()}
            if (
                not children
                and node.get("type") == "object"
                or part not in children
                and _registered(parts)
            ):
                break  # inside a free-form mapping (nanny.environ, ...), or another package's
            if part not in children:
                _unknown(key, value, "distributed." + ".".join(parts[: depth + 1]), schema)
            node = children[part]
        else:
            if "properties" in node:
                _refuse(
                    key,
                    value,
                    f"{key} is a section of keys such as "
                    f"{next(_schema_keys(node, key))}, not a value; accepted: a mapping "
                    "of its keys",
                )
            default = _get(defaults, parts)
            if value != default and not _accepts(node, value, _kind(key, default)):
                described = _describe(node, _kind(key, default))
                example = (
                    ""
                    if default is dask.config.no_default
                    else f", e.g. its default {key}={default!r}"
                )
                _refuse(
                    key,
                    value,
                    f"{key}={value!r} is not accepted; accepted: {described}{example} ({SCHEMA})",
                )


def _unknown(key: str, value: Any, at: str, schema: Node) -> None:
    known = list(_schema_keys(schema, "distributed"))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) or difflib.get_close_matches(
        at, known, n=1, cutoff=0.6
    )
    hint = f"did you mean {close[0]}?" if close else "no known key is close"
    _refuse(key, value, f"unknown config key {key}; {hint} (accepted: the keys of {SCHEMA})")


def _refuse(key: str, value: Any, message: str) -> None:
    where = config.origin(key, value) or f"config key {key}"
    text = message if where.startswith("config key ") else f"{where}: {message}"
    raise OptionError(text, origin=where)


def _kind(key: str, default: Any) -> str:
    """ "duration" or "size" for a string key whose default is one (or that is a
    known duration), else ""."""
    if key in DURATIONS:
        return "duration"
    if key in SIZES:
        return "size"
    if not isinstance(default, str):
        return ""
    for kind, parse in (("duration", parse_timedelta), ("size", parse_bytes)):
        try:
            parse(default)
        except (ValueError, KeyError, TypeError):
            continue
        return kind
    return ""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _within(node: Node, value: float) -> bool:
    checks = (
        ("minimum", lambda b: value >= b),
        ("maximum", lambda b: value <= b),
        ("exclusiveMinimum", lambda b: value > b),
        ("exclusiveMaximum", lambda b: value < b),
    )
    return all(test(node[bound]) for bound, test in checks if bound in node)


def _parses(kind: str, value: Any) -> bool:
    if _number(value):
        return value >= 0
    try:
        (parse_timedelta if kind == "duration" else parse_bytes)(value)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def _type_accepts(name: str, node: Node, value: Any, kind: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return _number(value) and float(value).is_integer() and _within(node, value)
    if name == "number":
        return _number(value) and _within(node, value)
    if name == "string":
        return _parses(kind, value) if kind else isinstance(value, str)
    if name == "array":
        return isinstance(value, (list, tuple, str))  # distributed takes one preload as a str
    if name == "object":
        return isinstance(value, Mapping)
    return True


def _accepts(node: Node, value: Any, kind: str) -> bool:
    """Whether `value` is what the schema's `node` accepts, read as distributed reads it."""
    alternatives = node.get("oneOf") or node.get("anyOf")
    if alternatives:
        return any(_accepts(alt, value, kind) for alt in alternatives)
    if "enum" in node:
        return any(
            value is choice
            if choice is None or isinstance(choice, bool)
            else value == choice and not isinstance(value, bool)
            for choice in node["enum"]
        )
    types = node.get("type")
    if types is None:
        return True
    return any(
        _type_accepts(t, node, value, kind) for t in (types if isinstance(types, list) else [types])
    )


def _word(value: Any) -> str:
    """A value as one writes it in YAML or an environment variable."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _bounds(node: Node) -> str:
    if "minimum" in node and "maximum" in node:
        return f" from {node['minimum']} to {node['maximum']}"
    low = (
        f"above {node['exclusiveMinimum']}"
        if "exclusiveMinimum" in node
        else f"of at least {node['minimum']}"
        if "minimum" in node
        else ""
    )
    high = (
        f"below {node['exclusiveMaximum']}"
        if "exclusiveMaximum" in node
        else f"at most {node['maximum']}"
        if "maximum" in node
        else ""
    )
    if low and high:
        return f" {low} and {high}"
    if high:
        return f" of {high}" if high.startswith("at") else f" {high}"
    return f" {low}" if low else ""


_TYPES = {"null": "null", "boolean": "true or false", "array": "a list", "object": "a mapping"}
_STRINGS = {
    "duration": "a duration such as '30s' or a number of seconds",
    "size": "a size such as '64MiB' or a number of bytes",
    "": "a string",
}


def _describe(node: Node, kind: str) -> str:
    alternatives = node.get("oneOf") or node.get("anyOf")
    if alternatives:
        return " or ".join(_describe(alt, kind) for alt in alternatives)
    if "enum" in node:
        words = [_word(c) for c in node["enum"]]
        return words[0] if len(words) == 1 else "one of " + ", ".join(words)
    types = node.get("type")
    names = types if isinstance(types, list) else [types]
    words = [
        _STRINGS[kind]
        if t == "string"
        else f"a whole number{_bounds(node)}"
        if t == "integer"
        else f"a number{_bounds(node)}"
        if t == "number"
        else _TYPES.get(t, str(t))
        for t in names
        if t is not None
    ]
    return " or ".join(words) or "anything"


__all__ = ["DURATIONS", "FREE_SECTIONS", "SCHEMA", "SIZES", "check_distributed_config"]
