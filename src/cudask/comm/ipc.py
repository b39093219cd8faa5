"""Device arrays sent between workers of one node by CUDA IPC, not through host memory.

Covers: the ``cudask-ipc`` serialization family of dask.distributed. A cudask
worker's requests say it accepts the family (`SERIALIZERS`), and a cudask
worker answering another one's request for data (``get_data``, through
cudask.comm.worker.Worker) tries it first: each CuPy array of at least
``cudask.comm.device-ipc-min-size`` bytes going to a worker on the same host is
sent as a CUDA IPC handle of the allocation holding it plus the offset and byte
strides of its first element (a few hundred bytes). Strided views go the same
way (an all-to-all rechunk sends column blocks of row blocks): the receiver
reads them in place, with no contiguous copy on the sender. The receiving
worker maps that allocation, copies the array into memory of its own (GPU to
GPU: the same device, or a peer over NVLink / PCIe; contiguous or pitched rows
by the copy engines, other layouts by a copy kernel), waits for the copy,
unmaps (keeps an RMM pool slab of a live sender mapped:
cudask.comm.lifetimes), and only then answers; anything else (another host, small arrays,
structured dtypes, host data, memory that cannot be exported) falls through to
distributed's own serializers. JIT-unspill proxies on the device use
the family too (cudask.memory.proxy).

Lifetimes: distributed holds what it sends until the receiver replies (the
``"OK"`` of ``get_data``, the response of an RPC), and the receiver replies only
after its copy has finished, so the sender's memory outlives every mapping of
it. A receiver that dies leaves nothing behind (its mappings end with its
process); a sender that dies before the reply makes the receive fail, and
distributed fetches the data again or recomputes it.

Does not cover: deciding which workers use it (cudask.worker.spec: not with UCX,
whose own cuda_ipc transport does the same) and the per-worker setup
(`DeviceIPC` in cudask.worker.plugins calls `enable`).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import pickle
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from distributed.protocol.serialize import register_serialization_family

from cudask.comm import lifetimes

logger = logging.getLogger("cudask.comm")

FAMILY = "cudask-ipc"
# What a cudask worker's requests carry (first match wins) and what it accepts. The
# family comes last, so a worker without cudask answering the request serializes
# with "dask" or "pickle" and never looks up a name it does not know;
# cudask.comm.worker.Worker moves it first when answering get_data.
SERIALIZERS = ("dask", "pickle", "error", FAMILY)


class Backend(Protocol):
    """The CUDA calls the family needs (CudaBackend; tests give a fake one)."""

    def ready(self) -> None:
        """Wait for work queued on this process's default stream (the kernels that
        wrote what is about to be sent: another process's copy is not ordered
        after them)."""

    def export(self, ptr: int) -> tuple[bytes, int]:
        """The IPC handle of the allocation holding `ptr`, and `ptr`'s offset in it."""

    def open(self, handle: bytes) -> int:
        """Map another process's allocation; return its address here."""

    def close(self, base: int) -> None:
        """Unmap what `open` mapped."""

    def empty(self, shape: tuple[int, ...], dtype: str, order: str) -> Any:
        """A new device array of this process."""

    def copy(self, out: Any, src: int, strides: tuple[int, ...]) -> None:
        """Copy the array at device address `src` (the shape and dtype of `out`,
        these byte strides) into `out`, and wait for the copy to finish."""


class CudaBackend:
    """CUDA IPC through CuPy's runtime bindings; the allocation's base address
    through the driver API of cuda-bindings (RMM and CuPy pools hand out pieces
    of larger allocations, and a handle names the whole allocation)."""

    def __init__(self) -> None:
        import cupy
        from cuda.bindings import driver

        self._cupy = cupy
        self._driver = driver

    def ready(self) -> None:
        self._cupy.cuda.runtime.streamSynchronize(0)

    def export(self, ptr: int) -> tuple[bytes, int]:
        # distributed may serialize in a thread of its own, where no CUDA context is
        # current yet: the driver API needs one (cudaFree(0) binds the primary context).
        self._cupy.cuda.runtime.free(0)
        err, base, _size = self._driver.cuMemGetAddressRange(ptr)
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemGetAddressRange failed: {err}")
        base = int(base)
        handle = self._cupy.cuda.runtime.ipcGetMemHandle(base)
        return bytes(handle), ptr - base

    def open(self, handle: bytes) -> int:
        # cudaIpcMemLazyEnablePeerAccess: a peer GPU's memory is mapped with peer access.
        return int(self._cupy.cuda.runtime.ipcOpenMemHandle(handle, 1))

    def close(self, base: int) -> None:
        self._cupy.cuda.runtime.ipcCloseMemHandle(base)

    def empty(self, shape: tuple[int, ...], dtype: str, order: str) -> Any:
        return self._cupy.empty(shape, dtype=dtype, order=order)

    def copy(self, out: Any, src: int, strides: tuple[int, ...]) -> None:
        cupy = self._cupy
        runtime = cupy.cuda.runtime
        dst, shape, itemsize = int(out.data.ptr), tuple(out.shape), int(out.itemsize)
        if strides == tuple(out.strides):  # same layout: one block of bytes
            runtime.memcpy(dst, src, int(out.nbytes), runtime.memcpyDefault)
        elif (len(shape) == 2 and strides[1] == itemsize and strides[0] >= shape[1] * itemsize
              and out.flags.c_contiguous):
            width = shape[1] * itemsize  # rows of a wider array: a pitched copy
            runtime.memcpy2D(dst, width, src, strides[0], width, shape[0], runtime.memcpyDefault)
        else:  # any other layout: a copy kernel reading the mapping in place
            low, span = extent(src, shape, strides, itemsize)
            memory = cupy.cuda.UnownedMemory(low, span, None, cupy.cuda.Device().id)
            view = cupy.ndarray(shape, out.dtype, cupy.cuda.MemoryPointer(memory, src - low), strides)
            out[...] = view
            cupy.cuda.get_current_stream().synchronize()
        # A copy between device addresses returns before it has finished; the sender
        # may reuse its memory once this worker replies, so wait here.
        runtime.streamSynchronize(0)


@dataclass
class _State:
    """This process's side of the family: on once `enable` ran."""

    backend: Backend | None = None  # sending by IPC when set
    receiver: Backend | None = None
    min_size: int = 1 << 20
    node: str = ""
    local_hosts: frozenset[str] = frozenset()
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Mapped allocations of other processes, by handle (one mapping per handle and process).
    mappings: lifetimes.Mappings = field(default_factory=lifetimes.Mappings)
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("sent", "sent-bytes", "received", "received-bytes", "receive-seconds", "declined"), 0.0))
    warned: set[str] = field(default_factory=set)


_state = _State()

# Device memory exported while a send is under way that nothing else keeps alive (the
# frames cuDF's device_serialize makes, e.g. compacted copies of sliced columns): held
# here until the sender has the peer's answer. Set by `keep_alive`; a context variable,
# so distributed's serialization threads (offload copies the context) see the same list.
_held: ContextVar[list[Any] | None] = ContextVar("cudask_ipc_held", default=None)


@contextmanager
def keep_alive() -> Iterator[None]:
    """Keep what is exported by handle inside this block alive until it ends: wrap a
    send and the wait for the peer's answer (cudask.comm.worker.Worker.get_data,
    the explicit-comms shuffle). Objects whose device frames need it go by handle
    only inside such a block."""
    token = _held.set([])
    try:
        yield
    finally:
        _held.reset(token)


@functools.cache
def node_identity() -> str:
    """This machine's boot: equal for every process of one running host (read once)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _local_hosts() -> frozenset[str]:
    """The addresses this host listens on (loopback included)."""
    import psutil

    hosts = {"localhost", socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        hosts.update(a.address.split("%")[0] for a in addrs
                     if a.family in (socket.AF_INET, socket.AF_INET6))
    return frozenset(hosts)


def enable(backend: Backend, min_size: int) -> None:
    """Send device arrays of at least `min_size` bytes to workers on this host by
    IPC, with `backend`'s CUDA calls (the worker plugin calls this at start)."""
    with _state.lock:
        _state.backend = backend
        _state.min_size = min_size
        _state.node = node_identity()
        _state.local_hosts = _local_hosts()


def disable() -> None:
    """Stop sending by IPC (what is received still works)."""
    with _state.lock:
        _state.backend = None


def enabled() -> bool:
    return _state.backend is not None


def stats() -> dict[str, float]:
    """Arrays and bytes sent and received by IPC in this process, seconds spent
    receiving (map, copy, unmap), arrays declined (sent the usual way), and the
    mappings opened, reused (kept from an earlier message) and open now."""
    with _state.lock:
        counts = dict(_state.counts)
    mappings = _state.mappings
    return {**counts, **mappings.counts, "mappings-open": len(mappings), "mappings-kept": mappings.kept()}


def mapped() -> int:
    """Other processes' allocations mapped here now."""
    return len(_state.mappings)


def sweep() -> int:
    """Close kept mappings of senders that have ended (the worker runs this
    periodically); how many were closed."""
    backend = _state.backend or _state.receiver
    return _state.mappings.sweep(backend) if backend is not None else 0


def close_mappings() -> None:
    """Close every idle mapping (the worker is closing)."""
    backend = _state.backend or _state.receiver
    if backend is not None:
        _state.mappings.close_all(backend)


def declined() -> list[str]:
    """Why arrays were sent the usual way instead (each reason once)."""
    with _state.lock:
        return sorted(_state.warned)


def _host_of(address: str) -> str | None:
    """The host part of a comm address ('tcp://10.0.0.2:8786', 'tls://[::1]:1')."""
    if "://" not in address:
        return None
    scheme, rest = address.split("://", 1)
    if scheme not in ("tcp", "tls", "ws", "wss"):
        return None
    host = rest.rsplit(":", 1)[0].strip("[]")
    return host or None


def same_host(context: dict[str, Any] | None) -> bool:
    """Whether the comm's peer ("recipient" in distributed's serialization
    context) is a process on this host."""
    if not context:
        return False
    recipient = context.get("recipient") or {}
    host = _host_of(str(recipient.get("address", "")))
    if host is None:
        return False
    if host in _state.local_hosts:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _device_array_type() -> Any:
    cupy = sys.modules.get("cupy")
    return cupy.ndarray if cupy is not None else None


def _decline(reason: str) -> None:
    with _state.lock:
        _state.counts["declined"] += 1
        first = reason not in _state.warned
        _state.warned.add(reason)
    if first:
        logger.info("cudask: device data sent through host memory: %s (logged once)", reason)
    raise NotImplementedError(reason)


@dataclass(frozen=True)
class Layout:
    """Where an array's elements lie, by its __cuda_array_interface__."""

    shape: tuple[int, ...]
    typestr: str
    address: int  # of its first element
    strides: tuple[int, ...]  # in bytes, any sign
    order: str  # of the copy the receiver makes: "F" for Fortran-contiguous arrays, else "C"


def _layout(x: Any) -> Layout | None:
    """The layout of `x`; None for structured dtypes (the type string loses the fields)."""
    cai = x.__cuda_array_interface__
    shape = tuple(int(n) for n in cai["shape"])
    typestr = str(cai["typestr"])
    if len(cai.get("descr") or [("", typestr)]) > 1 or typestr[1] == "V":
        return None
    itemsize = int(typestr[2:])
    given = cai.get("strides")
    strides = _strides(shape, itemsize, "C") if given is None else tuple(int(s) for s in given)
    fortran = strides != _strides(shape, itemsize, "C") and strides == _strides(shape, itemsize, "F")
    return Layout(shape, typestr, int(cai["data"][0]), strides, "F" if fortran else "C")


def _strides(shape: tuple[int, ...], itemsize: int, order: str) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in (reversed(shape) if order == "C" else shape):
        out.append(step)
        step *= n
    return tuple(reversed(out)) if order == "C" else tuple(out)


def dumps(x: Any, context: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """A CUDA IPC handle for `x` when it may go that way; NotImplementedError
    (distributed then tries the next serializer) otherwise."""
    backend = _state.backend
    proxy = sys.modules.get("cudask.memory.proxy")
    if proxy is not None and backend is not None and type(x) is proxy.ProxyObject:
        if not same_host(context):
            raise NotImplementedError(FAMILY)
        proxy_header, proxy_frames = proxy.ipc_serialize(x, context)  # its object, by handle if on the device
        return {"proxy": proxy_header}, proxy_frames
    if backend is None or not same_host(context):
        raise NotImplementedError(FAMILY)
    array_type = _device_array_type()
    frames: list[Any] = []
    if array_type is not None and type(x) is array_type:
        if int(x.nbytes) < _state.min_size:
            raise NotImplementedError(FAMILY)
        entry = _export(backend, x)
        header = {**entry, "node": _state.node, "sender": lifetimes.this_process().as_header()}
        nbytes = entry["nbytes"]
    elif _device_serializable(x) and _held.get() is not None:
        header, frames = _dumps_device_serialized(backend, x)
        nbytes = sum(e["nbytes"] for e in header["entries"] if "handle" in e)
    else:
        raise NotImplementedError(FAMILY)
    with _state.lock:
        _state.counts["sent"] += 1
        _state.counts["sent-bytes"] += nbytes
    return header, frames


def _export(backend: Backend, x: Any) -> dict[str, Any]:
    """The handle, offset and layout of a device array (waiting first for the
    work queued to write it); NotImplementedError when it cannot go by handle."""
    layout = _layout(x)
    if layout is None:
        raise NotImplementedError(FAMILY)  # distributed's serializer copies it
    try:
        handle, offset = backend.export(layout.address)
    except RuntimeError as exc:  # CUDA errors, e.g. stream-ordered (cudaMallocAsync) memory
        _decline(f"its memory cannot be exported for IPC ({exc})")
    backend.ready()
    itemsize = int(layout.typestr[2:])
    return {
        "shape": list(layout.shape),
        "dtype": layout.typestr,
        "order": layout.order,
        "strides": list(layout.strides),
        "handle": handle,
        "offset": offset,
        "lasting": lifetimes.sending(layout.address - offset),  # an RMM pool slab
        "nbytes": itemsize * math.prod(layout.shape),
    }


def extent(address: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The lowest address and the byte span of the elements of an array whose first
    element is at `address`, laid out with these byte strides (any sign)."""
    low = address + sum((n - 1) * s for n, s in zip(shape, strides, strict=True) if s < 0)
    return low, sum((n - 1) * abs(s) for n, s in zip(shape, strides, strict=True)) + itemsize


def _device_serializable(x: Any) -> bool:
    """Whether `x` follows cuDF's device-serialization protocol: `x.device_serialize()`
    gives (header, frames), device frames exposing __cuda_array_interface__, and
    `type(x).device_deserialize(header, frames)` rebuilds it (cuDF frames, series,
    indexes and columns do)."""
    kind = type(x)
    return callable(getattr(kind, "device_serialize", None)) and callable(
        getattr(kind, "device_deserialize", None))


def _dumps_device_serialized(backend: Backend, x: Any) -> tuple[dict[str, Any], list[Any]]:
    """A device-serializable object: its device frames by handle, its host frames as they are."""
    inner, parts = x.device_serialize()
    held = _held.get()
    assert held is not None
    held.append(parts)  # its frames may be copies made for this send: alive until answered
    # elements of each device frame (cuDF's are bytes); None for host frames
    sizes = [math.prod(f.__cuda_array_interface__["shape"]) if hasattr(f, "__cuda_array_interface__")
             else None for f in parts]
    if sum(n for n in sizes if n) < _state.min_size:
        raise NotImplementedError(FAMILY)
    entries: list[dict[str, Any]] = []
    frames: list[Any] = []
    for f, size in zip(parts, sizes, strict=True):
        if size is None:
            entries.append({"host": len(frames)})
            frames.append(f)
        elif not size:
            entries.append({"empty": f.__cuda_array_interface__["typestr"]})  # no memory to export
        else:
            entries.append(_export(backend, f))
    header = {"device-serialized": inner, "type": pickle.dumps(type(x)), "entries": entries,
              "node": _state.node, "sender": lifetimes.this_process().as_header()}
    return header, frames


class _Explained:
    """The backend's open and close, a refused mapping explained."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def open(self, handle: bytes) -> int:
        try:
            return self.backend.open(handle)
        except RuntimeError as exc:
            raise RuntimeError(
                f"cudask-ipc: cannot map another worker's device memory here ({exc}); if the "
                "workers of this host cannot share GPU memory (e.g. containers with separate IPC "
                "namespaces), set cudask.comm.device-ipc: false on them") from exc

    def close(self, base: int) -> None:
        self.backend.close(base)


def loads(header: dict[str, Any], frames: list[Any]) -> Any:
    """Copy the sender's array into a new one of this process (or rebuild a
    device-serialized object, or a JIT-unspill proxy, whose object comes the same way)."""
    if "proxy" in header:
        from cudask.memory.proxy import ipc_deserialize

        return ipc_deserialize(header["proxy"], frames)
    if header["node"] != node_identity():
        raise RuntimeError(
            f"cudask-ipc: device data from process {header['sender']['pid']} on another host reached this "
            "worker by IPC handle, which only works within one host; set "
            "cudask.comm.device-ipc: false on the workers if hosts share network addresses")
    backend = _receiving_backend()
    start = time.perf_counter()
    _state.mappings.sweep(backend)
    sender = lifetimes.keepable(header.get("sender"))
    if "device-serialized" in header:
        with ExitStack() as mappings:  # buffers of one allocation share its mapping
            parts = [frames[e["host"]] if "host" in e
                     else backend.empty((0,), e["empty"], "C") if "empty" in e
                     else _receive_array(backend, e, mappings, sender) for e in header["entries"]]
        out = pickle.loads(header["type"]).device_deserialize(header["device-serialized"], parts)
        nbytes = sum(e["nbytes"] for e in header["entries"] if "handle" in e)
    else:
        with ExitStack() as mappings:
            out = _receive_array(backend, header, mappings, sender)
        nbytes = header["nbytes"]
    with _state.lock:
        _state.counts["received"] += 1
        _state.counts["received-bytes"] += nbytes
        _state.counts["receive-seconds"] += time.perf_counter() - start
    return out


def _receive_array(backend: Backend, entry: dict[str, Any], mappings: ExitStack,
                   sender: lifetimes.Process | None) -> Any:
    """A new array of this process holding a copy of the one `entry` names (the
    mapping is in use in `mappings` until the caller closes it, then closed, or
    kept when the sender marked its allocation lasting and `sender` is given)."""
    out = backend.empty(tuple(entry["shape"]), entry["dtype"], entry["order"])
    keep = sender if entry.get("lasting") else None
    base = mappings.enter_context(_state.mappings.use(_Explained(backend), bytes(entry["handle"]), keep))
    backend.copy(out, base + int(entry["offset"]), tuple(int(s) for s in entry["strides"]))
    return out


def _receiving_backend() -> Backend:
    """The backend receiving uses: the sending one, or (on a worker that does
    not send by IPC) one made on first use, so what a peer sends still arrives."""
    with _state.lock:
        if _state.backend is not None:
            return _state.backend
        if _state.receiver is None:
            _state.receiver = CudaBackend()
        return _state.receiver


register_serialization_family(FAMILY, dumps, loads)
