"""The CUDA calls of the cudask-ipc family, behind a protocol.

Covers: `Backend`, the calls cudask.comm.ipc makes (wait for queued work,
export a handle, map and unmap another process's allocation, allocate, copy),
and the three cudask.comm.staging makes (`CudaBackend.allocate_area`, `.free_area`,
`.stage`),
`CudaBackend`, which makes them through CuPy's runtime bindings and the driver
API of cuda-bindings, and `Explained`, a backend's map and unmap whose refusal
says what to do. Tests give a fake backend (cudask.testing.fake_cuda.FakeIPCBackend).

Does not cover: when to send by handle, headers, mapping lifetimes
(cudask.comm.ipc, cudask.comm.lifetimes).

Importing this module imports no CUDA library; constructing `CudaBackend`
imports CuPy and cuda-bindings (ImportError when either is missing).

Threading: its calls come from distributed's serialization threads and the
event loop; the only state a backend keeps is one copy stream per calling
thread and device, and `copy` returns only once its copy has finished.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from cudask.comm.ipc_layout import extent


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
        self._streams = threading.local()  # each thread's copy streams by device (`_copy_stream`)

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

    def allocate_area(self, nbytes: int) -> int:
        """cudaMalloc'd memory for cudask.comm.staging's area, kept for the process's life
        unless its handle cannot be exported (`free_area`)."""
        return int(self._cupy.cuda.runtime.malloc(nbytes))

    def free_area(self, base: int) -> None:
        """Free what `allocate_area` gave (an area that could not be exported)."""
        self._cupy.cuda.runtime.free(base)

    def stage(self, x: Any, address: int, order: str) -> None:
        """Copy the device array `x` to `address`, contiguous in `order`, and wait for it."""
        cupy = self._cupy
        src = cupy.asarray(x)  # a view, through __cuda_array_interface__
        memory = cupy.cuda.UnownedMemory(address, int(src.nbytes), None, cupy.cuda.Device().id)
        out = cupy.ndarray(src.shape, src.dtype, cupy.cuda.MemoryPointer(memory, 0), order=order)
        out[...] = src
        cupy.cuda.get_current_stream().synchronize()

    def copy(self, out: Any, src: int, strides: tuple[int, ...]) -> None:
        cupy = self._cupy
        runtime = cupy.cuda.runtime
        dst, shape, itemsize = int(out.data.ptr), tuple(out.shape), int(out.itemsize)
        # `out` comes from a stream-ordered pool on the current stream: the copy waits for
        # the work queued there now (a reused block may still be read), and kernels queued
        # there later run beside the copy, as they do beside UCX's copies.
        allocated = cupy.cuda.Event(disable_timing=True, block=False)
        allocated.record(cupy.cuda.get_current_stream())
        stream = self._copy_stream()
        stream.wait_event(allocated)
        if strides == tuple(out.strides):  # same layout: one block of bytes
            runtime.memcpyAsync(dst, src, int(out.nbytes), runtime.memcpyDefault, stream.ptr)
        elif (
            len(shape) == 2
            and strides[1] == itemsize
            and strides[0] >= shape[1] * itemsize
            and out.flags.c_contiguous
        ):
            width = shape[1] * itemsize  # rows of a wider array: a pitched copy
            runtime.memcpy2DAsync(
                dst, width, src, strides[0], width, shape[0], runtime.memcpyDefault, stream.ptr
            )
        else:  # any other layout: a copy kernel reading the mapping in place
            low, span = extent(src, shape, strides, itemsize)
            memory = cupy.cuda.UnownedMemory(low, span, None, cupy.cuda.Device().id)
            view = cupy.ndarray(
                shape, out.dtype, cupy.cuda.MemoryPointer(memory, src - low), strides
            )
            with stream:
                out[...] = view
        # The sender may reuse its memory once this worker replies, and the caller's
        # stream reads `out` next: wait here for the copy to finish.
        stream.synchronize()

    def _copy_stream(self) -> Any:
        """This thread's stream for receive copies on the current device, one that does
        not wait for the legacy default stream (the worker's kernels)."""
        streams = getattr(self._streams, "copy", None)
        if streams is None:
            streams = self._streams.copy = {}
        device = self._cupy.cuda.Device().id
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = self._cupy.cuda.Stream(non_blocking=True)
        return stream


class MappingRefused(RuntimeError):
    """This process cannot map another process's device memory (cudask.worker.gpu_worker
    then receives through host memory)."""


class Explained:
    """The backend's open and close, a refused mapping explained."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def open(self, handle: bytes) -> int:
        try:
            return self.backend.open(handle)
        except RuntimeError as exc:
            raise MappingRefused(
                f"cudask-ipc: cannot map another worker's device memory here ({exc}); if the "
                "workers of this host cannot share GPU memory (e.g. containers with separate IPC "
                "namespaces), set cudask.comm.device-ipc: false on them"
            ) from exc

    def close(self, base: int) -> None:
        self.backend.close(base)


__all__ = ["Backend", "CudaBackend", "Explained", "MappingRefused"]
