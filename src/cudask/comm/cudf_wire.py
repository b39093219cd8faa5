"""cuDF objects sent by a spilling worker, readable by any process.

Covers: the serializers ("dask" and "cuda" families) that a worker with cuDF
spilling on registers for cuDF's serializable types. cuDF names the buffer
classes in its headers; from a spilling process they name the spillable ones,
which a process without a cuDF spill manager (a client, a worker without
spilling) cannot build. These serializers write the plain class names instead.
A receiver that spills still gets spillable buffers: cuDF wraps the received
frames in its own buffer classes before it reads the names, and a spillable
buffer is a plain one. Frames and every other header key are cuDF's own.
Does not cover: cuDF objects pickled inside other objects (cloudpickle calls
cuDF's own reduction), nor turning spilling on (cudask.worker.plugins).
Threading: registration takes a lock and is idempotent; the serializers keep
no state and may run on any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from distributed.protocol import dask_serialize
from distributed.protocol.cuda import cuda_serialize

# header key -> {spillable class name: plain class name}
PLAIN_NAMES: dict[str, dict[str, str]] = {
    "type-serialized-name": {"SpillableBuffer": "Buffer"},
    "owner-type-serialized-name": {"SpillableBufferOwner": "BufferOwner"},
}

_lock = threading.Lock()
_registered: set[type] = set()


def portable_header(header: Any) -> Any:
    """A copy of a cuDF header (nested dicts and lists) naming plain buffer classes
    where it named spillable ones; everything else is kept as it is."""
    if isinstance(header, dict):
        out: dict[Any, Any] = {}
        for key, value in header.items():
            names = PLAIN_NAMES.get(key) if isinstance(key, str) else None
            if names is not None and isinstance(value, str):
                out[key] = names.get(value, value)
            else:
                out[key] = portable_header(value)
        return out
    if isinstance(header, list):
        return [portable_header(v) for v in header]
    if isinstance(header, tuple):
        return tuple(portable_header(v) for v in header)
    return header


def _host(x: Any) -> tuple[dict[str, Any], list[Any]]:
    header, frames = x.host_serialize()
    return portable_header(header), frames


def _device(x: Any) -> tuple[dict[str, Any], list[Any]]:
    header, frames = x.device_serialize()
    return portable_header(header), frames


def _subclasses(root: type) -> list[type]:
    seen: list[type] = []
    stack = [root]
    while stack:
        cls = stack.pop()
        sub: type
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.append(sub)
                stack.append(sub)
    return seen


def register(serializable: type | None = None) -> int:
    """Register the portable serializers for every loaded subclass of cuDF's
    `Serializable` (or of `serializable`, for tests); returns how many types were
    new. An explicit registration wins over cuDF's registration for the base class,
    whichever ran first."""
    if serializable is None:
        from cudf.core.abc import Serializable

        serializable = Serializable
    families: list[tuple[Any, Callable[[Any], tuple[dict[str, Any], list[Any]]]]] = [
        (dask_serialize, _host),
        (cuda_serialize, _device),
    ]
    new = 0
    with _lock:
        for cls in [serializable, *_subclasses(serializable)]:
            if cls in _registered:
                continue
            for dispatch, dumps in families:
                dispatch.register(cls, dumps)
            _registered.add(cls)
            new += 1
    return new
