"""CudaBackend's receive copy in one process, on real GPUs: each of its three ways
(one block of bytes, a pitched copy of rows, a copy kernel) gives the source's
values, and its copy stream is one per thread and per device."""

from __future__ import annotations

import threading
from typing import Any

import pytest


def _backend() -> Any:
    from cudask.comm.ipc_cuda import CudaBackend

    return CudaBackend()


def _copied(backend: Any, src: Any) -> Any:
    import cupy

    out = cupy.empty(src.shape, src.dtype, order="C")
    backend.copy(out, int(src.data.ptr), tuple(src.strides))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "rows-of-wider", "transposed"])
def test_copy_gives_the_source_values(layout: str) -> None:
    import cupy

    whole = cupy.arange(3000 * 4000, dtype="f8").reshape(3000, 4000)
    src = {"contiguous": whole, "rows-of-wider": whole[:, 1000:2500], "transposed": whole.T}[layout]
    out = _copied(_backend(), src)
    assert out.flags.c_contiguous and out.shape == src.shape
    assert bool((out == src).all())


@pytest.mark.gpu
def test_copy_follows_kernels_queued_before_it() -> None:
    """A source written by a kernel still queued on the caller's stream is copied
    after that kernel (the copy stream waits on an event of the caller's stream)."""
    import cupy

    backend = _backend()
    for i in range(20):
        src = cupy.full((4096, 4096), float(i))
        src *= 2.0  # queued, perhaps unfinished when the copy is queued
        out = _copied(backend, src)
        assert float(out.min()) == float(out.max()) == 2.0 * i


@pytest.mark.gpu
def test_one_copy_stream_per_thread() -> None:
    import cupy

    backend = _backend()
    src = cupy.ones(1 << 20)
    _copied(backend, src)
    first = backend._copy_stream()
    assert backend._copy_stream() is first  # kept for the thread
    other: list[Any] = []

    def in_thread() -> None:
        with cupy.cuda.Device(0):
            _copied(backend, src)
            other.append(backend._copy_stream())

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(timeout=120)
    assert other and other[0] is not first


@pytest.mark.multigpu
def test_the_copy_stream_belongs_to_the_current_device() -> None:
    import cupy

    backend = _backend()
    for device in (0, 1, 0):
        with cupy.cuda.Device(device):
            src = cupy.arange(1 << 20, dtype="f8")
            out = _copied(backend, src)
            assert bool((out == src).all())
            assert backend._copy_stream().device_id == device
