"""Device arrays sent between workers of one node by CUDA IPC, not through host memory.

Covers: the ``cudask-ipc`` serialization family of dask.distributed. A cudask
worker's requests say it accepts the family (`SERIALIZERS`), and a cudask
worker answering another one's request for data tries it first: each CuPy
array of at least ``cudask.comm.device-ipc-min-size`` bytes (strided views
too), each cuDF object's device buffers (``device_serialize``), and each
JIT-unspill proxy's object on the device, going to a worker on the same host,
is sent as a CUDA IPC handle of its allocation plus offset and layout; one
that fits the worker's staging area is first copied there and goes as the
area's handle (cudask.comm.staging), as must one in memory CUDA does not
export. The receiver maps the allocation, copies
into memory of its own, waits for the copy, unmaps (or keeps mapped a lasting
pool slab or staging area, or a leased chunk of CuPy's pool for a while:
cudask.comm.lifetimes, cudask.comm.leases), and only then answers, so the
sender's memory outlives every mapping of it.
Anything else falls through to distributed's own serializers. Also the
per-process switch (`enable`, `disable`), counters (`stats`, `declined`),
`keep_alive`, and the offer of lasting allocations to map ahead (`offer`,
`map_ahead`; which processes may exchange them: cudask.comm.ipc_peers; exchanged by
cudask.comm.ahead). Each send (`keep_alive`) and
receive is marked as device traffic (cudask.memory.host.traffic), during which
pinning ahead of spills waits.
Registers the family with distributed, and with the JIT-unspill layer
(cudask.memory.jit.wire) as a device family, when imported.

Does not cover: the CUDA calls (cudask.comm.ipc_cuda), array layouts
(cudask.comm.ipc_layout), the staging area's slots (cudask.comm.staging), deciding which workers use it (cudask.worker.spec:
not with UCX) and the per-worker setup (`DeviceIPC` in cudask.worker.plugins).

Threading: `dumps` runs in distributed's serialization threads, `loads` on the
receiving side; counters and the switch are guarded by one lock, mappings by
their own (cudask.comm.lifetimes). Design: docs/design/device-transfers.md.
"""

from __future__ import annotations

import logging
import math
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from distributed.protocol.serialize import register_serialization_family

from cudask.comm import ipc_cuda, ipc_layout, ipc_peers, leases, lifetimes, staging
from cudask.comm.ipc_cuda import Backend, Explained
from cudask.comm.ipc_peers import local_hosts, node_identity
from cudask.memory.host import traffic
from cudask.memory.jit import wire
from cudask.memory.jit.proxy import ProxyObject, ipc_deserialize, ipc_serialize

logger = logging.getLogger("cudask.comm")

FAMILY = "cudask-ipc"
# What a cudask worker's requests carry (first match wins) and what it accepts. The
# family comes last, so a worker without cudask answering the request serializes
# with "dask" or "pickle" and never looks up a name it does not know;
# cudask.worker.gpu_worker.GPUWorker moves it first when answering get_data.
SERIALIZERS = ("dask", "pickle", "error", FAMILY)


# The phases of a receive whose seconds `stats` counts.
RECEIVE_PHASES = ("receive-allocate-seconds", "receive-map-seconds", "receive-copy-seconds")


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
    counts: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "sent",
                "sent-bytes",
                "send-export-seconds",
                "send-wait-seconds",
                "received",
                "received-bytes",
                "receive-seconds",
                *RECEIVE_PHASES,
                "declined",
            ),
            0.0,
        )
    )
    warned: set[str] = field(default_factory=set)


_state = _State()

# Device memory exported while a send is under way that nothing else keeps alive (the
# frames cuDF's device_serialize makes, e.g. compacted copies of sliced columns; the object
# of a JIT-unspill proxy, which the proxy drops when it spills mid-send) and every array
# exported by handle: held
# here until the sender has the peer's answer. Set by `keep_alive`; a context variable,
# so distributed's serialization threads (offload copies the context) see the same list.
_held: ContextVar[list[Any] | None] = ContextVar("cudask_ipc_held", default=None)
# The chunks of the leasing pool (cudask.comm.leases) sent by handle inside `keep_alive`,
# leased from the end of the block.
_leased: ContextVar[list[int] | None] = ContextVar("cudask_ipc_leased", default=None)
# The slots of the staging area (cudask.comm.staging) taken inside `keep_alive`, given back at its end.
_staged: ContextVar[staging.Slots | None] = ContextVar("cudask_ipc_staged", default=None)


@contextmanager
def keep_alive() -> Iterator[None]:
    """Keep what is exported by handle inside this block alive until it ends: wrap a
    send and the wait for the peer's answer (cudask.worker.gpu_worker.GPUWorker.get_data,
    the explicit-comms shuffle). Objects whose device frames need it go by handle
    only inside such a block."""
    slots = staging.Slots()
    token, leased, staged = _held.set([]), _leased.set([]), _staged.set(slots)
    failed = True
    try:
        with traffic.moving():  # the peer maps and reads this process's memory meanwhile
            yield
        failed = False
    finally:
        slots.release(failed)  # answered: copied; failed: the peer may still be copying
        try:
            leases.extend(_leased.get() or ())  # and leases start now
        finally:
            _staged.reset(staged)
            _leased.reset(leased)
            _held.reset(token)


def enable(backend: Backend, min_size: int) -> None:
    """Send device arrays of at least `min_size` bytes to workers on this host by
    IPC, with `backend`'s CUDA calls (the worker plugin calls this at start)."""
    with _state.lock:
        _state.backend = backend
        _state.min_size = min_size
        _state.node = node_identity()
        _state.local_hosts = local_hosts()


def disable() -> None:
    """Stop sending by IPC (what is received still works)."""
    with _state.lock:
        _state.backend = None


def enabled() -> bool:
    return _state.backend is not None


def stats() -> dict[str, float]:
    """Arrays and bytes sent and received by IPC in this process, seconds spent
    exporting handles and waiting for the work queued to write what is sent, seconds spent
    receiving (in all, and in three of its phases: allocating the arrays that
    receive, mapping or finding the sender's allocations, copying and waiting for
    the copies), arrays declined (sent the usual way), and the mappings opened
    (by a message, or ahead of any: `map_ahead`), reused (kept from an earlier
    message or mapped ahead) and open now."""
    with _state.lock:
        counts = dict(_state.counts)
    mappings = _state.mappings
    return {
        **counts,
        **mappings.counts,
        "mappings-open": len(mappings),
        "mappings-kept": mappings.kept(),
    }


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


def same_host(context: dict[str, Any] | None) -> bool:
    """Whether the comm's peer ("recipient" in distributed's serialization context) is a
    process on this host (cudask.comm.ipc_peers)."""
    return ipc_peers.same_host(context, _state.local_hosts)


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


def dumps(x: Any, context: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """A CUDA IPC handle for `x` when it may go that way; NotImplementedError
    (distributed then tries the next serializer) otherwise."""
    backend = _state.backend
    if backend is not None and type(x) is ProxyObject:
        if not same_host(context) or _held.get() is None:
            # outside `keep_alive` nothing would hold the proxy's object once it is spilled
            raise NotImplementedError(FAMILY)
        proxy_header, proxy_frames = ipc_serialize(
            x, context
        )  # its object, by handle if on the device
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
    elif ipc_layout.device_serializable(x) and _held.get() is not None:
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
    work queued to write it); NotImplementedError when it cannot go by handle.
    An array whose own memory cannot be exported (RMM's cudaMallocAsync or managed
    memory) goes only through the staging area."""
    layout = ipc_layout.layout(x)
    if layout is None:
        raise NotImplementedError(FAMILY)  # distributed's serializer copies it
    start, refused = time.perf_counter(), None
    try:
        handle, offset = backend.export(layout.address)
        base: int | None = layout.address - offset
    except RuntimeError as exc:  # CUDA errors, e.g. stream-ordered (cudaMallocAsync) memory
        refused, base = exc, None
    exported = time.perf_counter()
    backend.ready()
    with _state.lock:
        _state.counts["send-export-seconds"] += exported - start
        _state.counts["send-wait-seconds"] += time.perf_counter() - exported
    held, leased, staged = _held.get(), _leased.get(), _staged.get()
    if (
        held is not None
    ):  # alive until the peer answers, even if its owner lets go (a spilled proxy)
        held.append(x)
    lasting = base is not None and lifetimes.sending(base)  # an RMM pool slab
    itemsize = int(layout.typestr[2:])
    nbytes = itemsize * math.prod(layout.shape)
    strides = layout.strides
    slot = staging.stage(x, nbytes, layout.order) if staged is not None and not lasting else None
    if slot is not None and staged is not None:  # a contiguous copy in the area peers keep mapped
        staged.add(slot)
        handle, offset = staging.handle(slot)  # the area's, exported once
        lasting, strides = True, ipc_layout.contiguous_strides(layout.shape, itemsize, layout.order)
    elif base is None:
        _decline(f"its memory cannot be exported for IPC ({refused})")
    lease = 0.0
    if leased is not None and base is not None and not lasting:
        lease = leases.sending(base)
        if lease:
            leased.append(base)
    return {
        "shape": list(layout.shape),
        "dtype": layout.typestr,
        "order": layout.order,
        "strides": list(strides),
        "handle": handle,
        "offset": offset,
        "lasting": lasting,
        "lease": lease,  # seconds the sender keeps the allocation after answered (leases)
        "nbytes": nbytes,
    }


def _dumps_device_serialized(backend: Backend, x: Any) -> tuple[dict[str, Any], list[Any]]:
    """A device-serializable object: its device frames by handle, its host frames as they are."""
    inner, parts = x.device_serialize()
    held = _held.get()
    assert held is not None
    held.append(parts)  # its frames may be copies made for this send: alive until answered
    # elements of each device frame (cuDF's are bytes); None for host frames
    sizes = [
        math.prod(f.__cuda_array_interface__["shape"])
        if hasattr(f, "__cuda_array_interface__")
        else None
        for f in parts
    ]
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
    header = {
        "device-serialized": inner,
        "type": pickle.dumps(type(x)),
        "entries": entries,
        "node": _state.node,
        "sender": lifetimes.this_process().as_header(),
    }
    return header, frames


def loads(header: dict[str, Any], frames: list[Any]) -> Any:
    """Copy the sender's array into a new one of this process (or rebuild a
    device-serialized object, or a JIT-unspill proxy, whose object comes the same way)."""
    if "proxy" in header:
        return ipc_deserialize(header["proxy"], frames)
    with traffic.moving():
        return _loads(header, frames)


def _loads(header: dict[str, Any], frames: list[Any]) -> Any:
    if header["node"] != node_identity():
        raise RuntimeError(
            f"cudask-ipc: device data from process {header['sender']['pid']} on another host reached this "
            "worker by IPC handle, which only works within one host; set "
            "cudask.comm.device-ipc: false on the workers if hosts share network addresses"
        )
    backend = _receiving_backend()
    start = time.perf_counter()
    _state.mappings.sweep(backend)
    sender = lifetimes.keepable(header.get("sender"))
    phases = dict.fromkeys(RECEIVE_PHASES, 0.0)
    if "device-serialized" in header:
        with ExitStack() as mappings:  # buffers of one allocation share its mapping
            parts = [
                frames[e["host"]]
                if "host" in e
                else backend.empty((0,), e["empty"], "C")
                if "empty" in e
                else _receive_array(backend, e, mappings, sender, phases)
                for e in header["entries"]
            ]
        out = pickle.loads(header["type"]).device_deserialize(header["device-serialized"], parts)
        nbytes = sum(e["nbytes"] for e in header["entries"] if "handle" in e)
    else:
        with ExitStack() as mappings:
            out = _receive_array(backend, header, mappings, sender, phases)
        nbytes = header["nbytes"]
    with _state.lock:
        for phase, seconds in phases.items():
            _state.counts[phase] += seconds
        _state.counts["received"] += 1
        _state.counts["received-bytes"] += nbytes
        _state.counts["receive-seconds"] += time.perf_counter() - start
    return out


def _receive_array(
    backend: Backend,
    entry: dict[str, Any],
    mappings: ExitStack,
    sender: lifetimes.Process | None,
    phases: dict[str, float],
) -> Any:
    """A new array of this process holding a copy of the one `entry` names (the
    mapping is in use in `mappings` until the caller closes it, then closed, or
    kept when the sender marked its allocation lasting or leased and `sender` is
    given); the seconds of each phase are added to `phases`."""
    start = time.perf_counter()
    out = backend.empty(tuple(entry["shape"]), entry["dtype"], entry["order"])
    allocated = time.perf_counter()
    lease = float(entry.get("lease") or 0.0)
    keep = sender if entry.get("lasting") or lease else None
    base = mappings.enter_context(
        _state.mappings.use(Explained(backend), bytes(entry["handle"]), keep, lease)
    )
    mapped_at = time.perf_counter()
    backend.copy(out, base + int(entry["offset"]), tuple(int(s) for s in entry["strides"]))
    phases["receive-allocate-seconds"] += allocated - start
    phases["receive-map-seconds"] += mapped_at - allocated
    phases["receive-copy-seconds"] += time.perf_counter() - mapped_at
    return out


def offer() -> dict[str, Any] | None:
    """What this worker offers the workers of its host to map ahead of any message
    (`map_ahead`): the handles of its lasting allocations (RMM pool slabs); None
    when it does not send by IPC or has none."""
    backend = _state.backend
    bases = lifetimes.offered() if backend is not None else []
    if backend is None or not bases:
        return None
    return {**ipc_peers.identity(), "handles": [backend.export(base)[0] for base in bases]}


def map_ahead(offered: dict[str, Any] | None) -> int:
    """Map another worker's offered allocations (`offer`) here now, once device
    traffic has been quiet for a moment (within a bound: opening a mapping takes
    milliseconds per GB and messages wait for it); how many were mapped. Blocks:
    call it from a thread of its own."""
    sender = ipc_peers.accepted(offered)
    if offered is None or sender is None:
        return 0
    backend = Explained(_receiving_backend())
    wake = threading.Condition()
    with wake:
        traffic.await_quiet(wake, lambda: False)
    return sum(_state.mappings.map_ahead(backend, bytes(h), sender) for h in offered["handles"])


def _receiving_backend() -> Backend:
    """The backend receiving uses: the sending one, or (on a worker that does
    not send by IPC) one made on first use, so what a peer sends still arrives."""
    with _state.lock:
        if _state.backend is not None:
            return _state.backend
        if _state.receiver is None:
            _state.receiver = ipc_cuda.CudaBackend()
        return _state.receiver


wire.register_device_family(FAMILY)
register_serialization_family(FAMILY, dumps, loads)
