"""The `cudask.comm` config keys, read and checked once (see cudask.yaml).

Covers: `device_ipc_min_size()`, the smallest device array sent by CUDA IPC, or
None when device IPC is off; `device_ipc_lease()`, how long a sent chunk of
CuPy's pool stays mappable (cudask.comm.leases); `map_ahead()`, whether the
workers of a host map each other's pool slabs at start (cudask.comm.ahead);
`device_ipc_staging()`, the size of each worker's staging area
(cudask.comm.staging). A
malformed value raises OptionError naming it.
Does not cover: what the keys switch on (cudask.comm.ipc, cudask.worker.plugins).

Threading: reads dask.config; call it from any thread.
"""

from __future__ import annotations

from dask.utils import parse_bytes, parse_timedelta

from cudask import config
from cudask.errors import OptionError
from cudask.memory.settings import parse_flag

# The shortest lease: a receiver keeps a leased mapping for a quarter of it and closes it
# at its next sweep (every 2 s, cudask.worker.plugins.DeviceIPC), well before the sender
# may free the chunk (a lease after the receiver's answer). The longest: a chunk the pool
# gave back stays allocated that long.
MIN_LEASE = 8.0
MAX_LEASE = 600.0


def device_ipc_min_size() -> int | None:
    """The smallest device array sent to a worker of the same host by CUDA IPC
    (`cudask.comm.device-ipc-min-size`), or None when `cudask.comm.device-ipc`
    is off. Raises OptionError naming a malformed value."""
    size = _size("device-ipc-min-size", "(1048576) or a string such as '1MiB'")
    if not parse_flag(config.get("comm.device-ipc"), "cudask.comm.device-ipc"):
        return None
    return size


def device_ipc_staging() -> int:
    """Bytes of each worker's staging area (`cudask.comm.device-ipc-staging`:
    cudask.comm.staging); 0: none. Raises OptionError naming a malformed value."""
    return _size("device-ipc-staging", "(1073741824), a string such as '1GiB', or 0 for none")


def _size(key: str, accepted: str) -> int:
    """The size `cudask.comm.KEY` gives, in bytes; OptionError when it is not one."""
    value = config.get(f"comm.{key}")
    try:
        size = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        size = -1
    if isinstance(value, bool) or size < 0:
        raise OptionError(f"cudask.comm.{key}={value!r} is not a size; accepted: bytes {accepted}")
    return size


def device_ipc_lease() -> float:
    """Seconds a chunk of CuPy's pool sent by IPC handle stays allocated after the
    send, for receivers to keep it mapped (`cudask.comm.device-ipc-lease`); 0: no
    leases, CuPy allocates from its default pool and every receive maps anew.
    Raises OptionError naming a malformed value."""
    value = config.get("comm.device-ipc-lease")
    try:
        seconds = (
            -1.0 if isinstance(value, bool) else float(parse_timedelta(value, default="s") or 0)
        )
    except (TypeError, ValueError, KeyError, AttributeError):  # what parse_timedelta raises
        seconds = -1.0
    if seconds < 0:
        raise OptionError(
            f"cudask.comm.device-ipc-lease={value!r} is not a duration; give seconds "
            "(20), a string such as '20s', or 0 for none"
        )
    if seconds and not MIN_LEASE <= seconds <= MAX_LEASE:
        raise OptionError(
            f"cudask.comm.device-ipc-lease={value!r} is out of range: give 0 (none) or "
            f"{MIN_LEASE:g} to {MAX_LEASE:g} seconds (receivers keep a mapping for a "
            "quarter of it and check every 2 s; the sender holds a chunk it gave back "
            "that long)"
        )
    return seconds


def map_ahead() -> bool:
    """Whether the workers of a host map each other's RMM pool slabs when they
    start (`cudask.comm.map-ahead`). Raises OptionError naming a malformed value."""
    return parse_flag(config.get("comm.map-ahead"), "cudask.comm.map-ahead")
