"""Closing on CPU: worker processes as cudask starts them, each on the fake-device
store: a worker holding many keys on disk closes without an exception and leaves no
file; a close longer than distributed's 4 s is waited for, not killed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from clean_end import (
    LogWatch,
    SlowTeardown,
    check_clean,
    cpu_cluster,
    disk_keys,
    leftovers,
    make,
)
from distributed import Client, wait

CHUNK = 256 << 10


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
            memory_limit=None,
            close_timeout=close_timeout,
            plugins=(SlowTeardown(6.0, os.fspath(marker)),),
        ) as cluster,
        Client(cluster) as client,
    ):
        client.gather(client.map(make, range(4), n=CHUNK))
    assert marker.exists() is not killed
    assert ("Worker process still alive after 4.0 seconds, killing" in parent.text) is killed
