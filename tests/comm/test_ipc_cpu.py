"""The cudask-ipc serialization family's logic on CPU: which arrays go by
handle, the mapping's lifetime, the fallbacks, and a worker-to-worker transfer
over real TCP comms. The "device" here is host memory behind a fake CuPy
module and a fake backend whose copies are real memmoves; the GPU proof is
tests/comm/test_ipc_gpu.py."""

from __future__ import annotations

import gc
import logging
import os
import sys
import types
import weakref
from typing import Any, ClassVar

import numpy as np
import pytest
from distributed.protocol.serialize import deserialize, serialize, to_serialize
from ipc_hold import METHODS, HoldNext, hold_next

from cudask.comm import ipc
from cudask.testing import workers_info
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend
from cudask.worker.gpu_worker import GPUWorker

FAKE_CUPY = types.SimpleNamespace(ndarray=FakeDeviceArray)  # what the family takes for CuPy


def host(x: FakeDeviceArray) -> np.ndarray:
    return x._array


# What a cudask worker answering get_data serializes with (cudask.worker.gpu_worker).
REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
LOCAL = {"recipient": {"address": "tcp://127.0.0.1:40000"}}
REMOTE = {"recipient": {"address": "tcp://192.0.2.7:40000"}}  # TEST-NET: never this host


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> FakeIPCBackend:
    monkeypatch.setitem(sys.modules, "cupy", FAKE_CUPY)
    monkeypatch.setattr(ipc, "_state", ipc._State())
    fake = FakeIPCBackend()
    ipc.enable(fake, min_size=1024)
    return fake


def _roundtrip(x: Any, context: dict[str, Any]) -> tuple[str, Any]:
    header, frames = serialize(x, serializers=REPLY, context=context, on_error="raise")
    return header["serializer"], deserialize(header, frames, deserializers=REPLY)


def test_a_local_contiguous_array_goes_by_handle_and_arrives_identical(
    backend: FakeIPCBackend,
) -> None:
    pool = np.arange(4096, dtype="f8")  # one allocation holding two arrays, as a memory pool does
    a = backend.allocate(pool)[1024:2048]
    f = FakeDeviceArray(np.asfortranarray(np.arange(600, dtype="i4").reshape(20, 30)))
    backend.allocations[b"f"] = host(f)
    name, out = _roundtrip(a, LOCAL)
    assert name == "cudask-ipc" and isinstance(out, FakeDeviceArray)
    assert host(out).tobytes() == pool[1024:2048].tobytes()
    assert host(out).ctypes.data != host(a).ctypes.data
    _, out_f = _roundtrip(f, LOCAL)
    assert host(out_f).flags.f_contiguous and np.array_equal(host(out_f), host(f))
    assert backend.readied == 2  # the sender's queued work is waited for before each handle
    assert backend.opened == [b"h0", b"f"] and len(backend.closed) == 2  # mapped, then unmapped
    stats = ipc.stats()
    assert stats["sent"] == stats["received"] == 2
    assert stats["sent-bytes"] == stats["received-bytes"] == 1024 * 8 + 600 * 4
    phases = [stats[f"receive-{p}-seconds"] for p in ("allocate", "map", "copy")]
    assert all(p > 0 for p in phases) and sum(phases) <= stats["receive-seconds"]
    assert stats["send-export-seconds"] > 0 and stats["send-wait-seconds"] > 0


def test_strided_views_go_by_handle_read_in_place(backend: FakeIPCBackend) -> None:
    """Views of a larger allocation (what an all-to-all rechunk sends) go by handle
    with their byte strides; the receiver copies them into contiguous arrays of its
    own, and the sender makes no copy."""
    base = np.arange(64 * 96, dtype="f8").reshape(64, 96)
    whole = backend.allocate(base)
    cube = backend.allocate(np.arange(12 * 16 * 20, dtype="i2").reshape(12, 16, 20))
    views = {
        "column block": whole[:, 32:64],  # rows of a wider array: pitched
        "every other column": whole[:, ::2],
        "reversed rows": whole[::-1, :],
        "transposed block": whole[8:40, 16:48].T,
        "3-d slice": cube[1:9, ::-2, 3:15],
    }
    for name, view in views.items():
        kind, out = _roundtrip(view, LOCAL)
        assert kind == "cudask-ipc", name
        assert np.array_equal(host(out), host(view)), name
        assert host(out).flags.c_contiguous or host(out).flags.f_contiguous, name
    assert backend.opened == [b"h0"] * 4 + [b"h1"] and len(backend.closed) == 5
    assert ipc.stats()["sent"] == ipc.stats()["received"] == len(views)


class Frame:
    """Follows cuDF's device-serialization protocol: columns in device buffers,
    their names in the header and a host frame, as cudf.DataFrame does."""

    def __init__(self, columns: dict[str, Any]) -> None:
        self.columns = columns

    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        return {"names": list(self.columns)}, [memoryview(b"meta"), *self.columns.values()]

    @classmethod
    def device_deserialize(cls, header: dict[str, Any], frames: list[Any]) -> Frame:
        assert bytes(frames[0]) == b"meta"
        return cls(dict(zip(header["names"], frames[1:], strict=True)))


def test_a_device_serializable_frame_goes_by_handle(backend: FakeIPCBackend) -> None:
    """cuDF frames: each device buffer by handle (one mapping per allocation), host
    frames as they are, an empty column without memory to export."""
    pool = backend.allocate(np.arange(2048, dtype="f8"))
    frame = Frame(
        {
            "a": pool[:1024],
            "b": pool[1024:],
            "c": backend.allocate(np.arange(100, dtype="i4")),
            "empty": FakeDeviceArray(np.empty(0, dtype="f8")),
        }
    )
    kind, _ = _roundtrip(frame, LOCAL)
    assert kind != "cudask-ipc"  # outside a send that keeps its frames alive: the usual way
    with ipc.keep_alive():
        kind, out = _roundtrip(frame, LOCAL)
    assert (
        kind == "cudask-ipc"
        and type(out) is Frame
        and list(out.columns) == ["a", "b", "c", "empty"]
    )
    for name, column in frame.columns.items():
        assert np.array_equal(host(out.columns[name]), host(column)), name
        assert host(out.columns[name]).ctypes.data != host(column).ctypes.data or not column.size
    assert backend.opened == [b"h0", b"h1"] and len(backend.closed) == 2  # a and b share a mapping
    stats = ipc.stats()
    assert stats["sent"] == stats["received"] == 1
    assert stats["sent-bytes"] == stats["received-bytes"] == 2048 * 8 + 400


class CompactingFrame(Frame):
    """Like cuDF with a sliced column: device_serialize makes a copy for the message."""

    made: ClassVar[list[Any]] = []
    backend: FakeIPCBackend

    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        copies = {
            name: self.backend.allocate(column._array.copy())
            for name, column in self.columns.items()
        }
        CompactingFrame.made.extend(weakref.ref(c) for c in copies.values())
        return {"names": list(copies)}, [memoryview(b"meta"), *copies.values()]


def test_copies_made_for_a_send_live_until_it_ends(backend: FakeIPCBackend) -> None:
    frame = CompactingFrame({"a": backend.allocate(np.arange(1024, dtype="f8"))})
    CompactingFrame.backend = backend
    with ipc.keep_alive():
        header, _ = ipc.dumps(frame, LOCAL)
        assert "device-serialized" in header
        gc.collect()
        assert [r() is not None for r in CompactingFrame.made] == [
            True
        ]  # exported memory still alive
    gc.collect()
    assert [r() is None for r in CompactingFrame.made] == [True]  # released once the send is over


def test_a_small_or_remote_frame_goes_the_usual_way(backend: FakeIPCBackend) -> None:
    small = Frame({"a": backend.allocate(np.arange(16, dtype="f8"))})  # 128 bytes of device data
    big = Frame({"a": backend.allocate(np.arange(1024, dtype="f8"))})
    for x, context in ((small, LOCAL), (big, REMOTE)):
        with ipc.keep_alive(), pytest.raises(NotImplementedError):
            ipc.dumps(x, context)
    assert backend.opened == [] and ipc.stats()["sent"] == 0


def test_everything_else_falls_through_to_distributeds_serializers(
    backend: FakeIPCBackend, caplog: pytest.LogCaptureFixture
) -> None:
    big = backend.allocate(np.ones((64, 64), dtype="f8"))
    small = backend.allocate(np.ones(8, dtype="f8"))
    structured = backend.allocate(np.zeros(512, dtype=[("a", "f8"), ("b", "i4")]))
    host = np.ones(4096)
    for x, context in (
        (big, REMOTE),
        (big, {}),
        (big, {"recipient": {"address": "inproc://x/1"}}),
        (small, LOCAL),
        (structured, LOCAL),
        (host, LOCAL),
    ):
        header, _ = serialize(x, serializers=REPLY, context=context)
        assert header["serializer"] != "cudask-ipc", (x, context)
    unexported = FakeDeviceArray(
        np.ones(4096)
    )  # memory the backend cannot export (e.g. cudaMallocAsync)
    with caplog.at_level(logging.INFO, logger="cudask.comm"):
        for _ in range(3):
            header, _ = serialize(unexported, serializers=REPLY, context=LOCAL)
            assert header["serializer"] != "cudask-ipc"
    assert [r.getMessage() for r in caplog.records].count(
        "cudask: device data sent through host memory: its memory cannot be exported for IPC "
        "(cudaErrorInvalidValue: not exportable) (logged once)"
    ) == 1
    assert ipc.stats()["declined"] == 3 and backend.opened == []
    ipc.disable()
    header, _ = serialize(big, serializers=REPLY, context=LOCAL)
    assert header["serializer"] != "cudask-ipc"


def test_arrays_of_one_allocation_share_one_mapping(backend: FakeIPCBackend) -> None:
    pool = np.arange(8192, dtype="u1")
    parts = [backend.allocate(pool)[i * 2048 : (i + 1) * 2048] for i in range(1)]
    parts += [FakeDeviceArray(pool[i * 2048 : (i + 1) * 2048]) for i in range(1, 4)]
    # As get_data sends a task's value: to_serialize, so collections are walked.
    header, frames = serialize(to_serialize(tuple(parts)), serializers=REPLY, context=LOCAL)
    out = deserialize(header, frames, deserializers=REPLY)
    assert b"".join(host(o).tobytes() for o in out) == pool.tobytes()
    assert backend.opened == [b"h0"] * 4 and ipc.stats()["received"] == 4
    mappings = ipc._state.mappings
    with mappings.use(backend, b"h0", None) as base, mappings.use(backend, b"h0", None) as again:
        assert base == again == pool.ctypes.data and backend.opened.count(b"h0") == 5
    assert ipc.mapped() == 0 and len(backend.closed) == 5


def test_a_handle_from_another_host_is_a_clear_error(backend: FakeIPCBackend) -> None:
    header, frames = serialize(backend.allocate(np.ones(4096)), serializers=REPLY, context=LOCAL)
    header["node"] = "another-boot-id"
    with pytest.raises(
        RuntimeError, match="only works within one host; set cudask.comm.device-ipc: false"
    ):
        deserialize(header, frames, deserializers=REPLY)
    assert backend.opened == []


def test_a_failed_copy_leaves_no_mapping(
    backend: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    header, frames = serialize(backend.allocate(np.ones(4096)), serializers=REPLY, context=LOCAL)

    def fail(dst: int, src: int, nbytes: int) -> None:
        raise RuntimeError("cudaErrorIllegalAddress (injected)")

    monkeypatch.setattr(backend, "copy", fail)
    with pytest.raises(RuntimeError, match="injected"):
        deserialize(header, frames, deserializers=REPLY)
    assert backend.opened == [b"h0"] and len(backend.closed) == 1 and ipc.mapped() == 0
    assert ipc.stats()["received"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_a_hold_catches_the_next_transfer_in_flight(
    backend: FakeIPCBackend, tmp_path: Any, method: str
) -> None:
    """What tests/comm/test_ipc_gpu.py's worker killed mid-transfer relies on: the hold
    sits on the path an array by handle takes, once, where the transfer is under way:
    the sender making the handle (nothing counted yet), or the receiver holding it
    before mapping it or copying from the mapping (the sender counted it, nothing
    received)."""
    seen: list[tuple[float, float]] = []

    class Recording(HoldNext):
        def _hold(self, name: str) -> None:
            super()._hold(name)
            if name == self.method:  # (in `open`, the mappings' lock is held: no ipc.stats())
                seen.append((ipc._state.counts["sent"], ipc._state.counts["received"]))

    marker = tmp_path / "holding"
    hold_next(method, str(marker), seconds=0.0)
    assert type(ipc._state.backend) is HoldNext and ipc._state.backend.inner is backend
    ipc._state.backend.__class__ = Recording
    x = backend.allocate(np.arange(1024, dtype="f8"))
    name, out = _roundtrip(x, LOCAL)
    assert name == ipc.FAMILY and np.array_equal(host(out), host(x))
    assert marker.read_text() == str(os.getpid())
    assert seen == [(0.0, 0.0)] if method == "export" else seen == [(1.0, 0.0)]
    marker.unlink()
    _roundtrip(x, LOCAL)
    assert not marker.exists() and len(seen) == 2  # called again, held only the first time
    hold_next(method, str(marker), seconds=0.0)  # the next round's hold wraps the real backend
    assert ipc._state.backend.inner is backend


def test_same_host_reads_the_peer_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ipc, "_state", ipc._State(local_hosts=frozenset({"10.1.2.3"})))
    assert ipc.same_host({"recipient": {"address": "tcp://10.1.2.3:1234"}})
    assert ipc.same_host({"recipient": {"address": "tls://127.0.0.1:1234"}})
    assert ipc.same_host({"recipient": {"address": "tcp://[::1]:1234"}})
    assert not ipc.same_host({"recipient": {"address": "tcp://10.1.2.4:1234"}})
    assert not ipc.same_host({"recipient": {"address": "ucx://10.1.2.3:1234"}})
    assert not ipc.same_host({"recipient": {}}) and not ipc.same_host(None)


def _make(n: int) -> FakeDeviceArray:
    return _BACKEND.allocate(np.arange(n, dtype="f8"))


def _total(x: FakeDeviceArray) -> tuple[float, int]:
    return float(host(x).sum()), int(host(x).ctypes.data)


_BACKEND = FakeIPCBackend()


def test_worker_to_worker_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers in this process, talking over real TCP comms with cudask's
    serializers: the dependency goes by handle, through get_data's reply and
    "OK", and the receiver computes on its own copy."""
    from distributed import Client, LocalCluster

    monkeypatch.setitem(sys.modules, "cupy", FAKE_CUPY)
    monkeypatch.setattr(ipc, "_state", ipc._State())
    ipc.enable(_BACKEND, min_size=1024)
    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
            serializers=REPLY,
            deserializers=REPLY,
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = list(workers_info(client))
        x = client.submit(_make, 100_000, workers=[a])
        total, ptr = client.submit(_total, x, workers=[b]).result(timeout=120)
    assert total == float(np.arange(100_000, dtype="f8").sum())
    assert ptr not in [h.ctypes.data for h in _BACKEND.allocations.values()]  # b's own copy
    stats = ipc.stats()
    assert stats["sent"] == stats["received"] == 1 and stats["received-bytes"] == 800_000


def test_rechunk_method_is_tasks_unless_the_user_chose(caplog: pytest.LogCaptureFixture) -> None:
    import dask

    from cudask.comm.rechunk import prefer_task_rechunk

    with dask.config.set({"array.rechunk.method": None}):
        with caplog.at_level(logging.INFO, logger="cudask"):
            assert prefer_task_rechunk() and not prefer_task_rechunk()  # said once
        assert dask.config.get("array.rechunk.method") == "tasks"
        assert (
            sum("array.rechunk.method set to 'tasks'" in r.getMessage() for r in caplog.records)
            == 1
        )
    with dask.config.set({"array.rechunk.method": "p2p"}):
        assert not prefer_task_rechunk()
        assert dask.config.get("array.rechunk.method") == "p2p"


def test_a_mapping_refused_names_the_switch(
    backend: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    header, frames = serialize(backend.allocate(np.ones(4096)), serializers=REPLY, context=LOCAL)

    def refuse(handle: bytes) -> int:
        raise RuntimeError("cudaErrorMapBufferObjectFailed")

    monkeypatch.setattr(backend, "open", refuse)
    with pytest.raises(
        RuntimeError,
        match=r"cannot map .*cudaErrorMapBufferObjectFailed.*"
        r"set cudask.comm.device-ipc: false",
    ):
        deserialize(header, frames, deserializers=REPLY)
    assert ipc.mapped() == 0


def test_a_worker_without_cudask_answers_and_asks_as_usual() -> None:
    """Mixed cluster: a cudask worker and a plain `dask worker` process (which has
    never heard of the cudask-ipc family) fetch each other's data both ways; the
    cudask worker's requests name the family last, so the plain worker answers
    with "dask"/"pickle" and never looks it up."""
    import subprocess

    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
            serializers=list(ipc.SERIALIZERS),
            deserializers=list(ipc.SERIALIZERS),
            worker_class=GPUWorker,
        ) as cluster,
        Client(cluster) as client,
    ):
        plain = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                cluster.scheduler_address,
                "--name",
                "plain",
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            client.wait_for_workers(2, timeout=120)
            workers = {v["name"]: k for k, v in workers_info(client).items()}
            cudask_worker = next(a for n, a in workers.items() if n != "plain")
            # NumPy's own functions: the plain worker cannot import this test module
            on_plain = client.submit(np.arange, 100_000, workers=[workers["plain"]])
            on_cudask = client.submit(np.arange, 1000, workers=[cudask_worker])
            assert client.submit(np.sum, on_plain, workers=[cudask_worker]).result(
                timeout=120
            ) == sum(range(100_000))
            assert client.submit(np.sum, on_cudask, workers=[workers["plain"]]).result(
                timeout=120
            ) == sum(range(1000))
        finally:
            plain.terminate()
            plain.wait(60)


def _refuse(handle: bytes) -> int:
    raise RuntimeError("cudaErrorNotPermitted: operation not permitted")


def test_a_refused_mapping_falls_back_to_host_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that cannot map its peer's memory (separate IPC namespaces) says so once,
    stops asking for the family and fetches the key again through host memory: the
    task completes with the right value, nothing is lost and nothing hangs."""
    from distributed import Client, LocalCluster

    monkeypatch.setitem(sys.modules, "cupy", FAKE_CUPY)
    monkeypatch.setattr(ipc, "_state", ipc._State())
    monkeypatch.setattr(_BACKEND, "open", _refuse)
    ipc.enable(_BACKEND, min_size=1024)
    with (
        caplog.at_level(logging.WARNING, logger="cudask"),
        LocalCluster(
            n_workers=2,
            processes=False,
            protocol="tcp",
            dashboard_address=":0",
            threads_per_worker=1,
            serializers=list(ipc.SERIALIZERS),
            deserializers=list(ipc.SERIALIZERS),
            worker_class=GPUWorker,
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = list(workers_info(client))
        xs = [client.submit(_make, 100_000 + i, workers=[a], pure=False) for i in range(3)]
        totals = client.gather([client.submit(_total, x, workers=[b]) for x in xs])
        assert [t for t, _ in totals] == [
            float(np.arange(100_000 + i, dtype="f8").sum()) for i in range(3)
        ]
        asked = client.run(lambda dask_worker: ipc.FAMILY in dask_worker.rpc.deserializers)
        assert asked == {a: True, b: False}  # only the worker that was refused stopped asking
    said = [r.getMessage() for r in caplog.records if r.name.startswith("cudask")]
    assert len(said) == 1 and "cannot map another worker's device memory" in said[0]
    assert "through host memory from now on" in said[0]
    assert ipc.stats()["received"] == 0
