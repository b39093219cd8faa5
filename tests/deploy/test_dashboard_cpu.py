"""The dashboard routes cudask's README points to exist (bokeh is a dependency).

Needs no GPU: the pages render empty without GPU metrics; tests/deploy/
test_cluster_gpu.py checks that every worker reports its own GPU to them.
"""

from __future__ import annotations

import urllib.request

import pytest
from distributed import LocalCluster


@pytest.mark.parametrize("page", ["status", "individual-gpu-memory", "individual-gpu-utilization"])
def test_dashboard_pages_are_served(page):
    with LocalCluster(n_workers=0, dashboard_address=":0", processes=False) as cluster:
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        with urllib.request.urlopen(f"{base}/{page}", timeout=30) as response:
            assert response.status == 200
