"""Host images of device objects: what a spilled object is while off the device.

Covers: `HostCopy` (one device object's image: its handler's name, metadata,
the host blocks its bytes go to and the copies filling them) and
`ContainerCopy` (a list/tuple/dict's image: items are images, or host objects
kept as they are). Both pickle to their metadata plus out-of-band buffers, so
spill-to-disk writes their bytes without a copy; a HostCopy rebuilt from
pickle has no copies to wait for.

Does not cover: making or rebuilding images (the handlers, `values`), the
blocks (`cudask.memory.host.blocks.HostBlock`).

Threading: built by one thread; `ready`, `wait`, `pinned` and pickling then
from any thread. A dead HostCopy's blocks go back to their pool once the
copies filling them completed.
"""

from __future__ import annotations

import pickle
import weakref
from typing import TYPE_CHECKING, Any, cast

from cudask.memory.host.blocks import HostBlock

if TYPE_CHECKING:
    from cudask.memory.backend import Copy


class HostCopy:
    """The host image of one device object: handler name, metadata and blocks.

    `copies` are the device -> host copies filling `blocks`; `ready()` says whether
    they completed, `wait()` blocks until they do. When the HostCopy dies its
    blocks go back to the pinned pool once those copies completed.
    """

    __slots__ = ("__weakref__", "blocks", "copies", "handler", "meta", "source_streams")

    def __init__(
        self,
        handler: str,
        meta: dict[str, Any],
        blocks: list[HostBlock],
        copies: list[Copy] | None = None,
    ) -> None:
        self.handler = handler
        self.meta = meta
        self.blocks = blocks
        self.copies = copies or []
        for i, block in enumerate(blocks):
            weakref.finalize(self, block.release, self.copies[i] if i < len(self.copies) else None)

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks)

    def ready(self) -> bool:
        return all(copy.ready() for copy in self.copies)

    def wait(self) -> None:
        for copy in self.copies:
            copy.wait()

    def pinned(self) -> bool:
        return all(block.pinned for block in self.blocks)

    def __sizeof__(self) -> int:
        return self.nbytes + 200

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        self.wait()
        if isinstance(protocol, int) and protocol >= 5:
            # over NumPy arrays, not memoryviews: see HostBlock.array
            frames: list[Any] = [
                pickle.PickleBuffer(cast(Any, block.array)) for block in self.blocks
            ]
        else:
            frames = [bytes(block.view) for block in self.blocks]
        return (_rebuild_host_copy, (self.handler, self.meta, frames))

    def __repr__(self) -> str:
        return f"<HostCopy {self.handler} {self.nbytes} B>"


def _rebuild_host_copy(handler: str, meta: dict[str, Any], frames: list[Any]) -> HostCopy:
    return HostCopy(handler, meta, [HostBlock.wrap(frame) for frame in frames])


class ContainerCopy:
    """The host image of a list/tuple/dict holding device objects: items are
    HostCopy/ContainerCopy, or host objects kept as they are."""

    __slots__ = ("__weakref__", "items", "keys", "kind")

    def __init__(self, kind: str, keys: list[Any] | None, items: list[Any]) -> None:
        self.kind = kind
        self.keys = keys
        self.items = items

    def parts(self) -> list[HostCopy]:
        out: list[HostCopy] = []
        for item in self.items:
            if isinstance(item, HostCopy):
                out.append(item)
            elif isinstance(item, ContainerCopy):
                out.extend(item.parts())
        return out

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts())

    def ready(self) -> bool:
        return all(p.ready() for p in self.parts())

    def wait(self) -> None:
        for p in self.parts():
            p.wait()

    def pinned(self) -> bool:
        return all(p.pinned() for p in self.parts())

    def __sizeof__(self) -> int:
        return self.nbytes + 200 + 64 * len(self.items)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ContainerCopy, (self.kind, self.keys, self.items))


AnyHostCopy = HostCopy | ContainerCopy

__all__ = ["AnyHostCopy", "ContainerCopy", "HostCopy"]
