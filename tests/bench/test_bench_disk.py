"""cudask_bench.disk on CPU, with small files: sequential figures buffered and with
O_DIRECT, a filesystem refusing O_DIRECT, too little space, the reference figures and
the one-line summary; and the per-pass disk I/O beside them in the printed table."""

from __future__ import annotations

import copy
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from cudask_bench import disk
from cudask_bench.measure import summarize
from cudask_bench.report import add_disk_ratios, format_table


def test_a_small_file_is_written_and_read_both_ways_then_removed(tmp_path: Path) -> None:
    result = disk.measure(str(tmp_path), (4 << 20) + 100, block=1 << 20)
    assert result["status"] == "ok" and result["bytes"] == 4 << 20  # whole pages
    assert result["block_bytes"] == 1 << 20 and result["free_bytes"] > 4 << 20
    assert result["filesystem"]["mount"] and result["filesystem"]["type"]
    buffered = result["buffered"]
    assert buffered["write_GBps"] > 0 and buffered["read_GBps"] > 0
    assert buffered["cache_dropped"] in (True, False)
    assert result["direct"]["status"] in ("ok", "refused")
    if result["direct"]["status"] == "ok":
        assert disk.reference(result)["method"] == "direct"
    assert list(tmp_path.iterdir()) == []
    line = disk.summary(result)
    assert "4.00 MiB sequential" in line and "buffered write" in line and "O_DIRECT" in line


def test_a_filesystem_refusing_o_direct_leaves_the_buffered_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    result = disk.measure(str(tmp_path), 1 << 20)
    assert result["status"] == "ok"
    assert result["direct"]["status"] == "refused"
    assert "refuses O_DIRECT: Invalid argument" in result["direct"]["reason"]
    assert disk.reference(result) == {
        "method": "buffered",
        "write_GBps": result["buffered"]["write_GBps"],
        "read_GBps": result["buffered"]["read_GBps"],
    }
    assert "O_DIRECT: the filesystem" in disk.summary(result)
    assert list(tmp_path.iterdir()) == []


def test_too_little_free_space_skips_the_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "MARGIN", 1 << 62)
    result = disk.measure(str(tmp_path), 1 << 20)
    assert result["status"] == "skipped" and "--disk-size" in result["reason"]
    assert disk.reference(result) is None and disk.reference(None) is None
    assert disk.summary(result).startswith("disk not measured: ")
    assert list(tmp_path.iterdir()) == []


def test_the_filesystem_of_the_root() -> None:
    assert disk.filesystem("/")["mount"] == "/"


def _with_traffic(document: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    for v in doc["variants"]:
        for m in v["measurements"].values():
            m["disk_traffic"] = [
                {"written_bytes": 4 * 10**9, "read_bytes": 2 * 10**9} for _ in m["times"]
            ]
            summarize(m)
    return doc


def test_the_table_puts_each_passs_disk_io_beside_the_disks_figures(
    synthetic_document: dict[str, Any],
) -> None:
    doc = _with_traffic(synthetic_document)
    doc["disk"] = {
        "status": "ok",
        "bytes": 8 << 30,
        "filesystem": {"type": "xfs", "mount": "/scratch", "device": "/dev/nvme0n1"},
        "buffered": {"status": "ok", "write_GBps": 3.0, "read_GBps": 5.0},
        "direct": {"status": "ok", "write_GBps": 2.0, "read_GBps": 4.0},
    }
    add_disk_ratios(doc["variants"], disk.reference(doc["disk"]))
    cudask = next(v for v in doc["variants"] if v["name"] == "cudask 4 GiB")
    traffic = cudask["measurements"]["create"]["disk"]
    # 4 GB written in the median 0.9 s: 4.44 GB/s, 2.22x the disk's O_DIRECT 2 GB/s
    assert traffic["write_GBps"] == pytest.approx(4 / 0.9)
    assert traffic["write_vs_disk"] == pytest.approx(4 / 0.9 / 2.0)
    assert traffic["read_vs_disk"] == pytest.approx(2 / 0.9 / 4.0)
    assert traffic["disk_method"] == "direct"
    text = format_table(doc)
    summary = "disk /dev/nvme0n1 (xfs at /scratch), 8.00 GiB sequential: O_DIRECT write 2.00"
    assert summary in text and "(x): of the disk's O_DIRECT figure" in text
    lines = text.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("worker's disk I/O"))
    row = next(line for line in lines[heading:] if line.startswith("create "))
    assert "w 4.00 GB 4.44 GB/s (2.22x), r 2.00 GB 2.22 GB/s (0.56x)" in row
