"""The small filesystem of the disk-full fault case (scratch_fs), each way it can be
made: writes past its size fail with ENOSPC, as on a full disk, and nothing of it
stays once the context ends."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from scratch_fs import WAYS, Unavailable, small_filesystem

MiB = 1 << 20


@pytest.mark.parametrize("way", WAYS)
def test_writes_past_the_size_fail_as_on_a_full_disk(tmp_path: Path, way: str) -> None:
    where = tmp_path / "small"
    try:
        with small_filesystem(where, "1m", ways=(way,)) as small:
            assert shutil.disk_usage(small).total == MiB
            with pytest.raises(OSError) as info, open(small / "fill", "wb") as f:
                for _ in range(4):
                    f.write(b"x" * MiB)
                    f.flush()
                    os.fsync(f.fileno())
            assert info.value.errno == errno.ENOSPC
            assert shutil.disk_usage(small).free < 64 << 10
    except Unavailable as exc:
        pytest.skip(f"no small filesystem the {way} way here: {exc}")
    assert os.listdir(where) == []  # the filled tmpfs is gone; the directory under it is empty


def test_the_reason_names_each_way_that_failed(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as info, small_filesystem(tmp_path / "small", "no-such-size"):
        pass
    assert str(info.value).startswith("mount: ") and "; namespace: " in str(info.value)
    assert os.listdir(tmp_path / "small") == []
