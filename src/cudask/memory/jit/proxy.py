"""Proxies: objects that stand for a device object which may be spilled.

Covers: `ProxyObject`, which behaves like the object it stands for - attribute
access, operators (arithmetic, comparison, in-place, matmul), NumPy's
`__array_ufunc__` / `__array_function__` / `__array__`, `__cuda_array_interface__`,
`__dlpack__`, `__len__`, `__getitem__`, `__iter__`, `isinstance` (through a
`__class__` property), pickling and distributed's serialization - and obtains
the object only when one of those is used. A proxy is *bound* to a ProxyStore
(cudask.memory.jit.proxy_store), which keeps the object and may spill it between
two uses, or *detached*: it holds the object, or a host form rebuilt on first
use. Also `unproxy`, `asproxy`, `is_proxy`, `location`, and the registration of
ProxyObject with distributed's serializers (at import: a process receiving a
proxy imports this module while unpickling its type) and with dask's dispatch
registries (when the first proxy is made).

Does not cover: a proxy's state and host forms (cudask.memory.jit.cell), its
header and frames (cudask.memory.jit.wire), `type(proxy) is X` checks or C code
that tests exact types (those see `ProxyObject`). In-place changes of an object
by a task racing with a spill of it are not seen by the host copy (dask tasks
must not change their inputs). Importing this module imports neither CuPy nor
distributed's CUDA parts and creates no CUDA context.

Threading: a proxy may be used from several threads; conversions of its host
form are serialized by its cell's lock.
"""

from __future__ import annotations

import copy as copy_module
import operator
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dask.utils import format_bytes, typename

from cudask.memory.jit import dask_dispatch, wire
from cudask.memory.jit.cell import (
    NO_PRIORITY,
    ProxyCell,
    ProxyError,
    host_form,
    new_cell,
    priority_arg,
    rebuilt_cell,
)


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
        if priority is NO_PRIORITY:
            raise AttributeError("__array_priority__")
        return priority

    def __repr__(self) -> str:
        cell = self._pxy
        return (
            f"<ProxyObject of {typename(cell.cls)} at {hex(id(self))}, "
            f"{format_bytes(cell.nbytes)}, {cell.where()}>"
        )

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
        return (_rebuild, (cell.cls, cell.nbytes, priority_arg(cell), form, payload))

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__reduce_ex__(2)


def _rebuild(cls: type, nbytes: int, priority: Any, form: str, payload: Any) -> ProxyObject:
    return ProxyObject(rebuilt_cell(cls, nbytes, priority, form, payload))


_OPS: list[tuple[str, Callable[..., Any]]] = [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("matmul", operator.matmul),
    ("truediv", operator.truediv),
    ("floordiv", operator.floordiv),
    ("mod", operator.mod),
    ("pow", operator.pow),
    ("lshift", operator.lshift),
    ("rshift", operator.rshift),
    ("and", operator.and_),
    ("xor", operator.xor),
    ("or", operator.or_),
]
_IOPS: dict[str, Callable[..., Any]] = {
    "add": operator.iadd,
    "sub": operator.isub,
    "mul": operator.imul,
    "matmul": operator.imatmul,
    "truediv": operator.itruediv,
    "floordiv": operator.ifloordiv,
    "mod": operator.imod,
    "pow": operator.ipow,
    "lshift": operator.ilshift,
    "rshift": operator.irshift,
    "and": operator.iand,
    "xor": operator.ixor,
    "or": operator.ior,
}
for _name, _op in _OPS:
    setattr(ProxyObject, f"__{_name}__", _binary(_op, f"__{_name}__"))
    setattr(ProxyObject, f"__r{_name}__", _reflected(_op, f"__r{_name}__"))
    setattr(ProxyObject, f"__i{_name}__", _inplace(_IOPS[_name], f"__i{_name}__"))
ProxyObject.__divmod__ = _binary(divmod, "__divmod__")  # type: ignore[operator]
ProxyObject.__rdivmod__ = _reflected(divmod, "__rdivmod__")  # type: ignore[attr-defined]
for _name, _op in [
    ("lt", operator.lt),
    ("le", operator.le),
    ("eq", operator.eq),
    ("ne", operator.ne),
    ("gt", operator.gt),
    ("ge", operator.ge),
]:
    setattr(ProxyObject, f"__{_name}__", _binary(_op, f"__{_name}__"))
for _name, _uop in [
    ("neg", operator.neg),
    ("pos", operator.pos),
    ("abs", operator.abs),
    ("invert", operator.invert),
]:
    setattr(ProxyObject, f"__{_name}__", _unary(_uop, f"__{_name}__"))  # type: ignore[arg-type]
for _name in ("trunc", "floor", "ceil"):
    _caller: Callable[[Any], Any] = operator.methodcaller(f"__{_name}__")  # type: ignore[assignment]
    setattr(ProxyObject, f"__{_name}__", _unary(_caller, f"__{_name}__"))

_WALK = frozenset({ProxyObject, list, tuple, dict})


# ----------------------------------------------------------------------------------
# distributed serialization and sizeof
# ----------------------------------------------------------------------------------
def ipc_serialize(
    proxy: ProxyObject, context: dict[str, Any] | None
) -> tuple[dict[str, Any], list[Any]]:
    """A proxy for a worker of this host that accepts the registered device
    families (the comm layer calls this): its object, if on the device, that way."""
    return wire.serialize(proxy._pxy, device=False, context=context, direct=True)


def ipc_deserialize(header: dict[str, Any], frames: list[Any]) -> ProxyObject:
    return _deserialize(header, frames)


def _deserialize(header: dict[str, Any], frames: list[Any]) -> ProxyObject:
    return ProxyObject(wire.deserialize(header, frames))


def _dask_serialize(proxy: ProxyObject) -> tuple[dict[str, Any], list[Any]]:
    return wire.serialize(proxy._pxy, device=False)


def _cuda_serialize(proxy: ProxyObject) -> tuple[dict[str, Any], list[Any]]:
    return wire.serialize(proxy._pxy, device=True)


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
_DISPATCH_REGISTERED = False
_DISPATCH_LOCK = threading.Lock()


def register_dask_dispatch() -> None:
    """Register ProxyObject with dask's dispatch registries (dask.array always,
    dask.dataframe when pandas is installed: cudask.memory.jit.dask_dispatch).
    Idempotent; called when the first proxy is made. (distributed's serializers
    are registered when this module is imported.)"""
    global _DISPATCH_REGISTERED
    with _DISPATCH_LOCK:
        if _DISPATCH_REGISTERED:
            return
        dask_dispatch.register(ProxyObject, _unwrap)
        _DISPATCH_REGISTERED = True


# Serializers are registered when this module is imported: a process that receives a
# proxy (a client gathering results, say) imports this module while unpickling the
# proxy's type, before distributed looks the deserializer up.
_register_serialization()

__all__ = [
    "ProxyObject",
    "asproxy",
    "ipc_deserialize",
    "ipc_serialize",
    "is_proxy",
    "location",
    "register_dask_dispatch",
    "unproxy",
]
