"""A proxy on the wire: the header and frames distributed sends for it.

Covers: `serialize` (a cell's header and frames, never unspilling it: a spilled
proxy sends its host copy as it is; a proxy whose object is on the device sends
the object through distributed's serializers, or, for a peer that accepts a
device family, through that family first), `deserialize` (a detached cell in
host form, or, when its frames are device memory, the object rebuilt at once),
and the registry of device families (`register_device_family`): the comm layer
registers the families that move device memory between processes; this layer
never names them.

Header keys (peers of one version must agree): "proxied-type", "nbytes",
"priority", "form", and "sub-header" / "device-frames" for frames.

Does not cover: registering ProxyObject with distributed and wrapping cells in
proxies (cudask.memory.jit.proxy), the device families themselves (cudask.comm).

Threading: registration happens at import time of the registering module;
serializing a cell takes the cell's lock as `host_form` does.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy

from cudask.memory.jit.cell import (
    FRAMES,
    HOSTCOPY,
    OBJECT,
    ProxyCell,
    SerializedFrames,
    host_form,
    priority_arg,
    rebuilt_cell,
)

_device_families: tuple[str, ...] = ()


def register_device_family(name: str) -> None:
    """Declare `name` a distributed serialization family that moves device memory
    between processes without the host (cudask.comm.ipc registers its own when
    imported): tried first for a peer that accepts it, and frames it made count as
    device frames. Idempotent."""
    global _device_families
    if name not in _device_families:
        _device_families = (*_device_families, name)


def device_families() -> tuple[str, ...]:
    """The registered device families, in registration order."""
    return _device_families


def serialize(
    cell: ProxyCell, device: bool, context: dict[str, Any] | None = None, direct: bool = False
) -> tuple[dict[str, Any], list[Any]]:
    """The header and frames of a proxy's cell; `device`: the "cuda" family may
    carry the object; `direct`: a peer of this host that accepts the registered
    device families asked (the comm layer says so)."""
    form, payload = host_form(cell, "serialization")
    header: dict[str, Any] = {
        "proxied-type": pickle.dumps(cell.cls),
        "nbytes": cell.nbytes,
        "priority": pickle.dumps(priority_arg(cell)),
        "form": form,
    }
    if form == HOSTCOPY:
        buffers: list[pickle.PickleBuffer] = []
        meta = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
        # The frames view the host copy's (pinned) blocks: keep the copy alive as
        # long as a frame is, so the blocks are not reused while being sent.
        return header, [meta, *(_owned_view(b.raw(), payload) for b in buffers)]
    if form == FRAMES:
        header["sub-header"] = payload.header
        return header, list(payload.frames)
    from distributed.protocol.serialize import serialize_and_split

    families: tuple[str, ...] = ("cuda", "dask", "pickle") if device else ("dask", "pickle")
    if direct:  # a worker of this host asked: GPU to GPU (e.g. cudask.comm.ipc)
        families = (*_device_families, *families)
    sub_header, frames = serialize_and_split(
        payload, serializers=families, on_error="raise", context=context
    )
    header["form"] = FRAMES
    header["sub-header"] = sub_header
    header["device-frames"] = bool({"cuda", *_device_families} & _serializers_in(sub_header))
    return header, frames


def _serializers_in(header: dict[str, Any]) -> set[str]:
    """The serialization families of a (possibly collection) header."""
    out = {header["serializer"]} if "serializer" in header else set()
    for sub in header.get("sub-headers", ()):
        out |= _serializers_in(sub)
    return out


def deserialize(header: dict[str, Any], frames: list[Any]) -> ProxyCell:
    """The detached cell a header and its frames stand for."""
    cls = pickle.loads(header["proxied-type"])
    priority = pickle.loads(header["priority"])
    form = header["form"]
    payload: Any
    if form == HOSTCOPY:
        payload = pickle.loads(frames[0], buffers=frames[1:])
    else:
        payload = SerializedFrames(header["sub-header"], list(frames))
        if header.get("device-frames"):
            # Device frames already occupy device memory, and memory mapped by IPC
            # handle is the sender's only until this message is answered: rebuild
            # at once.
            form, payload = OBJECT, payload.deserialize()
    return rebuilt_cell(cls, int(header["nbytes"]), priority, form, payload)


class _Owned(numpy.ndarray):
    """A byte array that keeps `owner` alive."""

    owner: Any


def _owned_view(buffer: memoryview, owner: Any) -> memoryview:
    array = numpy.frombuffer(buffer, dtype=numpy.uint8).view(_Owned)
    array.owner = owner
    return memoryview(array)  # type: ignore[arg-type]


__all__ = ["deserialize", "device_families", "register_device_family", "serialize"]
