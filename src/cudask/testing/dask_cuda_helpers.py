"""dask-cuda's test helpers (`dask_cuda.utils_test`) for tests run through cudask's alias.

Covers: `MockWorker`, a distributed Worker whose system monitor leaves NVML alone (so
a test can name devices in CUDA_VISIBLE_DEVICES that this machine does not have
without the monitor failing), and `IncreasedCloseTimeoutNanny`, a Nanny that gives its
worker 30 seconds to close, for loaded test machines. Does not cover: cudask's own
test helpers (cudask.testing).

Threading: as distributed's Worker and Nanny.
"""

from __future__ import annotations

from typing import Any, Literal

import dask.config
from distributed import Nanny, Worker


class MockWorker(Worker):
    """A Worker whose process has distributed's NVML diagnostics turned off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dask.config.set({"distributed.diagnostics.nvml": False})  # for this worker process
        super().__init__(*args, **kwargs)


class IncreasedCloseTimeoutNanny(Nanny):
    """A Nanny whose close waits up to 30 seconds for its worker by default."""

    async def close(  # type: ignore[override]
        self,
        timeout: float = 30.0,
        reason: str = "nanny-close",
    ) -> Literal["OK"]:
        return await super().close(timeout=timeout, reason=reason)


__all__ = ["IncreasedCloseTimeoutNanny", "MockWorker"]
