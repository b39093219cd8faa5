"""Explicit-comms shuffle and merge: DataFrame partitions exchanged worker to worker in one step.

Covers: `shuffle(df, on, npartitions=None, client=None)`, which hash-partitions a
dask DataFrame (pandas or cuDF partitions) on columns `on` without a task per
piece: each worker splits the input partitions it holds (dask's `shuffle_group`)
and sends every other worker, in one message, the pieces that worker owns
(output partition j belongs to worker j mod W); then one task per output
partition, on its owner, concatenates its pieces in input order. Eager, like
`persist`: it returns a DataFrame over the held output partitions.
`merge(left, right, on, how="inner", ...)` shuffles both sides into the same
partitions and merges them partition by partition (lazily; the key columns must
have the same dtypes on both sides, since pieces are placed by hash).
Pieces wait in the `ExplicitComms` worker plugin's buffer, outside the spilling
store: a shuffle must fit in the workers' memory. A failed split or send, or an
owner that leaves, raises `ShuffleError` naming the shuffle and the cause and
drops every worker's buffer for it; the input (persisted first) is untouched.
Device frames between cudask workers of one host go by CUDA IPC (cudask.comm.ipc).

Does not cover: plugging into `DataFrame.shuffle(shuffle_method=...)` or
`DataFrame.merge`. Why one step: docs/design/comm.md.

Threading: the client side runs in the caller's thread; on a worker, splitting
runs in a thread off the event loop, and the buffer takes a lock, since tasks
of several threads take pieces at once.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import to_serialize

NAME = "cudask-explicit-comms"
RECEIVE = "cudask_shuffle_receive"


class ShuffleError(RuntimeError):
    """An explicit-comms shuffle did not complete."""


class ExplicitComms(WorkerPlugin):
    """Holds the pieces other workers sent this one, per shuffle, until its
    output partitions are built; answers the `cudask_shuffle_receive` op."""

    idempotent = True  # registered once per cluster; a later shuffle finds it

    def __init__(self) -> None:
        self.buffers: dict[str, dict[int, list[tuple[int, Any]]]] = {}
        self.dropped: set[str] = set()  # failed shuffles: pieces still arriving are discarded
        self.lock = threading.Lock()  # tasks of several threads take pieces at once

    def __getstate__(self) -> dict[str, Any]:
        return {}  # sent to the workers empty (a lock does not pickle)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def setup(self, worker: Any) -> None:
        worker.handlers[RECEIVE] = self.receive

    def teardown(self, worker: Any) -> None:
        worker.handlers.pop(RECEIVE, None)
        self.buffers.clear()

    def put(self, shuffle_id: str, pieces: dict[tuple[int, int], Any]) -> None:
        """Keep pieces keyed (input partition, output partition)."""
        with self.lock:
            if shuffle_id in self.dropped:
                return
            buffer = self.buffers.setdefault(shuffle_id, defaultdict(list))
            for (i, j), piece in pieces.items():
                buffer[j].append((i, piece))

    async def receive(self, shuffle_id: str, pieces: dict[tuple[int, int], Any]) -> None:
        self.put(shuffle_id, pieces)

    def take(self, shuffle_id: str, j: int) -> list[Any]:
        """The pieces of output partition j, in input order (removed from the buffer)."""
        with self.lock:
            buffer = self.buffers.get(shuffle_id)
            if buffer is None or j not in buffer:
                raise ShuffleError(
                    f"explicit-comms shuffle {shuffle_id}: the pieces of output partition {j} are not "
                    "on this worker (the worker they were sent to left before the partition was "
                    "built); run the shuffle again"
                )
            pieces = buffer.pop(j)
            if not buffer:
                del self.buffers[shuffle_id]
        return [piece for _, piece in sorted(pieces, key=lambda p: p[0])]

    def drop(self, shuffle_id: str) -> None:
        with self.lock:
            self.buffers.pop(shuffle_id, None)
            self.dropped.add(shuffle_id)


def _plugin(dask_worker: Any) -> ExplicitComms:
    return dask_worker.plugins[NAME]  # type: ignore[no-any-return]


async def _send(
    shuffle_id: str,
    holders: dict[str, dict[Any, int]],
    on: list[str],
    npartitions: int,
    owners: list[str],
    ipc_peers: set[str],
    dask_worker: Any,
) -> int:
    """Split this worker's input partitions (`holders[its address]`: key -> input
    index) and deliver every piece to its owner, device frames by CUDA IPC handle
    to the owners in `ipc_peers` when this worker sends that way; return the
    number of pieces sent to other workers."""
    from cudask.comm import ipc

    outgoing: dict[str, dict[tuple[int, int], Any]] = defaultdict(dict)
    for key, i in holders.get(dask_worker.address, {}).items():
        # off the event loop: reading the store may unspill, splitting runs kernels
        groups = await asyncio.to_thread(_split, dask_worker.data, key, on, npartitions)
        for j in range(npartitions):
            outgoing[owners[j % len(owners)]][(i, j)] = groups[j]
    mine = outgoing.pop(dask_worker.address, {})
    _plugin(dask_worker).put(shuffle_id, mine)
    by_ipc = [ipc.FAMILY, "dask", "pickle", "error"] if ipc.enabled() else None
    results = await asyncio.gather(
        *(
            _deliver(
                dask_worker, address, shuffle_id, pieces, by_ipc if address in ipc_peers else None
            )
            for address, pieces in outgoing.items()
        ),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return sum(len(p) for p in outgoing.values())


async def _deliver(
    dask_worker: Any,
    address: str,
    shuffle_id: str,
    pieces: dict[tuple[int, int], Any],
    serializers: list[str] | None,
) -> Any:
    """Send `pieces` to the worker at `address`. Its device frames exported by handle live
    until that peer has answered; a failed send holds only its own staging slots
    (cudask.comm.staging). Each call runs as a task of its own, so its `keep_alive`
    (context variables) is its own."""
    from cudask.comm import ipc

    with ipc.keep_alive():
        return await dask_worker.rpc(address).cudask_shuffle_receive(
            shuffle_id=shuffle_id, pieces=to_serialize(pieces), serializers=serializers
        )


def _split(data: Any, key: Any, on: list[str], npartitions: int) -> dict[int, Any]:
    from dask.dataframe.shuffle import shuffle_group

    from cudask.memory.jit.proxy import unproxy

    part = unproxy(data[key])  # under JIT-unspill the store holds proxies
    return shuffle_group(part, on, 0, npartitions, npartitions, False, npartitions)  # type: ignore[no-any-return]


def _collect(shuffle_id: str, j: int, meta: Any) -> Any:
    from dask.dataframe.dispatch import concat
    from distributed import get_worker

    pieces = _plugin(get_worker()).take(shuffle_id, j)
    return concat(pieces) if pieces else meta


def _ipc_on() -> bool:
    from cudask.comm import ipc

    return ipc.enabled()


def _drop(shuffle_id: str, dask_worker: Any) -> None:
    plugin = dask_worker.plugins.get(NAME)
    if plugin is not None:
        plugin.drop(shuffle_id)


def shuffle(
    df: Any, on: str | Sequence[str], npartitions: int | None = None, client: Any = None
) -> Any:
    """`df` hash-partitioned on `on` into `npartitions` (default: as many as it has)
    partitions by explicit comms; see the module's docstring."""
    import dask.dataframe as dd
    from distributed import default_client, futures_of, wait

    columns = [on] if isinstance(on, str) else list(on)
    missing = [c for c in columns if c not in df.columns]
    if not columns or missing:
        raise ValueError(
            f"on={on!r}: {missing or 'no column'} not among the DataFrame's columns "
            f"{list(df.columns)}"
        )
    npartitions = df.npartitions if npartitions is None else npartitions
    if not isinstance(npartitions, int) or npartitions < 1:
        raise ValueError(f"npartitions={npartitions!r}; accepted: a positive integer")
    client = client or default_client()
    client.register_plugin(ExplicitComms(), name=NAME)
    df = client.persist(df)
    parts = futures_of(df)
    wait(parts)
    shuffle_id = uuid.uuid4().hex
    outputs: list[Any] = []
    try:
        index = {part.key: i for i, part in enumerate(parts)}
        holders: dict[str, dict[Any, int]] = defaultdict(dict)
        for key, workers in client.who_has(parts).items():
            if not workers:
                raise ShuffleError(
                    f"explicit-comms shuffle {shuffle_id}: input partition {key!r} was "
                    "lost before the shuffle began; run it again"
                )
            holders[min(workers)][key] = index[key]
        owners = sorted(
            client.nthreads()
        )  # asked of the scheduler now (scheduler_info() is a cache)
        # every holder splits and sends at once; this returns when all pieces are delivered
        ipc_peers = {address for address, on in client.run(_ipc_on).items() if on}
        client.run(
            _send,
            shuffle_id,
            dict(holders),
            columns,
            npartitions,
            owners,
            ipc_peers,
            workers=list(holders),
        )
        # Strict restrictions: a paused owner still builds its partitions (loose ones would
        # send them to a worker without the pieces); an owner that leaves is noticed below.
        outputs = [
            client.submit(
                _collect,
                shuffle_id,
                j,
                df._meta,
                workers=[owners[j % len(owners)]],
                pure=False,
                key=f"explicit-shuffle-{shuffle_id}-{j}",
            )
            for j in range(npartitions)
        ]
        _wait_for_owners(client, outputs, owners, shuffle_id)
    except Exception as exc:
        client.cancel(outputs)
        client.run(_drop, shuffle_id, on_error="ignore")
        if isinstance(exc, ShuffleError):
            raise
        raise ShuffleError(
            f"explicit-comms shuffle {shuffle_id} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return dd.from_delayed(outputs, meta=df._meta, verify_meta=False)


def _wait_for_owners(client: Any, outputs: list[Any], owners: list[str], shuffle_id: str) -> None:
    """Wait for every output partition; ShuffleError when one fails or its owner leaves
    (its pieces are gone with it, and a strictly restricted task would wait forever)."""
    from distributed import wait

    while True:
        try:
            wait(outputs, timeout=5)  # a polling interval, not a limit: see the owners' check
        except TimeoutError:
            present = set(client.nthreads())
            gone = sorted(
                {owners[j % len(owners)] for j, f in enumerate(outputs) if not f.done()} - present
            )
            if gone:
                raise ShuffleError(
                    f"explicit-comms shuffle {shuffle_id}: worker(s) {', '.join(gone)} left "
                    "before building their output partitions; run the shuffle again"
                ) from None
            continue
        failed = [f for f in outputs if f.status == "error"]
        if failed:
            raise ShuffleError(f"explicit-comms shuffle {shuffle_id}: {failed[0].exception()}")
        return


HOWS = ("inner", "left", "right", "outer")


def _merge_parts(left: Any, right: Any, on: list[str], how: str) -> Any:
    return left.merge(right, on=on, how=how)


def merge(
    left: Any,
    right: Any,
    on: str | Sequence[str],
    how: str = "inner",
    npartitions: int | None = None,
    client: Any = None,
) -> Any:
    """`left` merged with `right` on `on` after an explicit-comms shuffle of both
    into `npartitions` (default: the larger of their partition counts) partitions."""
    import dask.dataframe as dd

    columns = [on] if isinstance(on, str) else list(on)
    if how not in HOWS:
        raise ValueError(f"how={how!r}; accepted: {', '.join(HOWS)}")
    for side, frame in (("left", left), ("right", right)):
        missing = [c for c in columns if c not in frame.columns]
        if not columns or missing:
            raise ValueError(
                f"on={on!r}: {missing or 'no column'} not among the {side} DataFrame's "
                f"columns {list(frame.columns)}"
            )
    for c in columns:
        if left.dtypes[c] != right.dtypes[c]:
            raise ValueError(
                f"on={c!r}: dtypes differ (left {left.dtypes[c]}, right {right.dtypes[c]}); "
                "cast one side first: rows are placed by a hash of the key"
            )
    n = max(left.npartitions, right.npartitions) if npartitions is None else npartitions
    lhs = shuffle(left, columns, n, client)
    rhs = shuffle(right, columns, n, client)
    meta = _merge_parts(left._meta, right._meta, columns, how)
    return dd.map_partitions(
        _merge_parts,
        lhs,
        rhs,
        columns,
        how,
        meta=meta,
        align_dataframes=False,
        enforce_metadata=False,
    )
