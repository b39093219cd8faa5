"""The soak's steps on a CPU cluster (distributed's LocalCluster, two workers with
nannies, host values only): worker kills, reads, deletes and the final check run
for real, and nothing is lost. The GPU soak is tests/faults/test_soak_gpu.py."""

from __future__ import annotations

import pytest
from distributed import Client, LocalCluster

from cudask.bench.soak import SoakPlan, soak_on


@pytest.mark.timeout(400)
def test_soak_steps_and_kills_on_a_cpu_cluster() -> None:
    plan = SoakPlan(duration=20, kill_every=5, seed=3, kinds=("host",), max_held=64 << 20)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="1GiB",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        report = soak_on(client, plan)
    assert report["ok"], report
    assert report["kills"] >= 2 and report["keys_lost"] == 0 and report["keys_changed"] == 0
    assert report["keys_checked"] > 0 and report["reads_checked"] > 0
    assert set(report["steps"]) >= {"create", "read", "delete", "kill"}
