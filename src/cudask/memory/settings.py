"""The six `cudask.memory.*` settings of a store, parsed and checked in one place.

Covers: `StoreSettings`, what a `TieredStore` runs with: the six settings (pinned
pool size, preallocation and idle release; spill target; spill on demand; host
copies kept for keys read back), the pinned headroom derived from the limits, and
the parts' fixed parameters (slab size, background spilling, spilling at the limit,
where pinning ahead starts), whose defaults are constants that tests may lower;
`store_settings`, which reads the settings from the config (or keywords) for given
device and host limits. The cluster and the CLI call it before any worker starts,
so a bad value fails there, naming the key and what it accepts.

Does not cover: the store (`cudask.memory.store`) or the pool (`cudask.memory.host`).

Threading: pure functions and a frozen dataclass; reads dask.config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dask.utils import parse_timedelta

from cudask import config
from cudask.errors import OptionError
from cudask.memory.host.pool import SLAB_SIZE
from cudask.sizes import parse_size

# "auto" pinned-preallocate: at most this much is pinned before any spill.
AUTO_PREALLOCATE_CAP = 4 << 30
# The pinned headroom kept free ahead of spills near the limit: the device limit, at most this.
HEADROOM_CAP = 8 << 30
# Pinning ahead of spills starts once the device tier holds this fraction of its limit.
HEADROOM_FROM = 0.5


@dataclass(frozen=True)
class StoreSettings:
    """Parsed settings (sizes in bytes, times in seconds; None: off). The first six
    are the config's; the rest are fixed parameters of the parts (constants above),
    given here so tests can make them small."""

    spill_target: float
    pinned_pool_size: int
    pinned_preallocate: int
    pinned_release_after: float | None
    spill_on_demand: bool = True
    keep_host_copies: bool = True
    pinned_headroom: int = 0  # derived from the limits and the pool
    pinned_slab_size: int = SLAB_SIZE
    pinned_headroom_from: float = HEADROOM_FROM
    background: bool = True
    spill_at_limit: bool = True


def store_settings(
    device_memory_limit: int | None = None,
    memory_limit: int | None = None,
    *,
    spill_target: float | None = None,
    pinned_pool_size: float | str | None = None,
    pinned_preallocate: bool | float | str | None = None,
    pinned_release_after: float | str | bool | None = None,
    spill_on_demand: bool | None = None,
    keep_host_copies: bool | None = None,
    **parts: Any,
) -> StoreSettings:
    """The settings of a store with these limits (`memory_limit`: its host tier;
    0 or None: no limit); a keyword left None takes the config key of the same name.
    `parts`: fixed parameters to override (pinned_slab_size, pinned_headroom,
    pinned_headroom_from, background, spill_at_limit)."""
    device_memory_limit = store_limit(device_memory_limit, "device_memory_limit")
    memory_limit = store_limit(memory_limit, "memory_limit")
    unknown = sorted(set(parts) - _PARTS)
    if unknown:
        raise TypeError(f"store_settings got unknown keyword(s) {', '.join(unknown)}")
    target = _fraction(
        _key("spill-target", spill_target), "cudask.memory.spill-target", example="0.9"
    )
    pool = _pool_bytes(
        _key("pinned-pool-size", pinned_pool_size), device_memory_limit, memory_limit
    )
    headroom = parts.pop("pinned_headroom", None)
    return StoreSettings(
        spill_target=target,
        pinned_pool_size=pool,
        pinned_preallocate=_preallocate_bytes(
            _key("pinned-preallocate", pinned_preallocate), pool, device_memory_limit
        ),
        pinned_release_after=release_seconds(_key("pinned-release-after", pinned_release_after)),
        spill_on_demand=spill_on_demand_setting(spill_on_demand),
        keep_host_copies=parse_flag(
            _key("keep-host-copies", keep_host_copies), "cudask.memory.keep-host-copies"
        ),
        pinned_headroom=_headroom_bytes(headroom, pool, device_memory_limit),
        **parts,
    )


_PARTS = {
    "pinned_slab_size",
    "pinned_headroom",
    "pinned_headroom_from",
    "background",
    "spill_at_limit",
}


def _key(name: str, value: Any) -> Any:
    """`value`, or the `cudask.memory.<name>` key when None."""
    return config.get(f"memory.{name}") if value is None else value


def store_limit(value: int | None, name: str) -> int | None:
    """A store's limit in bytes: None for no limit (None, 0 or False)."""
    if value is None or value is False:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OptionError(f"{name}={value!r}: give a number of bytes (int >= 0) or None")
    return value or None


def spill_on_demand_setting(value: bool | None = None) -> bool:
    """`value`, or the `cudask.memory.spill-on-demand` key when None."""
    return parse_flag(_key("spill-on-demand", value), "cudask.memory.spill-on-demand")


def parse_flag(value: Any, name: str) -> bool:
    flag = config.as_bool(value)
    if flag is None:
        raise OptionError(f"{name}={value!r} is not a boolean; accepted: {config.BOOL_ACCEPTED}")
    return flag


def check_memory_config() -> None:
    """Check every `cudask.memory.*` key without knowing the GPU: the settings are
    parsed against stand-in limits, so a malformed value fails before discovery."""
    store_settings(1 << 30, 1 << 34)


def _headroom_bytes(value: int | None, pool: int, device_memory_limit: int | None) -> int:
    """Pinned bytes kept free ahead of spills once the device tier nears its limit: the
    device limit, at most HEADROOM_CAP and the pool (`value`: a given number of bytes)."""
    if device_memory_limit is None or pool == 0:
        return 0
    if value is None:
        return min(device_memory_limit, HEADROOM_CAP, pool)
    return min(max(value, 0), pool)


def _fraction(value: Any, name: str, example: str = "0.5", within: str = "(0, 1]") -> float:
    """`value` as a fraction in `within`: "(0, 1]" or "[0, 1)"."""
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        fraction = float("nan")
    inside = 0 < fraction <= 1 if within == "(0, 1]" else 0 <= fraction < 1
    if isinstance(value, bool) or not inside:
        raise OptionError(f"{name}={value!r} must be a fraction in {within}, e.g. {example}")
    return fraction


def release_seconds(value: Any) -> float | None:
    """`memory.pinned-release-after` in seconds; None (false, null): never."""
    if value is None or value is False:
        return None
    problem = "a duration such as '60s', '5 minutes' or 30 (seconds), or false to keep slabs pinned"
    if value is True:
        raise OptionError(f"cudask.memory.pinned-release-after={value!r}: give {problem}")
    try:
        seconds = float(parse_timedelta(value, default="seconds"))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise OptionError(f"cudask.memory.pinned-release-after={value!r}: give {problem}") from exc
    if not seconds > 0:
        raise OptionError(
            f"cudask.memory.pinned-release-after={value!r} must be positive: give {problem}"
        )
    return seconds


def _pool_bytes(value: Any, device_memory_limit: int | None, memory_limit: int | None) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        if device_memory_limit is None:
            return 0
        # Half the host tier: spilled data stay in the pool while on the host
        # (docs/design/store.md says why).
        return (memory_limit or system_memory()) // 2
    total = memory_limit or system_memory()
    return parse_size(value, total=total, name="cudask.memory.pinned-pool-size") or 0


def _preallocate_bytes(value: Any, pool: int, device_memory_limit: int | None) -> int:
    """Bytes of pinned memory to reserve in the background when the store starts
    (0: none, and the pool grows inline, on the spill path)."""
    if device_memory_limit is None or pool == 0:
        return 0
    if value is True:
        return pool
    if value is False or value is None:
        return 0
    if isinstance(value, str) and value.strip().lower() == "auto":
        return min(pool, device_memory_limit, AUTO_PREALLOCATE_CAP)
    nbytes = parse_size(value, total=pool, name="cudask.memory.pinned-preallocate") or 0
    return min(nbytes, pool)


def system_memory() -> int:
    """The host memory distributed sees (its MEMORY_LIMIT)."""
    from distributed.system import MEMORY_LIMIT

    return int(MEMORY_LIMIT)


__all__ = [
    "AUTO_PREALLOCATE_CAP",
    "HEADROOM_CAP",
    "HEADROOM_FROM",
    "StoreSettings",
    "check_memory_config",
    "parse_flag",
    "release_seconds",
    "store_limit",
    "store_settings",
    "system_memory",
]
