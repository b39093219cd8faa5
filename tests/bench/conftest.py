"""Fixtures for the bench tests: a synthetic result document shaped like a real run, and a
folder that looks like an installed dask-cuda."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cudask_bench.measure import summarize

GIB4 = 4 * 2**30


def _variant(
    name: str,
    backend: str,
    limit: Any,
    jit: bool,
    times: dict[str, list[float]],
    status: str = "ok",
    error: str | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "backend": backend,
        "device_memory_limit": limit,
        "jit_unspill": jit,
        "status": status,
        "error": error,
        "measurements": {
            k: summarize(
                {
                    "unit": "s",
                    "times": v,
                    "warmup_times": [],
                    "bytes": 16 * 2**30,
                    "status": "ok",
                    "error": None,
                }
            )
            for k, v in times.items()
        },
    }


SYNTHETIC: dict[str, Any] = {
    "format": "cudask-bench/1",
    "workload": "spill",
    "machine": {"hostname": "h", "gpu_used": {"name": "NVIDIA H100 80GB HBM3"}},
    "parameters": {"total": 16 * 2**30},
    "variants": [
        _variant(
            "dict store",
            "dict",
            None,
            False,
            {"create": [0.35, 0.36, 0.34], "read_verify": [0.33, 0.32, 0.34]},
        ),
        _variant(
            "cudask no limit",
            "cudask",
            None,
            False,
            {"create": [0.36, 0.37, 0.35], "read_verify": [0.33, 0.34, 0.35]},
        ),
        _variant(
            "cudask 4 GiB",
            "cudask",
            GIB4,
            False,
            {"create": [0.9, 1.0, 0.8], "read_verify": [1.1, 1.2, 1.0]},
        ),
        _variant(
            "cudask 4 GiB +jit",
            "cudask",
            GIB4,
            True,
            {"create": [0.7, 0.8, 0.9], "read_verify": [0.9, 1.0, 1.1]},
        ),
        _variant(
            "dask-cuda 4 GiB",
            "dask-cuda",
            GIB4,
            False,
            {"create": [5.75, 5.8, 5.7], "read_verify": [6.78, 6.7, 6.9]},
        ),
        _variant(
            "dask-cuda 4 GiB +jit",
            "dask-cuda",
            GIB4,
            True,
            {},
            status="failed",
            error="--jit-unspill: dask-cuda 26.10 has no JIT-unspill",
        ),
    ],
}


@pytest.fixture
def synthetic_document() -> dict[str, Any]:
    return copy.deepcopy(SYNTHETIC)


def _fake_dask_cuda(root: Path, version: str, proxy_object: bool) -> Path:
    package = root / "dask_cuda"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    if proxy_object:
        (package / "proxy_object.py").write_text("")
    info = root / f"dask_cuda-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dask-cuda\nVersion: {version}\n")
    (info / "top_level.txt").write_text("dask_cuda\n")
    return root


@pytest.fixture
def fake_dask_cuda() -> Callable[..., Path]:
    """`make(root, version, proxy_object)`: a directory that looks like
    `pip install --target DIR dask-cuda==VERSION` (with dask_cuda/proxy_object.py up to 26.04)."""
    return _fake_dask_cuda
