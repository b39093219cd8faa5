"""LocalCUDACluster errors that must come before any process starts (CPU)."""

from __future__ import annotations

import inspect

import pytest

from cudask import LocalCUDACluster
from cudask.errors import CudaskError, OptionError


def test_signature_lists_dask_cuda_keywords():
    params = inspect.signature(LocalCUDACluster.__init__).parameters
    for name in (
        "CUDA_VISIBLE_DEVICES",
        "n_workers",
        "threads_per_worker",
        "memory_limit",
        "device_memory_limit",
        "rmm_pool_size",
        "rmm_async",
        "jit_unspill",
        "enable_cudf_spill",
        "pre_import",
        "log_spilling",
        "protocol",
    ):
        assert name in params


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rmm_async": True, "rmm_managed_memory": True}, "cannot be combined"),
        ({"threads_per_worker": 0}, "at least 1"),
        ({"nonsense_keyword": 1}, "unknown keyword"),
        ({"processes": False}, "processes=False"),
    ],
)
def test_bad_options_before_start(kwargs, match):
    with pytest.raises(OptionError, match=match):
        LocalCUDACluster(**kwargs)


def test_no_gpu_message():
    try:
        cluster = LocalCUDACluster(n_workers=1)
    except CudaskError as exc:
        assert "no NVIDIA GPU found" in str(exc) or "GPU" in str(exc)
    else:  # pragma: no cover - only on a GPU machine
        cluster.close()
        pytest.skip("this machine has a GPU")
