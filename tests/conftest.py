"""Test-suite wiring: the `gpu` and `multigpu` markers skip themselves where
NVML finds too few GPUs (see cudask.testing.real_gpu_count)."""

from __future__ import annotations

import functools

import pytest

from cudask.testing import real_gpu_count

NEEDED = {"gpu": 1, "multigpu": 2}


@functools.cache
def _gpus() -> int:
    return real_gpu_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, needed in NEEDED.items():
            if item.get_closest_marker(marker) is not None and _gpus() < needed:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {needed}+ NVIDIA GPU(s); NVML finds {_gpus()}")
                )
