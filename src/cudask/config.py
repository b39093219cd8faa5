"""The `cudask` namespace of dask.config.

Covers: loading the commented defaults in cudask.yaml into dask.config (as
distributed does with distributed.yaml), reading keys back, where a key's value
was set (`origin`: an environment variable, a config file, or Python), the keys
under `cudask.` that cudask.yaml does not know (`unknown_keys`, each with its
closest known key), what the config files and environment variables set
(`user_config`, `user_value`), and the one rule by which a value means true or false
(`as_bool`, `BOOL_ACCEPTED`). Environment variables such as
DASK_CUDASK__WORKER__RMM_POOL_SIZE and the user's dask config files override the
defaults, as everywhere in dask.

Does not cover: what the keys mean (cudask.options and cudask.memory do), nor
raising errors (this module sits below cudask.errors; callers raise).

Threading: the defaults are registered once, at import, and `get` falls back
to them when dask.config has lost them; the functions read dask.config, the
environment and the config files, safe from any thread.
"""

from __future__ import annotations

import difflib
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import dask.config
import yaml

HERE = pathlib.Path(__file__).parent
DEFAULTS_FILE = HERE / "cudask.yaml"
SCHEMA_FILE = HERE / "cudask-schema.yaml"

#: What `as_bool` reads as a boolean, for messages.
BOOL_ACCEPTED = (
    "true or false (also True/False, yes/no, on/off and 1/0, in any case, as YAML reads them)"
)
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _load_defaults() -> dict[str, Any]:
    with DEFAULTS_FILE.open() as f:
        return yaml.safe_load(f)


defaults = _load_defaults()
dask.config.update_defaults(defaults)


def get(key: str, default: Any = dask.config.no_default) -> Any:
    """Read `cudask.<key>` from dask.config (e.g. get("worker.rmm-pool-size")).

    A key that dask.config no longer holds (its config was reset, as
    distributed.utils_test's `gen_test` does, or cleared) reads as cudask.yaml's
    default; `default` applies only to keys cudask.yaml does not know."""
    packaged = _lookup(defaults, f"cudask.{key}")
    if packaged is not dask.config.no_default:
        default = packaged
    return dask.config.get(f"cudask.{key}", default=default)


def load_schema() -> dict[str, Any]:
    """The JSON schema of the cudask namespace (cudask-schema.yaml)."""
    with SCHEMA_FILE.open() as f:
        return yaml.safe_load(f)


def as_bool(value: Any) -> bool | None:
    """`value` as a boolean by the one rule of every cudask flag, keyword and key:
    True/False, 1/0, and the words YAML reads as booleans (true/false, yes/no,
    on/off) in any case. None when it is none of them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
    return None


#: Keys that were settings once and are fixed now, with what took their place.
REMOVED = {
    "cudask.memory.pinned-slab-size": "fixed at 256 MiB: cudask.memory.host.pool.SLAB_SIZE",
    "cudask.memory.pinned-method": "always 'auto': registration, falling back to cudaHostAlloc",
    "cudask.memory.pinned-headroom": "derived: the device limit, at most 8 GiB",
    "cudask.memory.pinned-headroom-from": "fixed at half the device limit",
    "cudask.memory.pinned-available-fraction": "fixed at half the available host memory",
    "cudask.memory.pinned-duty-cycle": "gone: the pool's thread pins without rests",
    "cudask.memory.populate-threads": "fixed: the CPUs the worker may use, at most 16",
    "cudask.memory.spill-at-limit": "always on with spill-on-demand",
    "cudask.memory.background-spill": "always on: spill-target 1 spills at the limit",
}


def _canonical(key: str) -> str:
    return key.lower().replace("_", "-")


def _leaves(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for name, value in tree.items():
        path = f"{prefix}.{name}"
        if isinstance(value, Mapping):
            yield from _leaves(value, path)
        else:
            yield path, value


def known_keys() -> dict[str, Any]:
    """Every key of cudask.yaml (canonical, dotted from `cudask.`) and its default."""
    return {_canonical(k): v for k, v in _leaves(defaults["cudask"], "cudask")}


def _sections() -> set[str]:
    """The sections below `cudask` ("cudask.worker", ...)."""
    return {key.rpartition(".")[0] for key in known_keys()} - {"cudask"}


def user_config() -> dict[str, Any]:
    """What the dask config files and the environment variables set (dask's rule,
    read again now), without the defaults that packages register: a section given a
    plain value there (DASK_CUDASK__MEMORY=fast) is still seen, where merging the
    defaults in has put the section's keys back."""
    return dask.config.collect(dask.config.paths, os.environ)


def user_value(key: str) -> Any:
    """The value the config files or the environment give `key` (dotted), or
    dask.config.no_default where they give none."""
    return _lookup(user_config(), key)


def unknown_keys() -> list[tuple[str, str | None]]:
    """The keys set under `cudask.` (in Python, a config file or the environment) that
    cudask.yaml does not know, each with the closest known key (None when nothing is
    close; the first key of a section given a plain value)."""
    known = known_keys()
    sections = _sections() | {"cudask"}
    trees = [{"cudask": dask.config.config.get("cudask")}, user_config()]
    found: dict[str, tuple[str, str | None]] = {}
    for tree in trees:
        current = tree.get("cudask")
        if current is None:
            continue
        leaves = (
            _leaves(current, "cudask") if isinstance(current, Mapping) else [("cudask", current)]
        )
        for key, _ in leaves:
            canonical = _canonical(key)
            if canonical in known or canonical in found:
                continue
            if canonical in REMOVED:
                found[canonical] = (key, None)
                continue
            if canonical in sections:  # a section given a plain value
                found[canonical] = (key, next(k for k in known if k.startswith(canonical + ".")))
                continue
            close = difflib.get_close_matches(canonical, list(known), n=1, cutoff=0.6)
            found[canonical] = (key, close[0] if close else None)
    return list(found.values())


def _env_names(key: str) -> Iterator[str]:
    """The environment variables that set `key` (dask's DASK_A__B_C rule)."""
    for name in os.environ:
        if name.startswith("DASK_") and _canonical(name[5:].replace("__", ".")) == _canonical(key):
            yield name


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, Mapping):
            return dask.config.no_default
        match = [k for k in tree if _canonical(str(k)) == _canonical(part)]
        if not match:
            return dask.config.no_default
        tree = tree[match[-1]]
    return tree


def origin(key: str, value: Any = dask.config.no_default) -> str | None:
    """Where the value of `key` (dotted, e.g. "cudask.worker.rmm-pool-size") was set,
    for messages: ``"environment variable DASK_..."``, ``"config file PATH (key ...)"`` or
    ``"config key ..."`` (set in Python); None while it holds cudask.yaml's default.
    `value`: where that value was set instead of the current one (a section given a
    plain value in a file, which the defaults registered since have replaced)."""
    if value is dask.config.no_default:
        value = dask.config.get(key, default=None)
        if _lookup(defaults, key) == value:
            return None
    for name in _env_names(key):
        if dask.config.interpret_value(os.environ[name]) == value:
            return f"environment variable {name}"
    found = None
    for path, data in dask.config.collect_yaml(dask.config.paths, return_paths=True):
        if _lookup(data, key) == value:
            found = path  # the last file wins, as in dask.config
    if found is not None:
        return f"config file {found} (key {key})"
    return f"config key {key}"


__all__ = [
    "BOOL_ACCEPTED",
    "DEFAULTS_FILE",
    "REMOVED",
    "SCHEMA_FILE",
    "as_bool",
    "defaults",
    "get",
    "known_keys",
    "load_schema",
    "origin",
    "unknown_keys",
    "user_config",
    "user_value",
]
