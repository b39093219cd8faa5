"""Proxies: objects that stand for a device object which may be spilled.

Covers: `ProxyObject`, which behaves like the object it stands for - attribute
access, operators (arithmetic, comparison, in-place, matmul), NumPy's
`__array_ufunc__` / `__array_function__` / `__array__`, `__cuda_array_interface__`,
`__dlpack__`, `__len__`, `__getitem__`, `__iter__`, `isinstance` (through a
`__class__` property), pickling and distributed's serialization - and fetches
("obtains") the object only when one of those is used. A proxy is either

- *bound* to a `cudask.memory.proxy_store.ProxyStore`: the store keeps the
  object (on the device, or spilled to host or disk) and the proxy asks the
  store for it on each use; the store may spill it between two uses;
- *detached*: the proxy holds the object itself, or a host image of it
  (after deserialization), rebuilt on first use.

Sending a proxy between workers never unspills it on the sender: a spilled
proxy sends its host copy as it is (`dask_serialize`, and `cuda_serialize`
too, since a host copy needs no device memory); a proxy whose object is on the
device sends the object through distributed's own serializers, or, when a
cudask worker of the same host asks for it (cudask.comm.ipc calls
`ipc_serialize`), by CUDA IPC handle. The receiver gets a detached proxy in
host form, which a ProxyStore adopts without touching the device (or, for an
object that came by IPC handle, the object itself, copied before the message
is answered).

Also registers dask's dispatch functions (dask.array: concatenate,
tensordot, einsum, divide, take, numel, nannumel, percentile, to_numpy,
to_cupy; dask.dataframe: make_meta, meta_nonempty, hash_object, group_split,
concat, tolist, grouper, partd_encode, pyarrow and pandas conversions, ...) for
`ProxyObject`: they unwrap proxies and dispatch again on the real types
(`register_dask_dispatch`, called when the first proxy is made).

Does not cover: deciding what to spill (the store), device memory accounting
(`cudask.memory.accounting`), `type(proxy) is X` checks or C code that tests
exact types (those see `ProxyObject`), and `empty_lookup` (dispatched on a
type alone, with no proxy to look at). In-place changes of an object by a task
racing with a spill of the same object are not seen by the host copy (dask
tasks must not change their inputs).

Importing this module imports neither CuPy nor distributed's CUDA parts and
creates no CUDA context.

Threading: a proxy may be used from several threads; conversions of its host
form are serialized by a per-proxy lock.
"""

from __future__ import annotations

import copy as copy_module
import importlib
import importlib.util
import operator
import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy
from dask.utils import format_bytes, typename

if TYPE_CHECKING:
    from cudask.memory.host.transfer import TransferEngine
    from cudask.memory.proxy_store import ProxyStore


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


def host_form_nbytes(form: str, payload: Any) -> int:
    if form == OBJECT:
        return _sizeof(payload)
    return int(payload.nbytes)


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
            from cudask.memory.host.pool import PinnedPool
            from cudask.memory.host.transfer import TransferEngine

            backend = default_backend()
            _ENGINE = TransferEngine(backend, PinnedPool(backend, 0, 1 << 20))
        return _ENGINE


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
        self.store: ProxyStore | None = None
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
                        exc.add_note(f"cudask: while rebuilding a proxy of {typename(self.cls)} "
                                     f"for {op}")
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


_NO_PRIORITY: Any = object()


def _nbytes(obj: Any) -> int:
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    return _sizeof(obj)


def new_cell(obj: Any) -> ProxyCell:
    """A detached cell holding `obj`."""
    return ProxyCell(type(obj), _nbytes(obj), getattr(obj, "__array_priority__", _NO_PRIORITY),
                     OBJECT, obj)


def _unwrap(x: Any) -> Any:
    """`x` with proxies replaced by their objects (through lists, tuples, dicts)."""
    t = type(x)
    if t is ProxyObject:
        return x._pxy.obtain("unproxy")
    if t is list or t is tuple:
        if any(type(v) in _WALK for v in x):
            return t(_unwrap(v) for v in x)
        return x
    if t is dict:
        if any(type(v) in _WALK for v in x.values()):
            return {k: _unwrap(v) for k, v in x.items()}
        return x
    return x


def unproxy(x: Any) -> Any:
    """The object a proxy stands for (other values as they are; proxies inside
    lists, tuples and dicts are replaced too)."""
    return _unwrap(x)


def asproxy(obj: Any) -> ProxyObject:
    """A detached proxy of `obj` (a proxy is returned as it is)."""
    if type(obj) is ProxyObject:
        return obj
    return ProxyObject(new_cell(obj))


def is_proxy(x: Any) -> bool:
    return type(x) is ProxyObject


def location(proxy: ProxyObject) -> str:
    """Where a proxy's data is, without touching it: 'device', 'host' or 'disk'
    (bound), 'detached-object' / 'detached-frames' / 'detached-hostcopy'."""
    return proxy._pxy.where()


# ----------------------------------------------------------------------------------
# The proxy
# ----------------------------------------------------------------------------------
def _binary(op: Callable[[Any, Any], Any], name: str) -> Callable[[ProxyObject, Any], Any]:
    def method(self: ProxyObject, other: Any) -> Any:
        return op(self._pxy.obtain(name), _unwrap(other))

    method.__name__ = name
    return method


def _reflected(op: Callable[[Any, Any], Any], name: str) -> Callable[[ProxyObject, Any], Any]:
    def method(self: ProxyObject, other: Any) -> Any:
        return op(_unwrap(other), self._pxy.obtain(name))

    method.__name__ = name
    return method


def _inplace(op: Callable[[Any, Any], Any], name: str) -> Callable[[ProxyObject, Any], Any]:
    def method(self: ProxyObject, other: Any) -> Any:
        obj = self._pxy.obtain(name)
        out = op(obj, _unwrap(other))
        return self if out is obj else out

    method.__name__ = name
    return method


def _unary(op: Callable[[Any], Any], name: str) -> Callable[[ProxyObject], Any]:
    def method(self: ProxyObject) -> Any:
        return op(self._pxy.obtain(name))

    method.__name__ = name
    return method


class ProxyObject:
    """Stands for a (device) object; see the module docstring.

    `type(p)` is ProxyObject, `p.__class__` and `isinstance` see the object's
    class. Use `unproxy(p)` for the object itself.
    """

    __slots__ = ("__weakref__", "_pxy")
    _pxy: ProxyCell

    def __init__(self, cell: ProxyCell) -> None:
        object.__setattr__(self, "_pxy", cell)
        if not _DISPATCH_REGISTERED:
            register_dask_dispatch()

    # -- identity ----------------------------------------------------------------
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return self._pxy.cls

    @property
    def __array_priority__(self) -> Any:
        priority = self._pxy.priority
        if priority is _NO_PRIORITY:
            raise AttributeError("__array_priority__")
        return priority

    def __repr__(self) -> str:
        cell = self._pxy
        return (f"<ProxyObject of {typename(cell.cls)} at {hex(id(self))}, "
                f"{format_bytes(cell.nbytes)}, {cell.where()}>")

    def __str__(self) -> str:
        return str(self._pxy.obtain("str"))

    def __format__(self, spec: str) -> str:
        return format(self._pxy.obtain("format"), spec)

    def __dir__(self) -> list[str]:
        return dir(self._pxy.obtain("dir"))

    def __sizeof__(self) -> int:
        return self._pxy.nbytes + 64

    # -- attributes ----------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "_pxy":  # during unpickling or before __init__
            raise AttributeError(name)
        return getattr(self._pxy.obtain(f"attribute {name!r}"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "__class__":
            raise ProxyError(
                f"cannot assign __class__ of a proxy of {typename(self._pxy.cls)}; "
                "unproxy() it first"
            )
        setattr(self._pxy.obtain(f"setting attribute {name!r}"), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._pxy.obtain(f"deleting attribute {name!r}"), name)

    # -- containers ------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._pxy.obtain("len"))

    def __getitem__(self, key: Any) -> Any:
        return self._pxy.obtain("__getitem__")[_unwrap(key)]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._pxy.obtain("__setitem__")[_unwrap(key)] = _unwrap(value)

    def __delitem__(self, key: Any) -> None:
        del self._pxy.obtain("__delitem__")[_unwrap(key)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._pxy.obtain("iter"))

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._pxy.obtain("reversed"))

    def __contains__(self, item: Any) -> bool:
        return _unwrap(item) in self._pxy.obtain("in")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._pxy.obtain("call")(*_unwrap(args), **_unwrap(kwargs))

    # -- conversions -------------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self._pxy.obtain("bool"))

    def __int__(self) -> int:
        return int(self._pxy.obtain("int"))

    def __float__(self) -> float:
        return float(self._pxy.obtain("float"))

    def __complex__(self) -> complex:
        return complex(self._pxy.obtain("complex"))

    def __index__(self) -> int:
        return operator.index(self._pxy.obtain("index"))

    def __hash__(self) -> int:
        return hash(self._pxy.obtain("hash"))

    def __round__(self, ndigits: int | None = None) -> Any:
        obj = self._pxy.obtain("round")
        return round(obj) if ndigits is None else round(obj, ndigits)

    def __copy__(self) -> Any:
        return copy_module.copy(self._pxy.obtain("copy.copy"))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy_module.deepcopy(self._pxy.obtain("copy.deepcopy"), memo)

    # -- array protocols -----------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._pxy.obtain("__cuda_array_interface__").__cuda_array_interface__  # type: ignore[no-any-return]

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self._pxy.obtain("__array_interface__").__array_interface__  # type: ignore[no-any-return]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        import numpy

        obj = self._pxy.obtain("__array__ (conversion to NumPy)")
        if copy is None:
            return numpy.asarray(obj, dtype=dtype)
        return numpy.array(obj, dtype=dtype, copy=copy)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return func(*_unwrap(args), **_unwrap(kwargs))

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._pxy.obtain("__dlpack__").__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._pxy.obtain("__dlpack_device__").__dlpack_device__()

    if sys.version_info >= (3, 12):
        def __buffer__(self, flags: int) -> memoryview:
            return memoryview(self._pxy.obtain("buffer protocol"))

    # -- pickling ------------------------------------------------------------------------
    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        cell = self._pxy
        form, payload = host_form(cell, "pickle")
        return (_rebuild, (cell.cls, cell.nbytes, _priority_arg(cell), form, payload))

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__reduce_ex__(2)


def _priority_arg(cell: ProxyCell) -> Any:
    return None if cell.priority is _NO_PRIORITY else ("p", cell.priority)


def _rebuild(cls: type, nbytes: int, priority: Any, form: str, payload: Any) -> ProxyObject:
    cell = ProxyCell(cls, nbytes, _NO_PRIORITY if priority is None else priority[1], form, payload)
    return ProxyObject(cell)


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


_OPS: list[tuple[str, Callable[..., Any]]] = [
    ("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
    ("matmul", operator.matmul), ("truediv", operator.truediv),
    ("floordiv", operator.floordiv), ("mod", operator.mod), ("pow", operator.pow),
    ("lshift", operator.lshift), ("rshift", operator.rshift), ("and", operator.and_),
    ("xor", operator.xor), ("or", operator.or_),
]
_IOPS: dict[str, Callable[..., Any]] = {
    "add": operator.iadd, "sub": operator.isub, "mul": operator.imul,
    "matmul": operator.imatmul, "truediv": operator.itruediv,
    "floordiv": operator.ifloordiv, "mod": operator.imod, "pow": operator.ipow,
    "lshift": operator.ilshift, "rshift": operator.irshift, "and": operator.iand,
    "xor": operator.ixor, "or": operator.ior,
}
for _name, _op in _OPS:
    setattr(ProxyObject, f"__{_name}__", _binary(_op, f"__{_name}__"))
    setattr(ProxyObject, f"__r{_name}__", _reflected(_op, f"__r{_name}__"))
    setattr(ProxyObject, f"__i{_name}__", _inplace(_IOPS[_name], f"__i{_name}__"))
ProxyObject.__divmod__ = _binary(divmod, "__divmod__")  # type: ignore[operator]
ProxyObject.__rdivmod__ = _reflected(divmod, "__rdivmod__")  # type: ignore[attr-defined]
for _name, _op in [("lt", operator.lt), ("le", operator.le), ("eq", operator.eq),
                   ("ne", operator.ne), ("gt", operator.gt), ("ge", operator.ge)]:
    setattr(ProxyObject, f"__{_name}__", _binary(_op, f"__{_name}__"))
for _name, _uop in [("neg", operator.neg), ("pos", operator.pos), ("abs", operator.abs),
                    ("invert", operator.invert)]:
    setattr(ProxyObject, f"__{_name}__", _unary(_uop, f"__{_name}__"))  # type: ignore[arg-type]
for _name in ("trunc", "floor", "ceil"):
    _caller: Callable[[Any], Any] = operator.methodcaller(f"__{_name}__")  # type: ignore[assignment]
    setattr(ProxyObject, f"__{_name}__", _unary(_caller, f"__{_name}__"))

_WALK = frozenset({ProxyObject, list, tuple, dict})


# ----------------------------------------------------------------------------------
# distributed serialization and sizeof
# ----------------------------------------------------------------------------------
def _serialize(proxy: ProxyObject, device: bool, context: dict[str, Any] | None = None,
               ipc: bool = False) -> tuple[dict[str, Any], list[Any]]:
    cell = proxy._pxy
    form, payload = host_form(cell, "serialization")
    header: dict[str, Any] = {
        "proxied-type": pickle.dumps(cell.cls),
        "nbytes": cell.nbytes,
        "priority": pickle.dumps(_priority_arg(cell)),
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

    from cudask.comm.ipc import FAMILY

    families: tuple[str, ...] = ("cuda", "dask", "pickle") if device else ("dask", "pickle")
    if ipc:  # a cudask worker of this host asked: GPU to GPU (cudask.comm.ipc)
        families = (FAMILY, *families)
    sub_header, frames = serialize_and_split(payload, serializers=families, on_error="raise",
                                             context=context)
    header["form"] = FRAMES
    header["sub-header"] = sub_header
    header["device-frames"] = bool({"cuda", FAMILY} & _serializers_in(sub_header))
    return header, frames


def ipc_serialize(proxy: ProxyObject, context: dict[str, Any] | None) -> tuple[dict[str, Any], list[Any]]:
    """A proxy for a cudask worker of this host that accepts CUDA IPC
    (cudask.comm.ipc calls this): its object, if on the device, by IPC handle."""
    return _serialize(proxy, device=False, context=context, ipc=True)


def ipc_deserialize(header: dict[str, Any], frames: list[Any]) -> ProxyObject:
    return _deserialize(header, frames)


def _serializers_in(header: dict[str, Any]) -> set[str]:
    """The serialization families of a (possibly collection) header."""
    out = {header["serializer"]} if "serializer" in header else set()
    for sub in header.get("sub-headers", ()):
        out |= _serializers_in(sub)
    return out


def _deserialize(header: dict[str, Any], frames: list[Any]) -> ProxyObject:
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
    cell = ProxyCell(cls, int(header["nbytes"]),
                     _NO_PRIORITY if priority is None else priority[1], form, payload)
    return ProxyObject(cell)


class _Owned(numpy.ndarray):
    """A byte array that keeps `owner` alive."""

    owner: Any


def _owned_view(buffer: memoryview, owner: Any) -> memoryview:
    array = numpy.frombuffer(buffer, dtype=numpy.uint8).view(_Owned)
    array.owner = owner
    return memoryview(array)  # type: ignore[arg-type]


def _dask_serialize(proxy: ProxyObject) -> tuple[dict[str, Any], list[Any]]:
    return _serialize(proxy, device=False)


def _cuda_serialize(proxy: ProxyObject) -> tuple[dict[str, Any], list[Any]]:
    return _serialize(proxy, device=True)


def _register_serialization() -> None:
    from dask.sizeof import sizeof
    from distributed.protocol import (
        cuda_deserialize,
        cuda_serialize,
        dask_deserialize,
        dask_serialize,
    )

    dask_serialize.register(ProxyObject)(_dask_serialize)
    dask_deserialize.register(ProxyObject)(_deserialize)
    cuda_serialize.register(ProxyObject)(_cuda_serialize)
    cuda_deserialize.register(ProxyObject)(_deserialize)
    sizeof.register(ProxyObject)(lambda p: p._pxy.nbytes)


# ----------------------------------------------------------------------------------
# dask dispatch
# ----------------------------------------------------------------------------------
def _priority(x: Any) -> Any:
    return getattr(x, "__array_priority__", 0)


def _by_type(dispatcher: Any, pick: Callable[[tuple[Any, ...]], Any],
             unwrap_first: bool = True) -> Callable[..., Any]:
    """For registries used as `dispatcher.dispatch(type(x))(*args)`: unwrap the
    arguments and dispatch again on the type `pick` chooses from them."""

    def redispatch(*args: Any, **kwargs: Any) -> Any:
        args = _unwrap(args)
        kwargs = _unwrap(kwargs)
        return dispatcher.dispatch(type(pick(args)))(*args, **kwargs)

    redispatch.__name__ = f"proxy_{dispatcher.__name__}"
    return redispatch


def _by_call(dispatcher: Any) -> Callable[..., Any]:
    """For registries called as `dispatcher(x, *args)`: unwrap and call again."""

    def redispatch(*args: Any, **kwargs: Any) -> Any:
        return dispatcher(*_unwrap(args), **_unwrap(kwargs))

    redispatch.__name__ = f"proxy_{dispatcher.__name__}"
    return redispatch


def _highest(values: Any) -> Any:
    return max(values, key=_priority)


_DISPATCH_REGISTERED = False
_DISPATCH_LOCK = threading.Lock()


def register_dask_dispatch() -> None:
    """Register ProxyObject with dask's dispatch registries (dask.array always,
    dask.dataframe when pandas is installed), and distributed's serializers.
    Idempotent; called when the first proxy is made. (distributed's serializers
    are registered when this module is imported.)"""
    global _DISPATCH_REGISTERED
    with _DISPATCH_LOCK:
        if _DISPATCH_REGISTERED:
            return
        _register_array()
        if importlib.util.find_spec("pandas") is not None:
            _register_dataframe()
        _DISPATCH_REGISTERED = True


def _register_array() -> None:
    from dask.array import dispatch as d

    d.concatenate_lookup.register(ProxyObject)(
        _by_type(d.concatenate_lookup, lambda a: _highest(a[0])))
    d.tensordot_lookup.register(ProxyObject)(
        _by_type(d.tensordot_lookup, lambda a: _highest(a[:2])))
    d.einsum_lookup.register(ProxyObject)(_by_type(d.einsum_lookup, lambda a: a[1]))
    d.divide_lookup.register(ProxyObject)(_by_type(d.divide_lookup, lambda a: _highest(a[:2])))
    for name in ("take_lookup", "numel_lookup", "nannumel_lookup", "percentile_lookup",
                 "to_numpy_dispatch", "to_cupy_dispatch"):
        registry = getattr(d, name, None)
        if registry is not None:
            registry.register(ProxyObject)(_by_call(registry))


def _register_dataframe() -> None:
    try:
        dd = importlib.import_module("dask.dataframe.dispatch")
    except ImportError:
        return
    dd.concat_dispatch.register(ProxyObject)(_by_type(dd.concat_dispatch, lambda a: a[0][0]))
    for name in ("make_meta_dispatch", "make_meta_obj", "meta_nonempty", "meta_lib_from_array",
                 "hash_object_dispatch", "group_split_dispatch", "tolist_dispatch",
                 "is_categorical_dtype_dispatch", "categorical_dtype_dispatch",
                 "grouper_dispatch", "partd_encode_dispatch", "pyarrow_schema_dispatch",
                 "to_pyarrow_table_dispatch", "to_pandas_dispatch", "get_parallel_type"):
        registry = getattr(dd, name, None)
        if registry is not None:
            registry.register(ProxyObject)(_by_call(registry))


# Serializers are registered when this module is imported: a process that receives a
# proxy (a client gathering results, say) imports this module while unpickling the
# proxy's type, before distributed looks the deserializer up.
_register_serialization()

__all__ = [
    "ProxyCell",
    "ProxyError",
    "ProxyObject",
    "SerializedFrames",
    "asproxy",
    "host_form",
    "is_proxy",
    "location",
    "materialize",
    "register_dask_dispatch",
    "unproxy",
]
