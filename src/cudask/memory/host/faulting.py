"""Host memory faulted in by threads: anonymous mappings made ready at memory speed.

Covers: `map_populated(nbytes)`, which maps anonymous private memory aligned
to 2 MiB, advises transparent huge pages (`MADV_HUGEPAGE`) and faults every
page in from several threads (`MADV_POPULATE_WRITE` in calls of
`POPULATE_STEP` bytes, which the kernel runs without the GIL; where the kernel
lacks it, a strided write per page from NumPy); `unmap`, `populate`,
`default_threads()` (the threads used when `cudask.memory.populate-threads` is
"auto": the CPUs this process may run on, at most 16), and `round_up`.
Each madvise call holds the process's memory-map lock for reading, which the
CUDA calls that map memory (cudaMalloc, CUDA IPC opens) wait for: the step
bounds that wait. Why this path and these sizes: docs/design/host-memory.md.

Does not cover: registration with the driver (`cudask.memory.host.pinning`)
or when memory is needed (`cudask.memory.host.provision`).

Threading: every function is thread-safe. One shared thread pool
("cudask-populate") serves all callers; a call returns when its pages are in.
Linux only: elsewhere `available()` is False and callers use other memory.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy

HUGE_PAGE = 2 << 20
PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux 5.14+
_MAP_FAILED = ctypes.c_void_p(-1).value
# below this size one thread faults the pages in: a thread hand-off costs more
_PARALLEL_FROM = 32 << 20
# bytes faulted in per madvise call (each holds the memory-map lock for reading)
POPULATE_STEP = 32 << 20


class HostMemoryError(MemoryError):
    """The kernel refused to map or fault in host memory; the message says why."""


def available() -> bool:
    """Whether this platform can map populated anonymous memory (Linux)."""
    return sys.platform.startswith("linux") and _libc() is not None


_lib: Any = None
_lib_lock = threading.Lock()


def _libc() -> Any:
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                lib: Any
                try:
                    lib = ctypes.CDLL(None, use_errno=True)
                    lib.mmap.restype = ctypes.c_void_p
                    lib.mmap.argtypes = [
                        ctypes.c_void_p,
                        ctypes.c_size_t,
                        ctypes.c_int,
                        ctypes.c_int,
                        ctypes.c_int,
                        ctypes.c_long,
                    ]
                    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                except (OSError, AttributeError):
                    lib = False
                _lib = lib
    return _lib or None


def default_threads() -> int:
    """Threads that fault memory in by default: the CPUs this process may run on
    (its affinity, which cudask pins near the GPU), at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 16))


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < threads:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cudask-populate")
            _pool_size = threads
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def round_up(n: int, multiple: int) -> int:
    """`n` rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def map_populated(nbytes: int, *, threads: int | None = None, huge: bool = True) -> int:
    """Map `nbytes` (rounded up to a page) of anonymous read-write memory, 2 MiB
    aligned, advised for huge pages, with every page faulted in; return its
    address. Raise HostMemoryError when the kernel refuses (nothing is left
    mapped then)."""
    lib = _libc()
    if lib is None:
        raise HostMemoryError("anonymous memory mappings need Linux")
    size = round_up(max(nbytes, 1), PAGE)
    extra = HUGE_PAGE if huge and size >= HUGE_PAGE else 0
    raw = lib.mmap(
        None,
        size + extra,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        -1,
        0,
    )
    if raw is None or raw == _MAP_FAILED:
        err = ctypes.get_errno()
        raise HostMemoryError(f"mmap of {size} bytes failed: {os.strerror(err)}")
    ptr = raw
    if extra:
        ptr = round_up(raw, HUGE_PAGE)
        if ptr > raw:
            lib.munmap(raw, ptr - raw)
        tail = raw + size + extra - (ptr + size)
        if tail:
            lib.munmap(ptr + size, tail)
        lib.madvise(ptr, size, mmap.MADV_HUGEPAGE)  # advice only: failure is harmless
    try:
        populate(ptr, size, threads=threads)
    except BaseException:
        lib.munmap(ptr, size)
        raise
    return ptr


def unmap(ptr: int, nbytes: int) -> None:
    """Give back memory from `map_populated` (same `nbytes`)."""
    lib = _libc()
    if lib is not None and ptr:
        lib.munmap(ptr, round_up(max(nbytes, 1), PAGE))


def populate(ptr: int, nbytes: int, *, threads: int | None = None) -> None:
    """Fault in every page of [ptr, ptr + nbytes), writable, from `threads`
    threads (default `default_threads()`), each taking an equal section."""
    threads = default_threads() if threads is None else max(threads, 1)
    if nbytes < _PARALLEL_FROM or threads == 1:
        _populate_section(ptr, nbytes)
        return
    step = round_up(-(-nbytes // threads), HUGE_PAGE)
    sections = [
        (start, min(step, ptr + nbytes - start)) for start in range(ptr, ptr + nbytes, step)
    ]
    futures = [_executor(threads).submit(_populate_section, start, n) for start, n in sections]
    errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


_no_populate_write = False


def _populate_section(ptr: int, nbytes: int) -> None:
    global _no_populate_write
    lib = _libc()
    start, end = ptr, ptr + nbytes
    while not _no_populate_write and start < end:
        step = min(POPULATE_STEP, end - start)
        if lib.madvise(start, step, MADV_POPULATE_WRITE) == 0:
            start += step
            continue
        err = ctypes.get_errno()
        if err in (
            errno.ENOMEM,
            errno.EFAULT,
            errno.EHWPOISON if hasattr(errno, "EHWPOISON") else -1,
        ):
            raise HostMemoryError(
                f"faulting in {nbytes} bytes of host memory failed: {os.strerror(err)}"
            )
        _no_populate_write = True  # EINVAL: a kernel before 5.14
    if start < end:
        # One write per page; NumPy runs the strided assignment without the GIL.
        pages = numpy.ctypeslib.as_array((ctypes.c_uint8 * (end - start)).from_address(start))
        pages[::PAGE] = 0


def shutdown() -> None:
    """Stop the shared populate threads (they restart when needed)."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)


__all__ = [
    "HUGE_PAGE",
    "HostMemoryError",
    "available",
    "default_threads",
    "map_populated",
    "populate",
    "round_up",
    "shutdown",
    "unmap",
]
