"""The `cudask` namespace of dask.config.

Covers: loading the commented defaults in cudask.yaml into dask.config (as
distributed does with distributed.yaml), and reading keys back. Environment
variables such as DASK_CUDASK__WORKER__RMM_POOL_SIZE and the user's dask
config files override the defaults, as everywhere in dask.

Does not cover: what the keys mean (cudask.options and cudask.memory do).

Threading: the defaults are registered once, at import; `get` reads dask.config,
which is safe from any thread.
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import yaml

HERE = pathlib.Path(__file__).parent
DEFAULTS_FILE = HERE / "cudask.yaml"
SCHEMA_FILE = HERE / "cudask-schema.yaml"


def _load_defaults() -> dict[str, Any]:
    with DEFAULTS_FILE.open() as f:
        return yaml.safe_load(f)


defaults = _load_defaults()
dask.config.update_defaults(defaults)


def get(key: str, default: Any = dask.config.no_default) -> Any:
    """Read `cudask.<key>` from dask.config (e.g. get("worker.rmm-pool-size"))."""
    return dask.config.get(f"cudask.{key}", default=default)


def load_schema() -> dict[str, Any]:
    """The JSON schema of the cudask namespace (cudask-schema.yaml)."""
    with SCHEMA_FILE.open() as f:
        return yaml.safe_load(f)
