from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_demo_spills_and_reports_every_gpu():
    pytest.importorskip("cupy")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudask.cli",
            "demo",
            "--device-memory-limit",
            "1GB",
            "--size",
            "2",
            "--dashboard-address",
            ":0",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "dashboard" in text
    mean = float(re.search(r"mean ([0-9.]+)", text).group(1))
    assert abs(mean - 2.0) < 0.01  # values are 2*U[0,1)+1
    rows = [ln for ln in text.splitlines() if re.match(r"\s+\d+\s+GPU-", ln)]
    assert rows, text
    for row in rows:
        sizes = re.findall(r"\b[0-9.]+ [KMGTP]?i?B\b(?!/)", row)
        assert len(sizes) == 5, row  # on device, on host, on disk, spilled, unspilled
        assert not sizes[3].startswith("0 "), row  # something went to host on every GPU
        assert re.search(r"[0-9.]+ GB/s", row), row  # and the spill rate is reported
