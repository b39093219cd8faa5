"""The soak's steps on a CPU cluster (distributed's LocalCluster, two workers with
nannies, host values only): worker kills, reads, deletes and the final check run
for real, and nothing is lost. Two kills are asked for by count (`min_kills`), not
hoped for within the duration: on a busy machine a worker's restart can take most
of it. The GPU soak is tests/faults/test_soak_gpu.py."""

from __future__ import annotations

import re

import pytest
from distributed import Client, LocalCluster

from cudask_bench.soak import SoakPlan, soak_on


@pytest.mark.timeout(400)
def test_soak_steps_and_kills_on_a_cpu_cluster() -> None:
    # the second kill cannot come before 2 x kill_every = 10 s: the soak's overtime runs
    plan = SoakPlan(
        duration=8, kill_every=5, min_kills=2, seed=3, kinds=("host",), max_held=64 << 20
    )
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit="1GiB",
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        report = soak_on(client, plan)
    assert report["ok"], report
    assert (
        report["seconds"] >= 10
        and report["kills"] >= 2
        and report["keys_lost"] == 0
        and report["keys_changed"] == 0
    )
    assert report["keys_checked"] > 0 and report["reads_checked"] > 0
    assert set(report["steps"]) >= {"create", "read", "delete", "kill"}


@pytest.mark.parametrize(
    ("plan", "named"),
    [
        ({"kill_every": 0, "min_kills": 2}, "min_kills=2 with kill_every=0"),
        ({"min_kills": True}, "min_kills=True"),
        ({"min_kills": 1.5}, "min_kills=1.5"),
        ({"min_kills": -1}, "min_kills=-1"),
        ({"duration": 60, "kill_every": 20, "min_kills": 40}, "take longer than duration + 600 s"),
    ],
)
def test_min_kills_that_cannot_be_had_are_refused(plan: dict, named: str) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        SoakPlan(**plan)
