"""The state of one proxy, kept apart from the proxy itself.

Covers: `ProxyCell` (what is known of the object without obtaining it, and its
content or the store holding it), the three forms of a proxy's content
(`OBJECT`, `FRAMES`, `HOSTCOPY`), `SerializedFrames`, rebuilding an object from
a host form (`materialize`), what to send for a proxy without unspilling it
(`host_form`), and `ProxyHome`: the three calls a cell makes to the store it is
bound to (ProxyStore implements it; this module never imports the store).

Does not cover: the proxy's behaviour as its object (cudask.memory.jit.proxy),
headers and frames on the wire (cudask.memory.jit.wire), what to spill (the
store), how host copies are made and rebuilt (cudask.memory.handlers).

Importing this module imports neither CuPy nor distributed and creates no
CUDA context.

Threading: a cell may be used from several threads; conversions of its host
form are serialized by the cell's lock, which is always taken before its
store's lock, never after.
"""

from __future__ import annotations

import pickle
import threading
from typing import TYPE_CHECKING, Any, Protocol

from dask.utils import typename

if TYPE_CHECKING:
    from cudask.memory.host.copy_engine import TransferEngine


class ProxyError(RuntimeError):
    """A proxy could not do what was asked; the message names the operation."""


# Forms of a proxy's content: the object itself, distributed-serialized frames,
# or a cudask host copy (see cudask.memory.handlers.HostCopy).
OBJECT = "object"
FRAMES = "frames"
HOSTCOPY = "hostcopy"


class SerializedFrames:
    """An object serialized by distributed (`serialize_and_split`): header and
    frames. Pickles its frames out of band (protocol 5), so distributed's spill to
    disk writes them without a copy."""

    __slots__ = ("frames", "header")

    def __init__(self, header: dict[str, Any], frames: list[Any]) -> None:
        self.header = header
        self.frames = frames

    @property
    def nbytes(self) -> int:
        return sum(memoryview(f).nbytes for f in self.frames)

    def __sizeof__(self) -> int:
        return self.nbytes + 200

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if isinstance(protocol, int) and protocol >= 5:
            frames: list[Any] = [pickle.PickleBuffer(f) for f in self.frames]
        else:
            frames = [bytes(f) for f in self.frames]
        return (SerializedFrames, (self.header, frames))

    def deserialize(self) -> Any:
        from distributed.protocol.serialize import merge_and_deserialize

        return merge_and_deserialize(self.header, list(self.frames))


def materialize(form: str, payload: Any, engine: TransferEngine | None) -> Any:
    """The object a host form stands for (rebuilt on the device when it is a host
    copy; `engine` None: a private engine over the real backend)."""
    if form == OBJECT:
        return payload
    if form == FRAMES:
        return payload.deserialize()
    from cudask.memory import handlers

    eng = engine if engine is not None else _detached_engine()
    obj, copies = handlers.to_device(payload, eng)
    for c in copies:
        c.wait()
    return obj


_ENGINE_LOCK = threading.Lock()
_ENGINE: TransferEngine | None = None


def _detached_engine() -> TransferEngine:
    """A transfer engine for detached proxies (e.g. results on the client): host
    -> device copies only, so its pinned pool is empty."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            from cudask.memory.backend import default_backend
            from cudask.memory.host.copy_engine import TransferEngine
            from cudask.memory.host.pool import PinnedPool

            backend = default_backend()
            _ENGINE = TransferEngine(backend, PinnedPool(backend, 0))
        return _ENGINE


class ProxyHome(Protocol):
    """What a bound cell asks of its store (cudask.memory.jit.proxy_store.ProxyStore)."""

    def obtain(self, cell: ProxyCell, op: str) -> Any:
        """The cell's object, unspilled or rebuilt on the device if need be."""

    def where_proxy(self, cell: ProxyCell) -> str:
        """'device', 'host' or 'disk' ('closed' once the store is closed)."""

    def host_form(self, cell: ProxyCell) -> tuple[str, Any] | None:
        """(form, payload) when the object is off the device; None when on it."""


class ProxyCell:
    """The state of one proxy (kept apart from the proxy so that the proxy's own
    attribute namespace is the object's).

    cls, nbytes, priority: facts about the object, known without obtaining it.
    form, payload: the content of a detached proxy (payload None when bound).
    store, pkey: the store and its internal key of a bound proxy.
    """

    __slots__ = (
        "__weakref__",
        "cls",
        "form",
        "lock",
        "nbytes",
        "payload",
        "pkey",
        "priority",
        "store",
    )

    def __init__(self, cls: type, nbytes: int, priority: Any, form: str, payload: Any) -> None:
        self.lock = threading.RLock()
        self.cls = cls
        self.nbytes = nbytes
        self.priority = priority
        self.form = form
        self.payload = payload
        self.store: ProxyHome | None = None
        self.pkey: Any = None

    def obtain(self, op: str) -> Any:
        """The object, unspilled or rebuilt on the device if need be."""
        with self.lock:
            store = self.store
            if store is None:
                if self.form != OBJECT:
                    try:
                        obj = materialize(self.form, self.payload, None)
                    except Exception as exc:
                        exc.add_note(
                            f"cudask: while rebuilding a proxy of {typename(self.cls)} for {op}"
                        )
                        raise
                    self.form, self.payload = OBJECT, obj
                return self.payload
        return store.obtain(self, op)

    def where(self) -> str:
        """'device', 'host' or 'disk' for a bound proxy; 'detached-<form>' else."""
        store = self.store
        if store is None:
            return f"detached-{self.form}"
        return store.where_proxy(self)


def _sizeof(obj: Any) -> int:
    from dask.sizeof import sizeof

    try:
        return int(sizeof(obj))
    except Exception:  # noqa: BLE001 - a size estimate must never fail a store
        return 0


NO_PRIORITY: Any = object()


def _nbytes(obj: Any) -> int:
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    return _sizeof(obj)


def new_cell(obj: Any) -> ProxyCell:
    """A detached cell holding `obj`."""
    return ProxyCell(
        type(obj), _nbytes(obj), getattr(obj, "__array_priority__", NO_PRIORITY), OBJECT, obj
    )


def priority_arg(cell: ProxyCell) -> Any:
    """The cell's `__array_priority__` as pickled: None, or ("p", priority)."""
    return None if cell.priority is NO_PRIORITY else ("p", cell.priority)


def rebuilt_cell(cls: type, nbytes: int, priority: Any, form: str, payload: Any) -> ProxyCell:
    """A detached cell from what `priority_arg` and a host form gave."""
    return ProxyCell(cls, nbytes, NO_PRIORITY if priority is None else priority[1], form, payload)


def host_form(cell: ProxyCell, op: str) -> tuple[str, Any]:
    """What to send or pickle for a proxy without unspilling it: (HOSTCOPY, copy)
    when it is spilled, (FRAMES, frames) when it is detached in that form, else
    (OBJECT, the object) - its own serialization moves it to the host."""
    with cell.lock:
        store = cell.store
        if store is None:
            return cell.form, cell.payload
    found = store.host_form(cell)
    if found is not None:
        return found
    return OBJECT, cell.obtain(op)


__all__ = [
    "FRAMES",
    "HOSTCOPY",
    "NO_PRIORITY",
    "OBJECT",
    "ProxyCell",
    "ProxyError",
    "ProxyHome",
    "SerializedFrames",
    "host_form",
    "materialize",
    "new_cell",
    "priority_arg",
    "rebuilt_cell",
]
