"""CudaBackend's receive copy in one process, on real GPUs: each of its three ways
(one block of bytes, a pitched copy of rows, a copy kernel) gives the source's
values, waits for work still queued on the caller's stream, and runs on a copy stream
kept per thread and per device."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

LAYOUTS = ["contiguous", "rows-of-wider", "transposed"]  # one block, pitched, kernel

# Spins `cycles` GPU clock cycles, then writes `value` to out[0:n]: work that is
# certainly still queued when the host goes on.
SPIN_THEN_FILL = r"""
extern "C" __global__ void spin_then_fill(double* out, long long n, double value,
                                          long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        out[i] = value;
    }
}
"""
SPIN_CYCLES = 1 << 30  # about half a second at 2 GHz


@pytest.fixture(autouse=True)
def _free_cupy_blocks() -> Iterator[None]:
    """CuPy's pool gives its cached blocks back on every GPU after each test, so later
    tests of the process (clusters on the same GPUs) do not see this process holding
    memory."""
    yield
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        for device in range(cupy.cuda.runtime.getDeviceCount()):
            with cupy.cuda.Device(device):  # the pool frees the current device's blocks
                cupy.get_default_memory_pool().free_all_blocks()


def _source(whole: Any, layout: str) -> Any:
    """The view of `whole` that takes the copy's way named by `layout`."""
    return {"contiguous": whole, "rows-of-wider": whole[:, 1000:2500], "transposed": whole.T}[
        layout
    ]


def _backend() -> Any:
    from cudask.comm.ipc_cuda import CudaBackend

    return CudaBackend()


def _copied(backend: Any, src: Any) -> Any:
    import cupy

    out = cupy.empty(src.shape, src.dtype, order="C")
    backend.copy(out, int(src.data.ptr), tuple(src.strides))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_gives_the_source_values(layout: str) -> None:
    import cupy

    whole = cupy.arange(3000 * 4000, dtype="f8").reshape(3000, 4000)
    src = _source(whole, layout)
    out = _copied(_backend(), src)
    assert out.flags.c_contiguous and out.shape == src.shape
    assert bool((out == src).all())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_follows_kernels_queued_before_it(layout: str) -> None:
    """A source written by a kernel still running on the caller's stream is copied
    after that kernel (the copy stream waits on an event of the caller's stream): the
    copy gives the kernel's values, not the ones before it."""
    import cupy

    spin = cupy.RawKernel(SPIN_THEN_FILL, "spin_then_fill")
    backend = _backend()
    whole = cupy.zeros((3000, 4000))
    # once before: loading a kernel's module can wait for the GPU's queued work, which
    # would order the copy after the spinning kernel even without the event
    _copied(backend, _source(whole, layout))
    caller = cupy.cuda.get_current_stream()
    caller.synchronize()
    spin((1,), (256,), (whole, cupy.int64(whole.size), cupy.float64(7.0), cupy.int64(SPIN_CYCLES)))
    assert not caller.done, "the spinning kernel finished before the copy was queued"
    out = _copied(backend, _source(whole, layout))
    assert float(out.min()) == float(out.max()) == 7.0


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
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_copy_stream_belongs_to_the_current_device(layout: str) -> None:
    """A thread that copies on device 0, then 1, then 0 again copies each time on a
    stream of the current device (a copy kernel cannot run on another device's stream),
    and finds device 0's stream again when it comes back."""
    import cupy

    backend = _backend()
    streams: dict[int, Any] = {}
    for device in (0, 1, 0):
        with cupy.cuda.Device(device):
            src = _source(cupy.arange(3000 * 4000, dtype="f8").reshape(3000, 4000), layout)
            out = _copied(backend, src)
            assert bool((out == src).all())
            stream = backend._copy_stream()
            assert stream.device_id == device
            assert streams.setdefault(device, stream) is stream
