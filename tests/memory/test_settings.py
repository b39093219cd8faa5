"""The cudask.memory.* settings: parsing, defaults and the errors for bad values."""

from __future__ import annotations

from collections.abc import Callable

import dask
import pytest

from cudask.errors import OptionError
from cudask.memory.settings import release_seconds, store_settings
from cudask.memory.store import TieredStore

MakeStore = Callable[..., TieredStore]


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("60s", 60.0),
        ("5 minutes", 300.0),
        (30, 30.0),
        (0.5, 0.5),
        ("250ms", 0.25),
        (False, None),
        (None, None),
    ],
)
def test_release_after_values(value, seconds):
    assert release_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", -1, 0, "0s", True, [1]])
def test_release_after_refuses(value):
    with pytest.raises(OptionError, match=r"pinned-release-after=.*(duration|positive)"):
        release_seconds(value)


def test_defaults_come_from_the_config():
    s = store_settings(1 << 30, 10 << 30)
    assert s.pinned_release_after == 60.0  # cudask.yaml
    assert s.pinned_pool_size == 5 << 30 and s.pinned_slab_size == 256 << 20
    assert s.spill_target == 1.0 and s.background and s.pinned_preallocate == 0
    assert s.spill_on_demand and s.spill_at_limit and s.keep_host_copies
    with dask.config.set({"cudask.memory.pinned-release-after": False}):
        assert store_settings(1 << 30, 10 << 30).pinned_release_after is None
    assert store_settings(None, 10 << 30).pinned_pool_size == 0  # "auto" without a device limit
    assert s.pinned_headroom_from == 0.5
    assert s.pinned_headroom == 1 << 30  # the device limit, at most 8 GiB
    assert store_settings(64 << 30, 200 << 30).pinned_headroom == 8 << 30
    assert store_settings(None, 10 << 30).pinned_headroom == 0


def test_six_settings_and_the_parts_fixed_parameters():
    from cudask import config

    assert sorted(config.defaults["cudask"]["memory"]) == [
        "keep-host-copies",
        "pinned-pool-size",
        "pinned-preallocate",
        "pinned-release-after",
        "spill-on-demand",
        "spill-target",
    ]
    s = store_settings(
        1 << 30,
        10 << 30,
        pinned_slab_size=1 << 20,
        pinned_headroom=1 << 25,
        background=False,
        spill_at_limit=False,
    )
    assert (s.pinned_slab_size, s.pinned_headroom, s.background, s.spill_at_limit) == (
        1 << 20,
        1 << 25,
        False,
        False,
    )
    with pytest.raises(TypeError, match="populate_threads"):
        store_settings(1 << 30, 10 << 30, populate_threads=4)


@pytest.mark.parametrize(
    "key",
    [
        "pinned-slab-size",
        "pinned-method",
        "pinned-headroom",
        "pinned-headroom-from",
        "pinned-available-fraction",
        "pinned-duty-cycle",
        "populate-threads",
        "spill-at-limit",
        "background-spill",
    ],
)
def test_removed_settings_are_named_with_a_hint(key):
    from cudask.deploy.checks import check_config_keys

    with (
        dask.config.set({f"cudask.memory.{key}": 1}),
        pytest.raises(OptionError, match=f"cudask.memory.{key} is no longer a setting"),
    ):
        check_config_keys()


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("spill-target", 1.5, "spill-target=1.5"),
        ("spill-target", "high", "spill-target='high'"),
        ("pinned-pool-size", "lots", "pinned-pool-size"),
        ("pinned-preallocate", "some", "pinned-preallocate"),
        ("pinned-release-after", "later", "pinned-release-after"),
        ("spill-on-demand", "often", "spill-on-demand='often' is not a boolean"),
        ("keep-host-copies", "maybe", "keep-host-copies='maybe' is not a boolean"),
    ],
)
def test_bad_config_values_name_the_key(key, value, match):
    with dask.config.set({f"cudask.memory.{key}": value}), pytest.raises(OptionError, match=match):
        store_settings(1 << 30, 10 << 30)


def test_pinned_pool_size_from_config(make_store: MakeStore) -> None:
    with dask.config.set({"cudask.memory.pinned-pool-size": "auto"}):
        store = make_store(device_memory_limit=1000, memory_limit=10_000, pinned_pool_size=None)
    assert (
        store.settings.pinned_pool_size == 5000
    )  # half the host tier, however small the device limit
    with dask.config.set({"cudask.memory.pinned-pool-size": "auto"}):
        store = make_store(device_memory_limit=None, memory_limit=10_000, pinned_pool_size=None)
    assert store.settings.pinned_pool_size == 0  # nothing to spill from the device
    with dask.config.set({"cudask.memory.pinned-pool-size": 0.5}):
        store = make_store(memory_limit=10_000, pinned_pool_size=None)
    assert store.settings.pinned_pool_size == 5000
