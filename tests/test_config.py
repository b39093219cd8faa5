"""The commented cudask.yaml and cudask-schema.yaml must describe the same keys."""

from __future__ import annotations

import re

import dask.config
import jsonschema
import pytest

from cudask import config


def _walk_schema(schema: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        if sub.get("type") == "object" and "properties" in sub:
            keys |= _walk_schema(sub, path)
        else:
            keys.add(path)
            assert sub.get("description"), f"schema key {path} has no description"
    return keys


def _walk_defaults(d: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in d.items():
        path = f"{prefix}.{name}" if prefix else name
        keys |= _walk_defaults(value, path) if isinstance(value, dict) else {path}
    return keys


def test_schema_and_yaml_agree():
    assert _walk_defaults(config.defaults) == _walk_schema(config.load_schema())


def test_defaults_validate_against_schema():
    jsonschema.validate(config.defaults, config.load_schema())


def test_every_key_is_commented_in_yaml():
    text = config.DEFAULTS_FILE.read_text()
    leaves = sorted(_walk_defaults(config.defaults))
    assert len(leaves) >= 30, leaves  # the loop below checks something
    for leaf in leaves:
        name = leaf.rsplit(".", 1)[1]
        line = next(ln for ln in text.splitlines() if re.match(rf"\s*{re.escape(name)}:", ln))
        assert "#" in line, f"{leaf} has no comment in cudask.yaml"


def test_defaults_are_registered_with_dask():
    assert dask.config.get("cudask.worker.device-memory-limit") == "default"
    assert config.get("worker.threads-per-worker") == 1


def test_environment_variables_override(monkeypatch):
    monkeypatch.setenv("DASK_CUDASK__WORKER__RMM_POOL_SIZE", "20GB")
    env = dask.config.collect_env()
    with dask.config.set(env):
        assert config.get("worker.rmm-pool-size") == "20GB"
        assert config.get("worker.rmm_pool_size") == "20GB"


@pytest.mark.parametrize(
    "bad", [{"cudask": {"worker": {"nope": 1}}}, {"cudask": {"worker": {"rmm-async": "x"}}}]
)
def test_schema_rejects_unknown_and_mistyped(bad):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, config.load_schema())


_RESET_FIRST = """
import distributed.utils_test as utils_test  # its config snapshot holds no cudask keys
import dask.config
from cudask import config

for reset in (utils_test.reset_config, dask.config.config.clear, dask.config.refresh):
    reset()
    assert config.get("worker.threads-per-worker") == 1, reset
    assert config.get("memory.spill-on-demand") is True, reset
    assert config.get("worker") == config.defaults["cudask"]["worker"], reset
    with dask.config.set({"cudask.worker.threads-per-worker": 3}):
        assert config.get("worker.threads-per-worker") == 3, reset
        assert config.get("worker.rmm-async") is False, reset
print("kept")
"""


def test_settings_fall_back_to_packaged_defaults_after_a_reset():
    """distributed.utils_test imported before cudask: its reset_config (what gen_test
    and gen_cluster do), dask.config's clear() and refresh() leave cudask's settings."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _RESET_FIRST],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kept"


def test_options_resolve_with_dask_config_emptied():
    """The options' defaults read through the fallback: resolving a cluster's options
    works with dask.config emptied."""
    import copy

    from cudask.options import resolve

    saved = copy.deepcopy(dask.config.config)
    try:
        dask.config.config.clear()
        options = resolve({}, "cluster", libraries=False)
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    assert options.nthreads == 1
    assert options.device_memory_limit == "default"
