"""cudask.testing.processes on a machine without a GPU: cudask's workers end at once
and the helper says so with their own words, without waiting out its timeout, naming
every process that ended, also one that ended after another; with
distributed's own workers, a failure in the block carries their logs and stopping loses
no key."""

from __future__ import annotations

import logging
import operator
import sys
import time

import pytest
from distributed.utils_test import captured_logger

from cudask.testing import real_gpu_count
from cudask.testing.processes import worker_processes


@pytest.mark.skipif(real_gpu_count() > 0, reason="the workers would start on this machine's GPU")
def test_workers_that_end_are_reported_at_once(tmp_path) -> None:
    start = time.monotonic()
    with (
        pytest.raises(
            RuntimeError, match=r"worker process\(es\) \[0, 1\] ended: .*no NVIDIA GPU found"
        ),
        worker_processes(["0", "0"], log_dir=tmp_path, timeout=300),
    ):
        pass
    assert time.monotonic() - start < 120
    assert "no NVIDIA GPU found" in (tmp_path / "worker-1.log").read_text()


def test_processes_that_end_one_after_the_other_are_all_reported(tmp_path) -> None:
    """A process that ends while another started alike is still on its way out: the
    report names both, not only the one that ended first (both fail; the second a few
    seconds later, as one of two workers that find no GPU may under load)."""
    script = (
        "import sys, time; time.sleep(4 if 'w0' in sys.argv else 0); sys.exit('ended on its own')"
    )
    with (
        pytest.raises(RuntimeError, match=r"worker process\(es\) \[0, 1\] ended: .*on its own"),
        worker_processes(
            ["0", "0"], command=[sys.executable, "-c", script], log_dir=tmp_path, timeout=300
        ),
    ):
        pass


def test_a_failure_in_the_block_carries_the_workers_logs(tmp_path) -> None:
    command = [sys.executable, "-m", "distributed.cli.dask_worker"]
    with (
        pytest.raises(ValueError, match="in the block") as info,
        worker_processes(["", ""], command=command, args=["--nthreads", "1"], log_dir=tmp_path),
    ):
        raise ValueError("in the block")
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "worker process 0 (running)" in notes and "worker process 1 (running)" in notes
    # logged before the worker registers (its "Registered to" line may come after the join)
    assert notes.count("Start worker at") == 2, notes


def test_stopping_loses_no_key_and_logs_no_error(tmp_path) -> None:
    """The workers stop after the client has gone: the scheduler reports no key of the
    block lost, and no worker logs an error on its way out."""
    command = [sys.executable, "-m", "distributed.cli.dask_worker"]
    with (
        captured_logger("distributed.scheduler", level=logging.WARNING) as scheduler_log,
        worker_processes(
            ["", ""], command=command, args=["--nthreads", "1"], log_dir=tmp_path
        ) as client,
    ):
        held = [client.submit(operator.add, i, 1) for i in range(4)]
        assert client.gather(held) == [1, 2, 3, 4]
    assert "caused the cluster to lose" not in scheduler_log.getvalue()
    for i in (0, 1):
        log = (tmp_path / f"worker-{i}.log").read_text()
        assert " - ERROR - " not in log, log
