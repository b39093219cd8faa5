"""cudask.testing.integrity: digests tell values apart byte for byte (host arrays
on CPU; device arrays' fingerprints on a GPU), and check_keys sorts keys into
identical, lost and changed, waiting through the recompute of a result lost with
a killed worker (`settle`)."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from cudask.testing.integrity import KINDS, Check, check_keys, digest, make_value, settle


def test_host_digests_differ_by_one_byte_dtype_shape_and_order() -> None:
    a = make_value(1, 4096, "host")
    assert digest(a) == digest(make_value(1, 4096, "host")) == digest(a.copy())
    b = a.copy()
    b[1234] ^= 1
    assert digest(b) != digest(a)
    assert digest(a.view("i1")) != digest(a)
    assert digest(a.reshape(64, 64)) != digest(a)
    assert digest(a.reshape(64, 64).T) == digest(np.ascontiguousarray(a.reshape(64, 64).T))
    assert digest({"x": a, "y": 1}) == digest({"y": 1, "x": a.copy()})
    assert digest([a, b]) != digest([b, a])
    with pytest.raises(ValueError, match="kind='bad' is not one of"):
        make_value(0, 10, "bad")


def test_check_counts() -> None:
    check = Check(identical=["a"], lost={"b": "KilledWorker: ..."}, changed=[])
    assert check.checked == 2 and not check.ok
    assert Check(identical=["a", "b"]).ok


@pytest.mark.gpu
def test_device_fingerprints_catch_one_flipped_bit_and_swapped_words() -> None:
    cupy = pytest.importorskip("cupy")
    values: dict[str, Any] = {k: make_value(7, 3 * (1 << 20) + 5, k) for k in KINDS}
    again = {k: make_value(7, 3 * (1 << 20) + 5, k) for k in KINDS}
    for k in KINDS:
        assert digest(values[k]) == digest(again[k]), k
    x = make_value(8, (1 << 27) + (1 << 20) + 5, "i1")  # two steps of words and a tail
    flipped = x.copy()
    flipped[-1] ^= 1  # in the trailing bytes
    assert digest(flipped) != digest(x)
    flipped = x.copy()
    flipped[(1 << 24) * 8 + 3] ^= 64  # in the second step of words
    assert digest(flipped) != digest(x)
    w = x[: x.size // 8 * 8].view(cupy.uint64)
    swapped = w.copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    assert bool((swapped != w).any()) and digest(swapped) != digest(w)
    assert digest(cupy.asnumpy(values["f8"])) != digest(values["f8"].astype("f4"))


def _fail() -> None:
    raise ZeroDivisionError("on purpose\nsecond line")


@pytest.mark.timeout(300)
def test_check_keys_and_settle_on_a_cpu_cluster() -> None:
    from distributed import Client, Event, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert settle(client.submit(_fail)) == (None, "ZeroDivisionError: on purpose")
        never = Event()
        blocked = client.submit(never.wait)
        blocked.cancel()
        assert settle(blocked)[1].startswith("FutureCancelledError")
        same, other = (client.submit(make_value, i, 4096, "host") for i in (1, 2))
        want = {
            same: digest(make_value(1, 4096, "host")),
            other: digest(make_value(3, 4096, "host")),
        }
        check = check_keys(client, want)
        assert (check.identical, check.changed, check.lost) == ([same.key], [other.key], {})
        # kill the only worker: both results are recomputed once its nanny restarts it,
        # and check_keys waits for that instead of calling them lost
        (pid,) = client.run(os.getpid).values()
        os.kill(pid, signal.SIGKILL)
        check = check_keys(client, want)
        assert (check.identical, check.changed, check.lost) == ([same.key], [other.key], {})
