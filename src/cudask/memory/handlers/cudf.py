"""The cuDF family: DataFrame, Series, Index and columns (`cudf.core.abc.Serializable`).

Covers: `CudfHandler`, which moves an object through cuDF's own
`device_serialize()` / `device_deserialize()`: device frames counted by their
extent and copied raw, host frames (with cuDF spilling on, buffers cuDF has
spilled) kept as they are, the type pickled into the metadata. A device frame
is held until its copy is seen complete (it holds cuDF's spill lock). A copy
rebuilt from pickle has no copies and keeps every frame. `register_cudf` is
run lazily by the package.

Does not cover: sending cuDF objects between workers (`cudask.comm.ipc`).

Threading: stateless; any thread. `to_device` returns with its copies under
way; cuDF may launch work while deserializing, so the legacy default stream
is made to wait for the copies first.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from cudask.memory.accounting import Range
from cudask.memory.handlers.cai import interface_extent
from cudask.memory.handlers.images import HostCopy
from cudask.memory.handlers.registry import register_handler
from cudask.memory.host.blocks import HostBlock

if TYPE_CHECKING:
    from cudask.memory.backend import Copy
    from cudask.memory.host.copy_engine import TransferEngine


class CudfHandler:
    """cuDF objects (DataFrame, Series, Index, columns): moved through their own
    `device_serialize()` / `device_deserialize()`; device frames are copied
    raw, host frames kept as they are."""

    name = "cudf"

    def accepts(self, obj: Any) -> bool:
        return hasattr(obj, "device_serialize")

    def _frames(self, obj: Any) -> tuple[dict[str, Any], list[Any]]:
        header, frames = obj.device_serialize()
        return header, frames

    def allocations(self, obj: Any) -> list[Range]:
        header, frames = self._frames(obj)
        out: list[Range] = []
        for is_cuda, frame in zip(header["is-cuda"], frames):
            if is_cuda:
                low, high, _ = interface_extent(frame.__cuda_array_interface__)
                if high > low:
                    out.append((low, high))
        return out

    def producer_streams(self, obj: Any) -> tuple[int, ...]:
        return ()

    def to_host(self, obj: Any, engine: TransferEngine) -> HostCopy:
        header, frames = self._frames(obj)
        blocks: list[HostBlock] = []
        copies: list[Copy] = []
        kinds: list[str] = []
        for is_cuda, frame in zip(header["is-cuda"], frames):
            if is_cuda:
                low, high, _ = interface_extent(frame.__cuda_array_interface__)
                block, copy = engine.to_host(low, high - low)
                # held until the copy is seen complete: with cuDF spilling on, the
                # frame's spill lock keeps cuDF from spilling the buffer under it
                copy.source = frame
                blocks.append(block)
                copies.append(copy)
                kinds.append("device")
            else:
                view = memoryview(frame).cast("B")
                block = HostBlock.pageable(view.nbytes)
                if view.nbytes:  # an empty block's view is read-only
                    block.view[:] = view
                blocks.append(block)
                copies.append(_NoCopy())  # type: ignore[arg-type]
                kinds.append("host")
        meta = {"header": header, "kinds": kinds, "type": pickle.dumps(type(obj))}
        return HostCopy(self.name, meta, blocks, copies)  # type: ignore[arg-type]

    def to_device(self, copy: HostCopy, engine: TransferEngine) -> tuple[Any, list[Copy]]:
        frames: list[Any] = []
        h2d: list[Copy] = []
        try:
            self._copy_frames(copy, engine, frames, h2d)
        except BaseException:
            for c in h2d:  # their destinations go with `frames`: not while being written
                c.wait()
            raise
        engine.order_default_after(h2d)
        cls = pickle.loads(copy.meta["type"])
        return cls.device_deserialize(copy.meta["header"], frames), h2d

    @staticmethod
    def _copy_frames(
        copy: HostCopy, engine: TransferEngine, frames: list[Any], h2d: list[Copy]
    ) -> None:
        """Allocate each device frame and enqueue its copy back (into `frames`, `h2d`)."""
        import rmm

        for i, (kind, block) in enumerate(zip(copy.meta["kinds"], copy.blocks, strict=True)):
            # a host copy rebuilt from pickle (a proxy sent to a client) has no copies
            filled = copy.copies[i] if i < len(copy.copies) else None
            if kind == "device":
                buf = rmm.DeviceBuffer(size=block.nbytes)
                h2d.append(
                    engine.to_device(
                        int(buf.ptr),
                        block.ptr,
                        block.nbytes,
                        after=None if filled is None or isinstance(filled, _NoCopy) else filled,
                    )
                )
                frames.append(buf)
            else:
                frames.append(bytes(block.view))


class _NoCopy:
    """Stands for a copy that already happened (host frames)."""

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None


def register_cudf() -> None:
    from cudf.core.abc import Serializable

    register_handler(Serializable, CudfHandler())


__all__ = ["CudfHandler", "register_cudf"]
