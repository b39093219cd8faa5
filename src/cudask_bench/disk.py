"""The disk under the workers' local directory, measured in the run that spills to it.

Covers: `measure(directory, size)`: one file of `size` bytes written sequentially
and read back in large blocks, twice: through the page cache (the write timed to
its fsync; the file's cached pages then dropped with posix_fadvise(DONTNEED), which
needs no root, so the read comes from the device) and with O_DIRECT (from a
page-aligned anonymous mmap buffer; a filesystem that refuses O_DIRECT, such as
tmpfs, is recorded as refusing it). Each figure comes with the bytes the kernel
counted to and from storage (/proc/self/io), the result with the filesystem
(/proc/mounts) and the free space; too little free space skips the measurement,
saying why. `reference(result)`: the figures spill passes are compared with;
`summary(result)`: one line of them.

Does not cover: the spill passes' own I/O (cudask_bench.measure, workloads).

Threading: the caller's thread; the file is its own and removed before it returns.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import time
from typing import Any

from dask.utils import format_bytes

#: Bytes per system call: large sequential requests, as a disk is measured.
BLOCK = 64 << 20
#: Sizes and buffer addresses are whole pages, as O_DIRECT wants.
ALIGN = 4096
#: Free space left beside the file.
MARGIN = 1 << 30

METHOD = (
    "one file written sequentially and read back, in blocks of block_bytes: buffered "
    "(the write timed to its fsync; its cached pages dropped with posix_fadvise DONTNEED "
    "before the read), then with O_DIRECT (page-aligned mmap buffer); storage_* bytes "
    "from /proc/self/io"
)


def measure(directory: str, size: int, *, block: int = BLOCK) -> dict[str, Any]:
    """Sequential write and read figures of the filesystem holding `directory`."""
    size = max(ALIGN, size - size % ALIGN)
    block = max(ALIGN, min(block, size) - min(block, size) % ALIGN)
    out: dict[str, Any] = {
        "directory": directory,
        "bytes": size,
        "block_bytes": block,
        "filesystem": filesystem(directory),
        "method": METHOD,
    }
    free = shutil.disk_usage(directory).free
    out["free_bytes"] = free
    if free < size + MARGIN:
        out["status"] = "skipped"
        out["reason"] = (
            f"{format_bytes(free)} free in {directory}: the measurement needs "
            f"{format_bytes(size + MARGIN)} (--disk-size and {format_bytes(MARGIN)} to spare)"
        )
        return out
    path = os.path.join(directory, "cudask-bench-disk.bin")
    buffer = mmap.mmap(-1, block)  # anonymous memory: page-aligned
    try:
        buffer.write(os.urandom(block))  # data no filesystem compresses away
        out["buffered"] = _buffered(path, size, buffer)
        out["direct"] = _direct(path, size, buffer, out["filesystem"].get("type"))
    finally:
        buffer.close()
        if os.path.exists(path):
            os.remove(path)
    out["status"] = "ok"
    return out


def reference(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The disk figures spill passes are compared with: O_DIRECT's where measured,
    else the buffered ones; None without a measurement."""
    if not result or result.get("status") != "ok":
        return None
    for name in ("direct", "buffered"):
        figures = result.get(name) or {}
        if figures.get("status") == "ok":
            return {
                "method": name,
                "write_GBps": figures["write_GBps"],
                "read_GBps": figures["read_GBps"],
            }
    return None


def summary(result: dict[str, Any]) -> str:
    """One line: where, how much, and each method's figures or why there are none."""
    if result.get("status") != "ok":
        return f"disk not measured: {result.get('reason') or result.get('status')}"
    fs = result.get("filesystem") or {}
    parts = []
    for name, label in (("direct", "O_DIRECT"), ("buffered", "buffered")):
        figures = result.get(name) or {}
        if figures.get("status") == "ok":
            parts.append(
                f"{label} write {figures['write_GBps']:.2f} GB/s, "
                f"read {figures['read_GBps']:.2f} GB/s"
            )
        else:
            parts.append(f"{label}: {figures.get('reason') or figures.get('status')}")
    return (
        f"disk {fs.get('device', '?')} ({fs.get('type', '?')} at {fs.get('mount', '?')}), "
        f"{format_bytes(result['bytes'])} sequential: " + "; ".join(parts)
    )


def filesystem(directory: str) -> dict[str, str]:
    """The mount holding `directory` (type, mount point, device), from /proc/mounts."""
    where = os.path.realpath(directory)
    best: dict[str, str] = {}
    try:
        with open("/proc/mounts") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount, kind = (f.replace("\\040", " ") for f in fields[:3])
        inside = where == mount or where.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best.get("mount", "")):
            best = {"type": kind, "mount": mount, "device": device}
    return best


def _storage() -> dict[str, int]:
    try:
        with open("/proc/self/io") as fh:
            return {k.strip(): int(v) for k, v in (ln.split(":", 1) for ln in fh if ":" in ln)}
    except (OSError, ValueError):
        return {}


def _counted(before: dict[str, int], after: dict[str, int], key: str) -> int | None:
    return after[key] - before[key] if key in before and key in after else None


def _write(fd: int, buffer: mmap.mmap, size: int) -> None:
    view = memoryview(buffer)
    offset = 0
    while offset < size:
        offset += os.pwrite(fd, view[: min(len(view), size - offset)], offset)
    os.fsync(fd)


def _read(fd: int, buffer: mmap.mmap, size: int) -> None:
    view = memoryview(buffer)
    offset = 0
    while offset < size:
        got = os.preadv(fd, [view[: min(len(view), size - offset)]], offset)
        if got == 0:
            raise OSError(errno.EIO, f"the file ended {size - offset} bytes early")
        offset += got


Timed = tuple[float, dict[str, int], dict[str, int]]  # seconds, storage counters before, after


def _timed(fn: Any, *args: Any) -> Timed:
    before = _storage()
    start = time.perf_counter()
    fn(*args)
    seconds = time.perf_counter() - start
    return seconds, before, _storage()


def _figures(size: int, write: Timed, read: Timed) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": "ok",
        "write_s": write[0],
        "write_GBps": size / write[0] / 1e9,
        "read_s": read[0],
        "read_GBps": size / read[0] / 1e9,
        "storage_written_bytes": _counted(write[1], write[2], "write_bytes"),
        "storage_read_bytes": _counted(read[1], read[2], "read_bytes"),
    }
    counted = [out[k] for k in ("storage_written_bytes", "storage_read_bytes")]
    if any(c is not None and c < size // 2 for c in counted):
        out["note"] = (
            "the kernel counted less than half of it to or from storage: these "
            "figures are of memory (page cache, or a filesystem in memory)"
        )
    return out


def _buffered(path: str, size: int, buffer: mmap.mmap) -> dict[str, Any]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write = _timed(_write, fd, buffer, size)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped = True
        except (AttributeError, OSError):
            dropped = False
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        read = _timed(_read, fd, buffer, size)
    finally:
        os.close(fd)
    os.remove(path)
    return {**_figures(size, write, read), "cache_dropped": dropped}


def _direct(path: str, size: int, buffer: mmap.mmap, kind: str | None) -> dict[str, Any]:
    flag = getattr(os, "O_DIRECT", None)
    if flag is None:
        return {"status": "unavailable", "reason": "this system has no O_DIRECT"}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o600)
        try:
            write = _timed(_write, fd, buffer, size)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | flag)
        try:
            read = _timed(_read, fd, buffer, size)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        return {
            "status": "refused",
            "reason": f"the filesystem ({kind or 'unknown'}) refuses O_DIRECT: {exc.strerror}; "
            "the buffered figures are the reference",
        }
    return _figures(size, write, read)


__all__ = ["ALIGN", "BLOCK", "MARGIN", "METHOD", "filesystem", "measure", "reference", "summary"]
