"""Importing cudask has no side effects: no environment writes, no NVML, no CUDA."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = r"""
import os, sys, json
before = dict(os.environ)
import cudask, cudask.devices, cudask.options, cudask.sizes, cudask.config
print(json.dumps({
    "env_changed": dict(os.environ) != before,
    "pynvml": "pynvml" in sys.modules,
    "cupy": "cupy" in sys.modules,
    "numba": "numba" in sys.modules,
    "distributed": "distributed" in sys.modules,
}))
"""


def test_import_has_no_side_effects():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report == {
        "env_changed": False,
        "pynvml": False,
        "cupy": False,
        "numba": False,
        "distributed": False,
    }
