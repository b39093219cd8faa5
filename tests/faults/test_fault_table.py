"""The fault matrix's table and the scheduler watch its rows are built from, on a
CPU: an absent figure shows as "—" (never 0), a case that could not run keeps a
row saying why, and the watch counts a worker killed, its return and the keys
recomputed, not the computations before it began."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import fault_table
import pytest
from fault_watch import Seen, watch

from cudask.testing.integrity import Check


def test_absent_figures_show_as_a_dash_and_a_case_not_run_keeps_its_row(tmp_path: Path) -> None:
    check = Check(identical=["a", "b"], lost={"c": "KilledWorker: x"})
    rows = [
        fault_table.row("t::ran", "ran | once", "ok", check, 1.234, extra=1),
        fault_table.row("t::quiet", "nothing failed", "ok", check, None),
        fault_table.row("t::skipped", "no disk", "not run: no tmpfs", None, None),
    ]
    assert (
        rows[0]["keys_checked"] == 3 and rows[0]["keys_lost"] == 1 and rows[0]["recover_s"] == 1.23
    )
    assert rows[2]["keys_checked"] is None and rows[2]["lost"] is None
    lines = fault_table.markdown(rows).splitlines()
    assert len(lines) == 5
    assert lines[2] == "| ran \\| once | ok | 3 | 1 | 0 | 1.23 |"
    assert lines[3] == "| nothing failed | ok | 3 | 1 | 0 | — |"
    assert lines[4] == "| no disk | not run: no tmpfs | — | — | — | — |"


def _value(i: int) -> bytes:
    return bytes([i]) * 1000


@pytest.mark.timeout(180)
def test_the_watch_counts_a_killed_worker_and_the_keys_recomputed() -> None:
    from distributed import Client, LocalCluster, wait

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        held = [client.submit(_value, i, key=f"held-{i}") for i in range(4)]
        wait(held)
        seen = watch(client)
        assert seen() == Seen(left=0, joined=0, computed={})
        (pid,) = client.run(os.getpid).values()
        os.kill(pid, signal.SIGKILL)
        assert client.gather(held) == [_value(i) for i in range(4)]
        client.wait_for_workers(1, timeout=120)
        now = seen()
        assert now.left == 1 and now.joined == 1, now
        assert now.recomputed(held) == 4 and all(now.computed[f.key] == 1 for f in held), now
