"""Public test helpers for cudask and the projects built on it.

- FakeBackend / fake_gpu: describe any machine to discovery (cudask.devices).
- real_gpu_count(): how many GPUs NVML really sees (0 without NVML); the
  pytest markers `gpu` and `multigpu` skip on it.
Fake device objects for the store live in cudask.testing.fake_cuda.
"""

from __future__ import annotations

from cudask.testing.devices import FakeBackend, fake_gpu


def real_gpu_count() -> int:
    """GPUs that NVML reports on this machine; 0 with no NVML library or driver."""
    from cudask.devices import discover

    return len(discover().gpus)


__all__ = ["FakeBackend", "fake_gpu", "real_gpu_count"]
