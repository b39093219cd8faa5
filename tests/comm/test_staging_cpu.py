"""The staging area (cudask.comm.staging) on CPU, with the fake backend: its slots
(first fit, aligned, merged when given back); an array sent inside `keep_alive`
goes as a contiguous copy in the area, marked lasting, so its receiver maps the
area once and keeps it, whatever allocation each array came from; the slot is
free again once the send has ended; what does not fit, what is sent outside
`keep_alive` and what lies in a lasting allocation already go as before; the
area is offered for mapping ahead; the option is checked. The GPU proof is
tests/comm/test_ipc_gpu.py::test_a_staging_area_is_mapped_once."""

from __future__ import annotations

import sys
import types
from typing import Any

import dask
import numpy as np
import pytest
from distributed.protocol.serialize import deserialize, serialize

from cudask.comm import ipc, ipc_settings, leases, lifetimes, staging
from cudask.errors import OptionError
from cudask.testing.fake_cuda import FakeDeviceArray, FakeIPCBackend

REPLY = [ipc.FAMILY, "dask", "pickle", "error"]
LOCAL = {"recipient": {"address": "tcp://127.0.0.1:40000"}}


def test_slots_are_taken_first_fit_aligned_and_merged_when_given_back() -> None:
    area = staging.Staging(4096, 4096)
    a, b, c = area.take(100), area.take(1000), area.take(256)
    assert (a, b, c) == (4096, 4096 + 256, 4096 + 256 + 1024)
    assert area.take(4096) is None and area.counts["staging-full"] == 1
    area.give(b)
    assert area.take(1024) == b  # the hole b left, first fit
    area.give(a)
    area.give(b)  # merged with a's slot before it
    assert area.take(1280) == a and area.in_use() == 1280 + 256
    area.give(a)
    area.give(c)  # merged with both neighbours: the whole area again
    assert area.in_use() == 0 and area.take(4096) == 4096
    assert area.counts["staged"] == 0  # `stage` counts a slot once its copy is done


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> FakeIPCBackend:
    """ipc on with the fake backend and a 64 KiB staging area; no leasing pool."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=FakeDeviceArray))
    monkeypatch.setattr(ipc, "_state", ipc._State())
    monkeypatch.setattr(lifetimes, "_pools", [])
    monkeypatch.setattr(lifetimes, "_lasting", set())
    monkeypatch.setattr(leases, "_installed", None)
    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)
    monkeypatch.setattr(staging, "_pending", None)
    backend = FakeIPCBackend()
    staging.install(backend, 1 << 16)
    ipc.enable(backend, min_size=1024)
    return backend


def _send(x: FakeDeviceArray) -> tuple[dict[str, Any], FakeDeviceArray]:
    with ipc.keep_alive():
        header, frames = serialize(x, serializers=REPLY, context=LOCAL)
        out = deserialize(header, frames, deserializers=REPLY)
        slot = (header["nbytes"] + 255) // 256 * 256 if header["handle"] == b"staging" else 0
        assert staging.stats()["staging-in-use"] == slot  # taken until the send ends
    return header, out


def test_an_array_goes_through_the_area_which_its_receiver_maps_once(wired: FakeIPCBackend) -> None:
    backend = wired
    values = np.arange(64 * 48, dtype="f8").reshape(64, 48)
    whole = backend.allocate(values)
    for x in (whole, whole[:, 8:24], backend.allocate(np.asfortranarray(values))):
        header, out = _send(x)
        assert header["handle"] == b"staging" and header["lasting"] and header["lease"] == 0.0
        assert out._array.tobytes("A") == x._array.tobytes("A") and np.array_equal(
            out._array, x._array
        )
        assert out._array.flags.f_contiguous == (header["order"] == "F")
        assert staging.stats()["staging-in-use"] == 0  # given back once the send ended
    assert backend.opened == [b"staging"] and backend.closed == []  # mapped once, kept
    stats = ipc.stats()
    assert (
        stats["mappings-opened"] == 1
        and stats["mappings-reused"] == 2
        and stats["mappings-kept"] == 1
    )
    assert staging.stats()["staged"] == 3
    offer = ipc.offer()
    assert offer is not None and offer["handles"] == [
        b"staging"
    ]  # mapped ahead by the host's workers


def test_what_does_not_fit_or_is_sent_outside_keep_alive_goes_as_before(
    wired: FakeIPCBackend,
) -> None:
    backend = wired
    big = backend.allocate(np.ones(1 << 14, dtype="f8"))  # 128 KiB: more than the area
    small = backend.allocate(np.ones(1024, dtype="f8"))
    header, out = _send(big)
    assert header["handle"] != b"staging" and not header["lasting"]
    assert np.array_equal(out._array, big._array)
    header, frames = serialize(small, serializers=REPLY, context=LOCAL)  # no keep_alive
    assert header["handle"] != b"staging"
    deserialize(header, frames, deserializers=REPLY)
    assert staging.stats()["staged"] == 0 and staging.stats()["staging-full"] == 0


def test_an_array_in_a_lasting_allocation_is_not_staged(wired: FakeIPCBackend) -> None:
    backend = wired
    x = backend.allocate(np.ones(1024, dtype="f8"))
    lifetimes.lasting(x._array.ctypes.data)  # as a pool slab is
    header, _ = _send(x)
    assert header["handle"] != b"staging" and header["lasting"]
    assert staging.stats()["staged"] == 0


def test_the_option_is_a_size() -> None:
    with dask.config.set({"cudask.comm.device-ipc-staging": "64MiB"}):
        assert ipc_settings.device_ipc_staging() == 64 << 20
    assert ipc_settings.device_ipc_staging() == 1 << 30  # the default
    with (
        dask.config.set({"cudask.comm.device-ipc-staging": "lots"}),
        pytest.raises(OptionError, match=r"cudask.comm.device-ipc-staging='lots' is not a size"),
    ):
        ipc_settings.device_ipc_staging()


def test_a_failed_copy_sends_the_array_from_its_own_allocation(
    wired: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = wired

    def broken(x: Any, address: int, order: str) -> None:
        raise RuntimeError("copy kernel failed")

    monkeypatch.setattr(backend, "stage", broken)
    x = backend.allocate(np.ones(1024, dtype="f8"))
    header, out = _send(x)
    assert header["handle"] != b"staging" and np.array_equal(out._array, x._array)
    assert staging.stats()["staging-failed"] == 1 and staging.stats()["staging-in-use"] == 0


def test_a_slot_taken_after_its_send_ended_is_given_back_at_once(wired: FakeIPCBackend) -> None:
    backend = wired
    slots = staging.Slots()
    first = staging.stage(backend.allocate(np.ones(512, dtype="f8")), 4096, "C")
    assert first is not None
    slots.add(first)
    slots.release()
    late = staging.stage(backend.allocate(np.ones(512, dtype="f8")), 4096, "C")
    assert late is not None and staging.stats()["staging-in-use"] == 4096
    slots.add(late)  # a serialization thread that outlived the send
    assert staging.stats()["staging-in-use"] == 0


def test_memory_that_cannot_be_exported_goes_through_the_area(wired: FakeIPCBackend) -> None:
    """Memory CUDA will not export (RMM's cudaMallocAsync or managed memory: here one the
    fake backend did not allocate) goes as a copy in the area when a slot takes it, and
    is declined as before when none does or when no send holds the slot."""
    values = np.arange(1024, dtype="f8")
    foreign = FakeDeviceArray.from_numpy(values)  # not the backend's: export refuses it
    header, out = _send(foreign)
    assert header["handle"] == b"staging" and header["lasting"] and header["lease"] == 0.0
    assert np.array_equal(out._array, values)
    assert staging.stats()["staged"] == 1 and ipc.stats()["declined"] == 0
    too_big = FakeDeviceArray.from_numpy(np.ones(1 << 14, dtype="f8"))  # more than the area
    with ipc.keep_alive(), pytest.raises(NotImplementedError, match="cannot be exported"):
        ipc.dumps(too_big, LOCAL)
    with pytest.raises(NotImplementedError, match="cannot be exported"):
        ipc.dumps(foreign, LOCAL)  # outside keep_alive: no send to hold a slot
    assert ipc.stats()["declined"] == 2 and staging.stats()["staging-in-use"] == 0


def test_a_failed_send_holds_its_slots_for_a_while(
    wired: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that fails (the connection closed before the peer answered) may leave a
    receiver copying from its slots: they stay taken `FAILED_HOLD` seconds, then the
    next slot taken frees them. A send that ends well gives its slots back at once."""
    backend = wired
    now = [0.0]
    area = staging.Staging(
        staging._area.base, staging._area.nbytes, staging._area.handle, clock=lambda: now[0]
    )
    monkeypatch.setattr(staging, "_area", area)
    x = backend.allocate(np.ones(1024, dtype="f8"))  # 8 KiB
    with pytest.raises(OSError, match="closed"), ipc.keep_alive():
        header, _ = serialize(x, serializers=REPLY, context=LOCAL)
        assert header["handle"] == b"staging"
        raise OSError("connection closed")
    assert staging.stats()["staging-in-use"] == 8192  # held
    now[0] = staging.FAILED_HOLD - 1
    first = area.take(256)
    assert first is not None and staging.stats()["staging-in-use"] == 8192 + 256
    now[0] = staging.FAILED_HOLD
    second = area.take(256)
    assert second is not None and staging.stats()["staging-in-use"] == 512  # the held slot freed
    area.give(first)
    area.give(second)
    header, out = _send(x)  # a send that ends well: back at once (checked in _send)
    assert header["handle"] == b"staging" and np.array_equal(out._array, x._array)
    assert staging.stats()["staged"] == 2 and staging.stats()["staged-bytes"] == 2 * 8192


def test_a_deferred_area_is_made_when_first_needed_and_a_refusal_is_not_retried(
    wired: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`defer` makes nothing; the first `ensure` (a peer met) or first send makes the
    area once; a refusal is logged once and not tried again."""
    backend = wired
    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)
    staging.defer(backend, 1 << 16)
    assert staging.stats()["staging-bytes"] == 0  # a worker that never meets a peer: none
    x = backend.allocate(np.ones(1024, dtype="f8"))
    header, out = _send(x)  # its first send makes it
    assert header["handle"] == b"staging" and np.array_equal(out._array, x._array)
    assert staging.stats()["staging-bytes"] == 1 << 16 and staging.ensure() is staging._area
    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)
    calls = []

    def refuse(nbytes: int) -> int:
        calls.append(nbytes)
        raise RuntimeError("cudaErrorMemoryAllocation")

    monkeypatch.setattr(backend, "allocate_area", refuse)
    staging.defer(backend, 1 << 16)
    with caplog.at_level("WARNING", logger="cudask.comm"):
        assert staging.ensure() is None and staging.ensure() is None
        header, _ = _send(x)  # goes from its own allocation
    assert header["handle"] != b"staging" and calls == [1 << 16]
    assert caplog.text.count("no IPC staging area") == 1


def test_an_area_that_cannot_be_exported_is_freed(
    wired: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Allocated but refused a handle: the area is freed, none is made, nothing is retried."""
    backend = wired
    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)

    def refuse(ptr: int) -> tuple[bytes, int]:
        raise RuntimeError("cudaErrorMapBufferObjectFailed")

    monkeypatch.setattr(backend, "export", refuse)
    staging.defer(backend, 1 << 16)
    assert staging.ensure() is None and staging.ensure() is None
    assert b"staging" not in backend.allocations and staging.stats()["staging-bytes"] == 0


def test_a_failed_free_of_an_unexported_area_keeps_the_export_error(
    wired: FakeIPCBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Freeing the refused area fails too: that is logged, and the export's error is the
    one `ensure` reports."""
    backend = wired
    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)

    def refuse(ptr: int) -> tuple[bytes, int]:
        raise RuntimeError("cudaErrorMapBufferObjectFailed")

    def fail_free(base: int) -> None:
        raise RuntimeError("cudaErrorIllegalAddress")

    monkeypatch.setattr(backend, "export", refuse)
    monkeypatch.setattr(backend, "free_area", fail_free)
    staging.defer(backend, 1 << 16)
    with caplog.at_level("WARNING", logger="cudask.comm"):
        assert staging.ensure() is None
    assert "freeing an IPC staging area" in caplog.text and "cudaErrorIllegalAddress" in caplog.text
    assert "no IPC staging area of 65536 bytes (cudaErrorMapBufferObjectFailed)" in caplog.text
