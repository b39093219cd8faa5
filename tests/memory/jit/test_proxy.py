"""ProxyObject on a CPU: it behaves like the object it stands for, pickles and
serializes without unspilling, and dask.array / dask.dataframe accept it.

"Device" arrays here are `DevArray`, a NumPy subclass exposing
`__cuda_array_interface__` over host memory (with a handler that rebuilds the
same type), so NumPy computes on them as CuPy would on a GPU. Not covered: real
CuPy objects (tests/memory/jit/test_jit_gpu.py).
"""

from __future__ import annotations

import copy
import gc
import operator
import pickle
import subprocess
import sys
import weakref
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
from dask.sizeof import sizeof
from distributed.protocol import deserialize, serialize

from cudask.memory.handlers import CudaArrayInterfaceHandler, register_handler
from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.jit.cell import ProxyError
from cudask.memory.jit.proxy import ProxyObject, asproxy, is_proxy, unproxy
from cudask.testing.fake_cuda import FakeCopyBackend


class DevArray(np.ndarray):
    """A NumPy array that says it lives on the device."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        ai = self.__array_interface__
        return {
            "shape": ai["shape"],
            "typestr": ai["typestr"],
            "data": ai["data"],
            "strides": ai["strides"],
            "version": 3,
        }


class DevArrayHandler(CudaArrayInterfaceHandler):
    name = "test-devarray"

    def accepts(self, obj: Any) -> bool:
        return True

    def allocations(self, obj: Any) -> list[tuple[int, int]]:
        root = obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        ptr = int(root.__array_interface__["data"][0])
        return [(ptr, ptr + root.nbytes)] if root.nbytes else []

    def rebuild(self, owner: Any, ptr: int, meta: dict[str, Any], engine: TransferEngine) -> Any:
        return np.ndarray(
            meta["shape"],
            dtype=np.dtype(meta["typestr"]),
            buffer=owner,
            offset=ptr - int(owner.ctypes.data),
            strides=meta["strides"],
        ).view(DevArray)


register_handler(DevArray, DevArrayHandler())


def devarray(values: Any) -> DevArray:
    return np.array(values).view(DevArray)


# ----------------------------------------------------------------------------------
# behaving like the object
# ----------------------------------------------------------------------------------
def test_attributes_containers_and_identity() -> None:
    a = np.arange(12.0).reshape(3, 4)
    p = asproxy(a)
    assert type(p) is ProxyObject and is_proxy(p) and not is_proxy(a)
    assert isinstance(p, np.ndarray) and p.__class__ is np.ndarray
    assert p.shape == (3, 4) and p.dtype == a.dtype and p.T.shape == (4, 3)
    assert len(p) == 3 and (p[1] == a[1]).all() and [r.sum() for r in p] == [6.0, 22.0, 38.0]
    assert 5.0 in p and 100.0 not in p
    p[0, 0] = 42.0
    assert a[0, 0] == 42.0  # same object
    p.flags.writeable = True
    assert unproxy(p) is a and unproxy([p, (p,), {"k": p}]) == [a, (a,), {"k": a}]
    assert "ProxyObject of numpy.ndarray" in repr(p) and "detached-object" in repr(p)
    assert str(p) == str(a) and f"{asproxy(3.5):.2f}" == "3.50"
    assert "reshape" in dir(p)
    assert sizeof(p) == a.nbytes
    assert copy.copy(p) is not a and (copy.deepcopy(p) == a).all()


def test_scalars_conversions_and_hash() -> None:
    s = asproxy(np.float64(2.5))
    assert float(s) == 2.5 and int(s) == 2 and complex(s) == 2.5 and bool(s)
    assert round(s) == 2 and round(s, 1) == 2.5
    assert hash(asproxy("key")) == hash("key")
    assert operator.index(asproxy(7)) == 7 and [0, 1, 2][asproxy(1)] == 1
    with pytest.raises(TypeError, match="unhashable"):
        hash(asproxy(np.arange(3)))


@pytest.mark.parametrize(
    "op",
    ["add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "lt", "le", "eq", "ne", "gt", "ge"],
)
def test_binary_and_reflected_operators(op: str) -> None:
    a, b = np.arange(1.0, 7.0), np.full(6, 2.0)
    f = getattr(operator, op)
    assert (f(asproxy(a), b) == f(a, b)).all()
    assert (f(a, asproxy(b)) == f(a, b)).all()  # through __array_ufunc__
    assert (f(asproxy(a), asproxy(b)) == f(a, b)).all()
    assert (f(3.0, asproxy(b)) == f(3.0, b)).all()  # reflected


def test_bitwise_matmul_unary_divmod() -> None:
    i, j = np.arange(8), np.full(8, 3)
    for op in (operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift):
        assert (op(asproxy(i), j) == op(i, j)).all() and (op(5, asproxy(j)) == op(5, j)).all()
    m = np.arange(9.0).reshape(3, 3)
    assert (asproxy(m) @ m == m @ m).all() and (m @ asproxy(m) == m @ m).all()
    assert (-asproxy(i) == -i).all() and (+asproxy(i) == i).all()
    assert (abs(asproxy(-i)) == i).all() and (~asproxy(i) == ~i).all()
    q, r = divmod(asproxy(i), 3)
    assert (q == i // 3).all() and (r == i % 3).all()


def test_in_place_operators_keep_the_proxy() -> None:
    a = np.arange(4.0)
    p = asproxy(a)
    p += 1
    p *= asproxy(np.full(4, 2.0))
    p @= np.eye(4)
    assert type(p) is ProxyObject and unproxy(p) is a and (a == [2, 4, 6, 8]).all()
    n = asproxy(3)
    n += 1  # immutable object: the result replaces the proxy
    assert n == 4 and type(n) is int


def test_numpy_protocols() -> None:
    a = np.arange(6.0).reshape(2, 3)
    p = asproxy(a)
    assert (np.sqrt(p) == np.sqrt(a)).all()  # __array_ufunc__
    assert np.add.reduce(p, axis=0).tolist() == [3.0, 5.0, 7.0]
    out = np.empty(6).reshape(2, 3)
    np.multiply(p, 2, out=asproxy(out))
    assert (out == a * 2).all()
    assert (np.concatenate([p, p]) == np.concatenate([a, a])).all()  # __array_function__
    assert np.linalg.norm(p) == np.linalg.norm(a) and np.mean(p) == a.mean()
    assert np.shares_memory(np.asarray(p), a) and np.asarray(p, dtype="f4").dtype == np.float32
    assert np.array(p, copy=True) is not a
    assert p.__array_interface__ == a.__array_interface__
    d = asproxy(devarray([1, 2, 3]))
    assert d.__cuda_array_interface__["shape"] == (3,)
    with pytest.raises(AttributeError):
        _ = asproxy(a).__cuda_array_interface__
    assert not hasattr(asproxy(a), "__cuda_array_interface__")
    assert getattr(asproxy(a), "__array_priority__", None) == a.__array_priority__
    assert not hasattr(asproxy(3), "__array_priority__")


def test_unsupported_operations_name_themselves(make_proxy_store: Any) -> None:
    p = asproxy(np.arange(3))
    with pytest.raises(ProxyError, match="cannot assign __class__.*unproxy"):
        p.__class__ = list  # type: ignore[assignment]
    store = make_proxy_store()
    store["k"] = devarray([1.0, 2.0])
    q = store["k"]
    store.close()
    with pytest.raises(ProxyError, match=r"test_proxy.DevArray for attribute 'sum'.*closed"):
        q.sum()
    with pytest.raises(ProxyError, match="for len: .*closed"):
        len(q)


# ----------------------------------------------------------------------------------
# pickling and distributed serialization
# ----------------------------------------------------------------------------------
def test_pickle_round_trip_of_a_detached_proxy() -> None:
    a = np.arange(10.0)
    for protocol in (2, 5):
        p = pickle.loads(pickle.dumps(asproxy(a), protocol=protocol))
        assert type(p) is ProxyObject and isinstance(p, np.ndarray) and (p == a).all()


def test_spilled_proxy_pickles_its_host_copy_without_unspilling(make_proxy_store: Any) -> None:
    backend = FakeCopyBackend()
    store = make_proxy_store(device_memory_limit=1000, backend=backend)
    store["a"] = devarray(np.arange(100.0))  # 800 B
    store["b"] = devarray(np.arange(100.0) * 2)  # spills "a"
    p = store["a"]
    assert store.where("a") == "host"
    h2d = backend.copies.count(("h2d", 800))
    data = pickle.dumps(p, protocol=5)
    assert backend.copies.count(("h2d", 800)) == h2d and store.where("a") == "host"
    q = pickle.loads(data)
    assert "detached-hostcopy" in repr(q)
    other = make_proxy_store(device_memory_limit=1000)
    other["a2"] = q  # adopted in host form: no device memory used yet
    assert other.where("a2") == "host" and other.device_bytes == 0
    assert type(unproxy(q)) is DevArray and (q == np.arange(100.0)).all()
    assert other.where("a2") == "device" and other.device_bytes == 800


@pytest.mark.parametrize("family", ["dask", "cuda"])
def test_serializing_a_spilled_proxy_sends_the_host_copy(
    make_proxy_store: Any, family: str
) -> None:
    backend = FakeCopyBackend()
    store = make_proxy_store(device_memory_limit=1000, backend=backend)
    store["a"] = devarray(np.arange(100.0))
    store["b"] = devarray(np.ones(100))
    assert store.where("a") == "host"
    header, frames = serialize(store["a"], serializers=(family,))
    assert header["serializer"] == family and header["sub-header"]["form"] == "hostcopy"
    assert store.where("a") == "host" and ("h2d", 800) not in backend.copies
    received = deserialize(header, frames)
    assert type(received) is ProxyObject
    del store["a"]  # the sender lets go; the frames keep their blocks alive
    other = make_proxy_store()
    other["x"] = received
    assert (unproxy(other["x"]) == np.arange(100.0)).all()


def test_serializing_a_device_proxy_sends_the_object(make_proxy_store: Any) -> None:
    store = make_proxy_store(device_memory_limit=10_000)
    store["a"] = devarray(np.arange(5.0))
    header, frames = serialize(store["a"], serializers=("dask", "pickle"))
    assert header["sub-header"]["form"] == "frames"
    received = deserialize(header, frames)
    assert "detached-frames" in repr(received)
    # distributed's NumPy serializer sends the data (as a plain ndarray)
    assert isinstance(received, np.ndarray) and (received == np.arange(5.0)).all()
    again = pickle.loads(pickle.dumps(received))
    assert (again == np.arange(5.0)).all()


# ----------------------------------------------------------------------------------
# dask dispatch
# ----------------------------------------------------------------------------------
def test_dask_array_dispatch_registries_unwrap_proxies() -> None:
    from dask.array.dispatch import (
        concatenate_lookup,
        divide_lookup,
        einsum_lookup,
        numel_lookup,
        tensordot_lookup,
    )

    a, b = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
    pa, pb = asproxy(a), asproxy(b)
    concat = concatenate_lookup.dispatch(type(pa))
    assert (concat([pa, asproxy(a)], axis=0) == np.concatenate([a, a])).all()
    assert (tensordot_lookup.dispatch(type(pa))(pa, pb, axes=1) == a @ b).all()
    assert (einsum_lookup.dispatch(type(pa))("ij,jk->ik", pa, pb) == a @ b).all()
    assert (divide_lookup.dispatch(type(pa))(pa, 2) == a / 2).all()
    assert numel_lookup(pa) == 6


def test_dask_array_graph_on_proxied_chunks() -> None:
    rng = np.random.default_rng(0)
    blocks = [[rng.random((4, 5)) for _ in range(3)] for _ in range(2)]
    x = da.block(
        [
            [
                da.from_delayed(dask.delayed(asproxy)(blk), (4, 5), float, meta=np.empty((0, 0)))
                for blk in row
            ]
            for row in blocks
        ]
    )
    full = np.block(blocks)
    with dask.config.set(scheduler="sync"):
        assert np.allclose(
            unproxy(((x @ x.T)[:, ::-1] + x[:, :8]).sum().compute()),
            ((full @ full.T)[:, ::-1] + full[:, :8]).sum(),
        )
        assert np.allclose(unproxy(da.einsum("ij,kj->ik", x, x).compute()), full @ full.T)
        assert np.allclose(
            unproxy(da.tensordot(x, x, axes=([0], [0])).compute()),
            np.tensordot(full, full, axes=([0], [0])),
        )
        assert np.allclose(unproxy(x.rechunk((3, 7)).mean(axis=0).compute()), full.mean(axis=0))
        assert np.allclose(
            unproxy(da.concatenate([x, x], axis=1).std().compute()),
            np.concatenate([full, full], axis=1).std(),
        )


def test_dask_dataframe_dispatch_registries_unwrap_proxies() -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("dask.dataframe")
    from dask.dataframe.dispatch import (
        concat_dispatch,
        group_split_dispatch,
        hash_object_dispatch,
        make_meta_dispatch,
        meta_nonempty,
    )

    df = pd.DataFrame({"a": [1, 2, 3, 4], "b": [0.5, 1.5, 2.5, 3.5]})
    p = asproxy(df)
    assert isinstance(p, pd.DataFrame)
    assert hash_object_dispatch(p, index=False).equals(hash_object_dispatch(df, index=False))
    concat = concat_dispatch.dispatch(type(p))
    assert concat([p, asproxy(df)]).equals(pd.concat([df, df]))
    parts = group_split_dispatch(p, asproxy(np.array([0, 1, 0, 1])), 2)
    assert parts[0].equals(df.iloc[[0, 2]]) and parts[1].equals(df.iloc[[1, 3]])
    meta = make_meta_dispatch(p)
    assert list(meta.columns) == ["a", "b"] and len(meta) == 0
    assert len(meta_nonempty(asproxy(meta))) > 0


# ----------------------------------------------------------------------------------
# import hygiene
# ----------------------------------------------------------------------------------
def test_importing_creates_no_cuda_dependency() -> None:
    code = (
        "import sys, cudask.memory.jit.proxy, cudask.memory.jit.proxy_store; "
        "assert 'cupy' not in sys.modules and 'rmm' not in sys.modules; "
        "assert 'dask.dataframe' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_device_proxy_goes_by_ipc_handle_and_arrives_whole(
    make_proxy_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JIT-unspill: a proxy whose object is on the device, asked for by a cudask
    worker of the same host (the cudask-ipc family first, as cudask's Worker
    answers get_data), goes by CUDA IPC handle, and the receiver copies the
    object before answering (the mapping is the sender's only until then).
    Asked for the usual way (the scheduler, a client, a worker without cudask)
    it is sent as before; a spilled proxy sends its host copy."""
    import sys
    import types

    from cudask.comm import ipc
    from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeDeviceArray))
    monkeypatch.setattr(ipc, "_state", ipc._State())
    fake = FakeIPCBackend()
    ipc.enable(fake, min_size=1024)
    local = {"recipient": {"address": "tcp://127.0.0.1:40000"}}
    reply = [ipc.FAMILY, "dask", "pickle", "error"]
    # (no spill on demand: it would hook the stand-in CuPy's allocator)
    store = make_proxy_store(device_memory_limit=100_000, spill_on_demand=False)
    store["a"] = fake.allocate(np.arange(4096, dtype="u1"))
    header, _ = serialize(store["a"], serializers=["dask", "pickle"], context=local)
    assert not header["sub-header"]["device-frames"] and fake.opened == []
    header, _ = serialize(store["a"], serializers=reply, context=local)
    assert header["serializer"] != ipc.FAMILY  # outside a send that holds what it exports
    exported = weakref.ref(unproxy(store["a"]))  # what the handle will name
    with ipc.keep_alive():  # as cudask's Worker.get_data answers
        header, frames = serialize(store["a"], serializers=reply, context=local)
        assert header["serializer"] == ipc.FAMILY and header["proxy"]["device-frames"]
        assert store.where("a") == "device"
        store.spill_device(4096)  # spilled before the peer has mapped it
        gc.collect()
        assert store.where("a") == "host" and exported() is not None  # the handle's memory lives on
        received = deserialize(header, frames, deserializers=reply)
    gc.collect()
    assert exported() is None  # released once the send is over
    assert fake.opened == [b"h0"] and len(fake.closed) == 1 and ipc.mapped() == 0
    del store["a"]  # the sender lets go: the receiver already has its own copy
    value = unproxy(received)
    assert type(value) is FakeDeviceArray and (value.get() == np.arange(4096, dtype="u1")).all()
    # spilled: the host copy, not a handle
    store["b"] = fake.allocate(np.ones(60_000, dtype="u1"))
    store["c"] = fake.allocate(np.ones(60_000, dtype="u1"))
    assert store.where("b") == "host"
    with ipc.keep_alive():
        header, frames = serialize(store["b"], serializers=reply, context=local)
    assert header["proxy"]["form"] == "hostcopy" and ipc.stats()["sent"] == 1
    assert type(deserialize(header, frames, deserializers=reply)) is ProxyObject
