"""gpus_without_peer_access over a stand-in NVML (the calls, not a GPU)."""

from __future__ import annotations

import types

from cudask.devices.nvml import NVMLBackend, gpus_without_peer_access


def _nvml(
    uuids: list[str], blocked: set[tuple[str, str]], fail: bool = False
) -> types.SimpleNamespace:
    def p2p(a: str, b: str, index: int) -> int:
        if fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        assert index == 0  # NVML_P2P_CAPS_INDEX_READ
        return 3 if (a, b) in blocked else 0

    return types.SimpleNamespace(
        NVML_P2P_CAPS_INDEX_READ=0,
        NVML_P2P_STATUS_OK=0,
        nvmlDeviceGetHandleByUUID=lambda u: u,
        nvmlDeviceGetCount=lambda: len(uuids),
        nvmlDeviceGetHandleByIndex=lambda i: uuids[i],
        nvmlDeviceGetUUID=lambda h: h.encode(),
        nvmlDeviceGetP2PStatus=p2p,
    )


def test_peer_access_by_uuid(monkeypatch) -> None:
    backend = NVMLBackend()
    uuids = ["GPU-a", "GPU-b", "GPU-c"]
    monkeypatch.setattr(backend, "_init", lambda: _nvml(uuids, {("GPU-a", "GPU-c")}))
    assert gpus_without_peer_access("GPU-a", backend) == ["GPU-c"]
    assert gpus_without_peer_access("GPU-b", backend) == []
    monkeypatch.setattr(backend, "_init", lambda: _nvml(uuids, set(), fail=True))
    assert gpus_without_peer_access("GPU-a", backend) is None
    monkeypatch.setattr(backend, "_init", lambda: _nvml(["GPU-a"], set(), fail=True))
    assert gpus_without_peer_access("GPU-a", backend) == []  # alone: nothing to ask
