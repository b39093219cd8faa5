"""`cudask bench transfer` pieces on CPU: which settings run and how their workers
start (dask-cuda's through its CLI module and a PYTHONPATH shim), and the figures read
from a worker's store (cudask's metrics, or dask-cuda's zict buffers)."""

from __future__ import annotations

from pathlib import Path


def test_transfer_settings_and_dask_cuda_workers(tmp_path: Path) -> None:
    """Which settings run, and how dask-cuda's workers are started: its CLI module
    with dask-cuda's directory (and, for another interpreter, cudask alone) on
    PYTHONPATH."""
    import sys

    from cudask_bench.transfer import Setting, settings, worker_launch

    dc = Setting("dask-cuda", "dask-cuda", "tcp", pythonpath=(str(tmp_path),))
    names = [s.name for s in settings(("tcp", "ucx"), dc)]
    assert names == [
        "cudask-ipc",
        "cudask-ipc-no-staging",
        "cudask-ipc-gc-freeze",
        "cudask-ipc-spill-ahead",
        "cudask-ipc-no-on-demand",
        "cudask-tcp",
        "cudask-ucx",
        "dask-cuda-tcp",
        "dask-cuda-ucx",
    ]
    assert [s.name for s in settings(("tcp",), None)] == [
        "cudask-ipc",
        "cudask-ipc-no-staging",
        "cudask-ipc-gc-freeze",
        "cudask-ipc-spill-ahead",
        "cudask-ipc-no-on-demand",
        "cudask-tcp",
    ]
    ipc, unstaged, frozen, ahead, unhooked, tcp = settings(("tcp",), None)
    with worker_launch(ipc) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True"})
    for setting, (variable, value) in (
        (unstaged, ("DASK_CUDASK__COMM__DEVICE_IPC_STAGING", "0")),
        (frozen, ("DASK_CUDASK__WORKER__GC_FREEZE", "True")),
        (ahead, ("DASK_CUDASK__MEMORY__SPILL_TARGET", "0.9")),
        (unhooked, ("DASK_CUDASK__MEMORY__SPILL_ON_DEMAND", "False")),
    ):
        with worker_launch(setting) as launch:
            assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True", variable: value}), (
                setting
            )
    with worker_launch(tcp) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "False"})
    with worker_launch(settings(("tcp",), dc)[-1]) as (command, env):
        assert command == [sys.executable, "-m", "dask_cuda.cli"]
        assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    other = Setting("dask-cuda-tcp", "dask-cuda", "tcp", python="/usr/bin/python3")
    with worker_launch(other) as (command, env):
        assert command[0] == "/usr/bin/python3"
        shim = Path(env["PYTHONPATH"].split(":")[0])
        assert (shim / "cudask").is_symlink()
    assert not shim.exists()  # the shim lasts as long as the workers


def test_transfer_reports_the_store_figures() -> None:
    from types import SimpleNamespace

    from cudask_bench.counters import store_figures

    class Store(dict):
        def metrics(self) -> dict[str, float]:
            return {
                "device-bytes": 5.0,
                "pinned-provision-bytes": 8.0,
                "pinned-provision-seconds": 0.5,
                "spill-device-to-host-bytes": 0.0,
                "unspill-host-to-device-count": 2.0,
            }

    assert store_figures(SimpleNamespace(data=Store())) == {
        "pinned-provision-bytes": 8.0,
        "pinned-provision-seconds": 0.5,
        "unspill-host-to-device-count": 2.0,
    }
    assert store_figures(SimpleNamespace(data={})) == {}  # dask-cuda's or a plain store


def test_a_zict_device_buffer_s_spills_are_counted() -> None:
    """dask-cuda's DeviceHostFile keeps the device tier in a zict Buffer
    (`device_buffer`): once watched, what it moves to host shows in the store figures."""
    from types import SimpleNamespace

    import zict

    from cudask_bench.counters import store_figures, watch_spills

    buffer: zict.Buffer[str, bytes] = zict.Buffer({}, {}, n=10, weight=lambda k, v: len(v))
    worker = SimpleNamespace(data=SimpleNamespace(device_buffer=buffer))
    assert store_figures(worker) == {}
    assert watch_spills(worker) and not watch_spills(worker)  # once per store
    buffer["a"] = b"x" * 8
    assert store_figures(worker) == {}  # nothing spilled yet
    buffer["b"] = b"y" * 8  # past n: "a" goes to the slow mapping
    figures = store_figures(worker)
    assert figures["spill-device-to-host-count"] == 1.0
    assert figures["spill-device-to-host-bytes"] > 0
    assert not watch_spills(SimpleNamespace(data={}))  # a plain store: nothing to watch


def test_what_a_store_holds_is_read_from_cudask_s_metrics_or_dask_cuda_s_buffers() -> None:
    """`held_figures`: device and host bytes from cudask's store metrics, or from the
    weights of a zict Buffer over the device (dask-cuda's DeviceHostFile), with the spill
    figures; nothing for a plain store."""
    from types import SimpleNamespace

    import zict

    from cudask_bench.counters import held_figures, watch_spills

    metrics = {
        "device-bytes": 3e9,
        "host-bytes": 1.6e9,
        "device-keys": 2.0,
        "spill-device-to-host-bytes": 1.6e9,
    }
    cudask_like = SimpleNamespace(data=SimpleNamespace(metrics=lambda: metrics))
    assert held_figures(cudask_like) == {
        "device-bytes": 3e9,
        "host-bytes": 1.6e9,
        "spill-device-to-host-bytes": 1.6e9,
    }
    host: zict.Buffer[str, bytes] = zict.Buffer({}, {}, n=100, weight=lambda k, v: len(v))
    device: zict.Buffer[str, bytes] = zict.Buffer({}, host, n=10, weight=lambda k, v: len(v))
    dask_cuda_like = SimpleNamespace(data=SimpleNamespace(device_buffer=device, host_buffer=host))
    assert watch_spills(dask_cuda_like)
    device["a"] = b"x" * 8
    assert held_figures(dask_cuda_like) == {"device-bytes": 8.0, "host-bytes": 0.0}
    device["b"] = b"y" * 8  # past n: "a" goes to the host buffer
    figures = held_figures(dask_cuda_like)
    assert figures["device-bytes"] == 8.0 and figures["host-bytes"] == 8.0
    assert figures["spill-device-to-host-count"] == 1.0
    assert held_figures(SimpleNamespace(data={})) == {}
