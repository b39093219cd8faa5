"""Byte-for-byte checks of the data a cluster holds, for fault tests and soaks.

Covers: `make_value(seed, nbytes, kind)`, a deterministic value of one of
`KINDS` (a device array, a transposed device view, an int8 device array, a dict
mixing device and host arrays, a host array, a block of columns of a device
matrix, a device array read backwards), so a value lost with its worker
and recomputed by the scheduler is the same bytes again; `digest(value)`, a
SHA-256 over dtype, shape and the values in C order of every array in a value
(proxies are looked through; a device array's values enter as a 128-bit
fingerprint computed on the device, see `_feed_device_array`); `settle(future)`,
a future's result or why it has none, waiting through the recompute of a result
lost with a killed worker; and `check_keys(client, expected)`, which digests
every held future *on the worker holding it* (nothing crosses to the client)
and sorts the keys into identical, lost and changed.

Does not cover: creating the cluster or the faults; timings.

The functions run on workers: they import CuPy only when a device kind is asked
for, and `digest` needs it only for device arrays. Threading: pure functions (any
worker thread); `settle` and `check_keys` block the calling client thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cudask.memory.jit.proxy import unproxy

#: Kinds of value `make_value` builds; all but "host" live on the device.
KINDS = ("f8", "i1", "view", "dict", "host", "block", "reversed")


def make_value(seed: int, nbytes: int, kind: str = "f8") -> Any:
    """A deterministic value of about `nbytes` bytes (same seed, same bytes)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if kind == "host":
        return np.random.default_rng(seed).integers(0, 256, size=max(nbytes, 1), dtype=np.uint8)
    import cupy

    rng = cupy.random.RandomState(seed)  # made on the device: gigabytes in milliseconds
    if kind == "i1":
        return rng.randint(-128, 128, size=max(nbytes, 1), dtype=cupy.int8)
    n = max(nbytes // 8, 1)
    values = rng.standard_normal(n)
    if kind == "f8":
        return values
    if kind == "view":  # a non-contiguous view keeping its whole base alive
        side = max(int(n**0.5), 1)
        return values[: side * side].reshape(side, side).T
    if kind == "block":  # the left half of a square's columns: rows with gaps between them
        side = max(int(n**0.5), 2)
        return values[: side * side].reshape(side, side)[:, : side // 2]
    if kind == "reversed":  # a negative stride
        return values[::-1]
    host = np.random.default_rng(seed).integers(0, 1000, size=max(n // 16, 1))
    return {"device": values[: n // 2], "host": host, "seed": seed}


def digest(value: Any) -> str:
    """SHA-256 of every array in `value` (dtype, shape, values in C order),
    through dicts, lists and tuples; other leaves by their repr."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    value = unproxy(value)
    if isinstance(value, Mapping):
        h.update(b"{")
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, list | tuple):
        h.update(b"[")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif hasattr(value, "__cuda_array_interface__"):
        _feed_device_array(h, value)
    elif isinstance(value, np.ndarray):
        _feed_array(h, np.ascontiguousarray(value))
    else:
        h.update(repr(value).encode())


# Elements of 8 bytes fingerprinted per step (temporaries stay near 128 MiB each).
_STEP = 1 << 24
_MASK = (1 << 64) - 1


def _mix(x: Any) -> Any:
    """splitmix64 of a uint64 CuPy array: a well-spread odd multiplier per word."""
    x = x + 0x9E3779B97F4A7C15
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return (x ^ (x >> 31)) | 1


def _feed_device_array(h: Any, value: Any) -> None:
    """Fingerprint a device array on the device: its 8-byte words w_i summed as
    sum(w_i * m_i) mod 2**64 for two sequences of odd multipliers m_i (a function
    of the position), the trailing bytes as they are. A change in any word, or two
    words swapped, changes a sum except with probability about 2**-64; reading a
    gigabyte back to the host for SHA-256 would take seconds."""
    import cupy

    a = cupy.ascontiguousarray(cupy.asarray(value))
    h.update(f"{a.dtype.str}{a.shape}".encode())
    flat = a.reshape(-1).view(cupy.uint8)
    whole = flat.size // 8 * 8
    words = flat[:whole].view(cupy.uint64)
    sums = [0, 0]
    for start in range(0, words.size, _STEP):
        w = words[start : start + _STEP]
        index = cupy.arange(start, start + w.size, dtype=cupy.uint64)
        for j, salt in enumerate((0x5851F42D4C957F2D, 0x14057B7EF767814F)):
            sums[j] = (sums[j] + int((w * _mix(index ^ salt)).sum(dtype=cupy.uint64))) & _MASK
    h.update(f"{sums[0]:016x}{sums[1]:016x}".encode())
    h.update(cupy.asnumpy(flat[whole:]).tobytes())


def _feed_array(h: Any, a: np.ndarray) -> None:
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.data if a.size else b"")


@dataclass
class Check:
    """What `check_keys` found: keys whose bytes are identical, lost (the future
    erred or was cancelled) or changed (different bytes)."""

    identical: list[str] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)

    @property
    def checked(self) -> int:
        return len(self.identical) + len(self.lost) + len(self.changed)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.changed


def settle(future: Any, timeout: float = 600) -> tuple[Any, str | None]:
    """`(result, None)`, or `(None, why)` when `future` has none: its error's type and
    first line, its cancellation, or the timeout. A result held by a worker that
    was just killed reads as status 'lost' until the scheduler has recomputed it;
    this waits for that instead of reading the status, which races with the news
    of the death."""
    try:
        return future.result(timeout=timeout), None
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the reason is the answer
        text = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"{type(exc).__name__}: {text}"


def check_keys(client: Any, expected: Mapping[Any, str], timeout: float = 600) -> Check:
    """Digest every future of `expected` (future -> digest at creation) where it is
    held and compare. A future whose value cannot be had any more counts as lost,
    with the error's first line; one being recomputed after a worker's death is
    waited for (`settle`): up to `timeout` seconds for all, and at least 1 s for
    each."""
    futures = list(expected)
    digests = [client.submit(digest, f, pure=False) for f in futures]
    deadline = time.monotonic() + timeout
    out = Check()
    for f, d in zip(futures, digests, strict=True):
        name = str(f.key)
        got, why = settle(d, max(deadline - time.monotonic(), 1.0))
        if why is not None:
            out.lost[name] = why
        elif got == expected[f]:
            out.identical.append(name)
        else:
            out.changed.append(name)
    return out
