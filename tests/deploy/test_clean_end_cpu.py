"""A clean end on CPU: worker processes as cudask starts them, each on the fake-device
store, run a workload and close with no ERROR line and no traceback in any process's
log, with and without a disk tier, with the default store and with JIT-unspill; a
worker holding many keys on disk closes without an exception and leaves no file; a
close longer than distributed's 4 s is waited for, not killed."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from clean_end import (
    LOG_ENV,
    LogWatch,
    SlowTeardown,
    check_clean,
    combine,
    cpu_cluster,
    disk_keys,
    holds,
    leftovers,
    log_error,
    make,
    remote_logs,
    store_keys,
    total,
)
from distributed import Client, wait

from cudask.testing import wait_for

CHUNK = 256 << 10


def _workload(client: Client, chunks: int, *, on_disk: bool) -> list[object]:
    """Chunks past the device limit (and the host's, `on_disk`), read back and checked,
    combined in pairs and summed; half released. Returns the futures still held."""
    futures = client.map(make, range(chunks), n=CHUNK, key=[f"chunk-{i}" for i in range(chunks)])
    assert all(client.gather(client.map(holds, futures, range(chunks))))
    spilled = sum(client.run(disk_keys).values())
    assert (spilled > 0) == on_disk, spilled
    pairs = client.map(combine, futures[0::2], futures[1::2])
    sums = client.gather(client.map(total, pairs))
    assert sums == [CHUNK * ((i % 251 + (i + 1) % 251) % 256) for i in range(0, chunks, 2)]
    held = futures[: chunks // 2]
    del futures, pairs
    assert wait_for(lambda: sum(client.run(store_keys).values()) == len(held), timeout=120)
    return held


@pytest.mark.timeout(600)
@pytest.mark.parametrize("jit_unspill, on_disk", list(itertools.product([False, True], repeat=2)))
def test_a_workload_and_its_close_log_no_error(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    jit_unspill: bool,
    on_disk: bool,
) -> None:
    for name, value in LOG_ENV.items():
        monkeypatch.setenv(name, value)
    with (
        LogWatch().watching() as parent,
        cpu_cluster(
            tmp_path,
            device_memory_limit=2 << 20,
            memory_limit=(4 << 20) if on_disk else None,
            jit_unspill=jit_unspill,
            n_workers=2,
        ) as cluster,
        Client(cluster) as client,
    ):
        held = _workload(client, 64, on_disk=on_disk)
        remote = remote_logs(client)
        assert held  # held at the close: the client's close releases them
    out, err = capfd.readouterr()
    check_clean({"test process": parent.text, **remote, "worker processes (stderr)": out + err})
    assert "Worker process still alive" not in parent.text
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(600)
def test_a_worker_holding_many_keys_on_disk_closes_and_leaves_no_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """400 keys, most of them on disk, held by the client when the cluster closes: the
    store's close removes their files while the nanny waits; nothing is left."""
    with (
        LogWatch().watching() as parent,
        cpu_cluster(tmp_path, device_memory_limit=4 << 20, memory_limit=8 << 20) as cluster,
        Client(cluster) as client,
    ):
        futures = client.map(make, range(400), n=CHUNK)
        wait(futures)
        assert sum(client.run(disk_keys).values()) > 300
        files = [p for p in tmp_path.rglob("*") if p.is_file() and "storage" in p.parts]
        assert len(files) > 300
        cluster.close()  # with the futures still held
    out, err = capfd.readouterr()
    assert "Worker process still alive" not in parent.text, parent.text
    check_clean({"test process": parent.text, "worker processes (stderr)": out + err})
    assert leftovers(tmp_path) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("close_timeout, killed", [(60.0, False), (5.0, True)])
def test_a_worker_gets_close_timeout_to_close(
    tmp_path: Path, close_timeout: float, killed: bool
) -> None:
    """A worker whose close takes 6 s: cudask's default gives it 48 s and it ends on its
    own; distributed's 5 s kill it at 4 s."""
    marker = tmp_path / "closed"
    with (
        LogWatch().watching() as parent,
        cpu_cluster(
            tmp_path / "work",
            device_memory_limit=4 << 20,
            memory_limit=8 << 20,
            close_timeout=close_timeout,
            plugins=(SlowTeardown(6.0, os.fspath(marker)),),
        ) as cluster,
        Client(cluster) as client,
    ):
        held = client.map(make, range(48), n=CHUNK)
        wait(held)
        assert sum(client.run(disk_keys).values()) > 0
    assert marker.exists() is not killed
    if not killed:  # a long close that ends on its own logs no heartbeat ERROR
        check_clean({"test process": parent.text})
    assert ("Worker process still alive after 4.0 seconds, killing" in parent.text) is killed


@pytest.mark.timeout(300)
def test_the_check_names_an_error_a_worker_process_logged(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture reaches the worker processes' cudask loggers, level names and
    tracebacks included, and the check names the line."""
    for name, value in LOG_ENV.items():
        monkeypatch.setenv(name, value)
    with (
        cpu_cluster(tmp_path, device_memory_limit=4 << 20, memory_limit=None) as cluster,
        Client(cluster) as client,
    ):
        client.run(log_error, "seen by the check")
    out, err = capfd.readouterr()
    with pytest.raises(
        AssertionError,
        match=r"(?s)worker processes \(stderr\): .*cudask\.memory "
        r"- ERROR - cudask: seen by the check.*Traceback",
    ):
        check_clean({"worker processes (stderr)": out + err})
