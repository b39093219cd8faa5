"""The `cudask.comm` config keys, read and checked once (see cudask.yaml).

Covers: `device_ipc_min_size()`, the smallest device array sent by CUDA IPC, or
None when device IPC is off; `device_ipc_lease()`, how long a sent chunk of
CuPy's pool stays mappable (cudask.comm.leases). A malformed value raises
OptionError naming it.
Does not cover: what the keys switch on (cudask.comm.ipc, cudask.worker.plugins).

Threading: reads dask.config; call it from any thread.
"""

from __future__ import annotations

from dask.utils import parse_bytes, parse_timedelta

from cudask import config
from cudask.errors import OptionError
from cudask.memory.settings import parse_flag

# The shortest lease: a receiver keeps a leased mapping for half of it and closes it
# at its next sweep (every 2 s, cudask.worker.plugins.DeviceIPC), before the sender
# may free the chunk.
MIN_LEASE = 5.0


def device_ipc_min_size() -> int | None:
    """The smallest device array sent to a worker of the same host by CUDA IPC
    (`cudask.comm.device-ipc-min-size`), or None when `cudask.comm.device-ipc`
    is off. Raises OptionError naming a malformed value."""
    value = config.get("comm.device-ipc-min-size")
    try:
        size = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        size = -1
    if isinstance(value, bool) or size < 0:
        raise OptionError(f"cudask.comm.device-ipc-min-size={value!r} is not a size; give bytes "
                          "(1048576) or a string such as '1MiB'")
    if not parse_flag(config.get("comm.device-ipc"), "cudask.comm.device-ipc"):
        return None
    return size


def device_ipc_lease() -> float:
    """Seconds a chunk of CuPy's pool sent by IPC handle stays allocated after the
    send, for receivers to keep it mapped (`cudask.comm.device-ipc-lease`); 0: no
    leases, CuPy allocates from its default pool and every receive maps anew.
    Raises OptionError naming a malformed value."""
    value = config.get("comm.device-ipc-lease")
    try:
        seconds = -1.0 if isinstance(value, bool) else float(parse_timedelta(value, default="s") or 0)
    except (TypeError, ValueError, KeyError):
        seconds = -1.0
    if seconds < 0:
        raise OptionError(f"cudask.comm.device-ipc-lease={value!r} is not a duration; give seconds "
                          "(10), a string such as '10s', or 0 for none")
    if 0 < seconds < MIN_LEASE:
        raise OptionError(f"cudask.comm.device-ipc-lease={value!r} is too short: receivers close a "
                          f"kept mapping up to {MIN_LEASE / 2:g} s after half the lease; give 0 (none) "
                          f"or at least {MIN_LEASE:g} s")
    return seconds
