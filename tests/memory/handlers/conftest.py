"""Fixtures of the handler tests: a transfer engine over the fake copy backend."""

from __future__ import annotations

import pytest

from cudask.memory.host.copy_engine import TransferEngine
from cudask.memory.host.pool import PinnedPool
from cudask.testing.fake_cuda import FakeCopyBackend


@pytest.fixture
def engine() -> TransferEngine:
    backend = FakeCopyBackend()
    return TransferEngine(backend, PinnedPool(backend, 1 << 20, slab_size=1 << 16))
