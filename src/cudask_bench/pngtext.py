"""Text chunks of PNG files: what a picture says it was made from.

Covers: `read(data)`, every tEXt, zTXt and iTXt chunk of a PNG as {keyword: text}, and
`add(data, items)`, the same PNG with uncompressed iTXt chunks (UTF-8) added before its
end. Charts (cudask_bench.chart) name their source there. Stdlib only.

Does not cover: pixels, or any other image format. Threading: pure functions.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunks(data: bytes) -> Iterator[tuple[bytes, bytes, int]]:
    """(type, body, offset of the chunk) for each chunk of `data`."""
    if not data.startswith(SIGNATURE):
        raise ValueError("not a PNG file (its first 8 bytes are not the PNG signature)")
    at = len(SIGNATURE)
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        yield kind, data[at + 8 : at + 8 + length], at
        at += 12 + length


def read(data: bytes) -> dict[str, str]:
    """Every text chunk of the PNG `data`: {keyword: text} (a later chunk wins)."""
    out: dict[str, str] = {}
    for kind, body, _ in _chunks(data):
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, text = rest.partition(b"\0")
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode()
    return out


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def add(data: bytes, items: Mapping[str, str]) -> bytes:
    """The PNG `data` with an iTXt chunk per item added before its IEND chunk."""
    end = next((at for kind, _, at in _chunks(data) if kind == b"IEND"), None)
    if end is None:
        raise ValueError("the PNG has no IEND chunk (truncated?)")
    for key in items:
        if not 1 <= len(key) <= 79 or not key.isascii():
            raise ValueError(f"PNG text keyword {key!r}: accepted are 1-79 ASCII characters")
    extra = b"".join(
        _chunk(b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + text.encode())
        for key, text in items.items()
    )
    return data[:end] + extra + data[end:]


__all__ = ["SIGNATURE", "add", "read"]
