"""The `cudask.comm` config keys, read and checked once (see cudask.yaml).

Covers: `device_ipc_min_size()`, the smallest device array sent by CUDA IPC, or
None when device IPC is off; a malformed value raises OptionError naming it.
Does not cover: what the keys switch on (cudask.comm.ipc, cudask.worker.plugins).

Threading: reads dask.config; call it from any thread.
"""

from __future__ import annotations

from dask.utils import parse_bytes

from cudask import config
from cudask.errors import OptionError
from cudask.memory.settings import parse_flag


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
