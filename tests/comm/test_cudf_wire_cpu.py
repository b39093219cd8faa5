"""cudask.comm.cudf_wire on CPU: headers name plain buffer classes, and the
serializers registered for a class hierarchy are the ones distributed uses,
over a registration for the base class made before or after. A stand-in for
cuDF's Serializable (cuDF needs a GPU); tests/memory/test_cudf_gpu.py runs it
with cuDF."""

from __future__ import annotations

from typing import Any

from distributed.protocol import dask_serialize, deserialize, serialize
from distributed.protocol.cuda import cuda_serialize

from cudask.comm import cudf_wire


def _spilling_header() -> dict[str, Any]:
    buffer = {
        "type-serialized-name": "SpillableBuffer",
        "owner-type-serialized-name": "SpillableBufferOwner",
        "frame_count": 1,
    }
    return {
        "type-serialized-name": "DataFrame",
        "columns": [
            {
                "plc_column": {
                    "data": dict(buffer),
                    "mask": dict(buffer),
                    "subheaders": [{"data": dict(buffer)}],
                }
            }
        ],
        "index": ({"type-serialized-name": "RangeIndex"},),
        "note": "SpillableBuffer",  # not a class-name key: kept
    }


def test_portable_header_names_plain_classes_everywhere() -> None:
    header = _spilling_header()
    out = cudf_wire.portable_header(header)
    column = out["columns"][0]["plc_column"]
    for buffer in (column["data"], column["mask"], column["subheaders"][0]["data"]):
        assert buffer == {
            "type-serialized-name": "Buffer",
            "owner-type-serialized-name": "BufferOwner",
            "frame_count": 1,
        }
    assert out["type-serialized-name"] == "DataFrame"
    assert out["index"] == ({"type-serialized-name": "RangeIndex"},)
    assert out["note"] == "SpillableBuffer"
    assert header == _spilling_header()  # the input is not changed


class FakeSerializable:
    """The shape of cuDF's Serializable: host and device serialization."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def host_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        return _spilling_header(), [memoryview(self.payload)]

    def device_serialize(self) -> tuple[dict[str, Any], list[Any]]:
        return _spilling_header(), [memoryview(self.payload)]


class FakeFrame(FakeSerializable):
    pass


class FakeSeries(FakeFrame):
    pass


def _base_dumps(x: Any) -> tuple[dict[str, Any], list[Any]]:
    return x.host_serialize()


def test_registered_serializers_win_over_the_base_class() -> None:
    dask_serialize.register(FakeSerializable, _base_dumps)  # as cuDF registers its base
    assert dask_serialize.dispatch(FakeSeries) is _base_dumps  # cached for the subclass
    cudf_wire.register(FakeSerializable)
    assert {FakeSerializable, FakeFrame, FakeSeries} <= cudf_wire._registered
    assert cudf_wire.register(FakeSerializable) == 0  # idempotent
    dask_serialize.register(FakeSerializable, _base_dumps)  # a later base registration
    for cls in (FakeFrame, FakeSeries):
        assert dask_serialize.dispatch(cls) is cudf_wire._host
        assert cuda_serialize.dispatch(cls) is cudf_wire._device

    header, frames = serialize(FakeSeries(b"abc"), serializers=["dask"])
    sub = header["sub-header"]
    assert sub["columns"][0]["plc_column"]["data"]["owner-type-serialized-name"] == "BufferOwner"
    assert bytes(frames[0]) == b"abc"


def test_cuda_family_is_portable_too() -> None:
    cudf_wire.register(FakeSerializable)
    header, _ = cuda_serialize.dispatch(FakeFrame)(FakeFrame(b"x"))
    assert header["columns"][0]["plc_column"]["mask"]["type-serialized-name"] == "Buffer"


def test_round_trip_through_distributed() -> None:
    from distributed.protocol import dask_deserialize

    cudf_wire.register(FakeSerializable)
    seen: list[dict[str, Any]] = []

    def loads(header: dict[str, Any], frames: list[Any]) -> FakeFrame:
        seen.append(header)
        return FakeFrame(bytes(frames[0]))

    dask_deserialize.register(FakeFrame, loads)
    header, frames = serialize(FakeFrame(b"payload"), serializers=["dask"])
    back = deserialize(header, frames, deserializers=["dask"])
    assert back.payload == b"payload"
    assert seen[0]["columns"][0]["plc_column"]["data"]["type-serialized-name"] == "Buffer"
