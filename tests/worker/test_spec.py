from __future__ import annotations

import warnings

import pytest
from distributed import Nanny

from cudask.deploy.local import select_devices
from cudask.devices import discover, parse_visible_devices
from cudask.errors import DeviceError, OptionError
from cudask.options import resolve
from cudask.testing import FakeBackend, fake_gpu
from cudask.worker import plugins as P
from cudask.worker.rmm import RMMSetup
from cudask.worker.sizing import check_devices, device_sizes
from cudask.worker.spec import (
    gpu_name,
    nanny_options,
    parse_ports,
    parse_resources,
    worker_names,
)

GiB = 1 << 30


@pytest.fixture
def dgx():
    return discover(FakeBackend.dgx(8))


def test_one_spec_per_gpu_rotated_and_pinned(dgx):
    o = resolve({"device_memory_limit": 0.5}, "cluster")
    devices = select_devices(dgx, None, None)
    assert len(devices) == 8
    specs = [nanny_options(o, devices, i, n_workers=8, name=gpu_name(devices[i])) for i in range(8)]
    assert specs[3]["env"]["CUDA_VISIBLE_DEVICES"] == "3,4,5,6,7,0,1,2"
    assert specs[3]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's numbering
    assert [s["name"] for s in specs] == list(range(8))
    aff = specs[6]["plugins"][0]
    assert isinstance(aff, P.CPUAffinity) and aff.cpus == tuple(range(64, 128))
    ctx = specs[6]["plugins"][1]
    assert isinstance(ctx, P.CUDAContext) and ctx.expected_uuid == dgx.gpus[6].uuid
    cls, kwargs = specs[0]["data"]
    assert cls.__name__ == "TieredStore"
    assert kwargs["device_memory_limit"] == 40 * GiB


def test_plugin_order_and_names(dgx, monkeypatch):
    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)
    o = resolve(
        {
            "rmm_pool_size": "1GB",
            "pre_import": "json",
            "enable_cudf_spill": True,
            "gc_freeze": True,
        },
        "cluster",
    )
    devices = select_devices(dgx, "0", None)
    names = [p.name for p in nanny_options(o, devices, 0, n_workers=1, name=0)["plugins"]]
    assert names == [
        "cudask-cpu-affinity",
        "cudask-cuda-context",
        "cudask-close-store",
        "cudask-rmm",
        "cudask-pre-import",
        "cudask-cudf-spill",
        "cudask-metrics",
        "cudask-device-ipc",
        "cudask-gc-freeze",
    ]
    o = resolve({}, "cluster")  # gc_freeze is off by default
    names = [p.name for p in nanny_options(o, devices, 0, n_workers=1, name=0)["plugins"]]
    assert "cudask-gc-freeze" not in names


def test_device_ipc_serializers_and_plugin(dgx, monkeypatch):
    """Workers send device arrays by CUDA IPC unless told not to or under UCX
    (whose cuda_ipc transport does it, with its own serializers)."""
    import dask

    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)  # distributed-ucxx "installed"
    devices = select_devices(dgx, "0", None)
    spec = nanny_options(resolve({}, "cluster"), devices, 0, n_workers=1, name=0)
    assert spec["serializers"] == spec["deserializers"] == ["dask", "pickle", "error", "cudask-ipc"]
    from cudask.worker.gpu_worker import GPUWorker

    assert spec["worker_class"] is GPUWorker
    (ipc_plugin,) = [p for p in spec["plugins"] if p.name == "cudask-device-ipc"]
    assert ipc_plugin.device_uuid == dgx.gpus[0].uuid and ipc_plugin.min_size == 1 << 20
    assert ipc_plugin.map_ahead  # cudask.comm.map-ahead's default
    for opts, cfg in (({}, {"cudask.comm.device-ipc": False}), ({"protocol": "ucx"}, {})):
        with dask.config.set(cfg):
            spec = nanny_options(resolve(opts, "cluster"), devices, 0, n_workers=1, name=0)
        assert "serializers" not in spec and spec["worker_class"] is GPUWorker  # IPC off
        assert not [p for p in spec["plugins"] if p.name == "cudask-device-ipc"]
    with dask.config.set({"cudask.comm.device-ipc-min-size": "64KiB"}):
        spec = nanny_options(resolve({}, "cluster"), devices, 0, n_workers=1, name=0)
    assert [p.min_size for p in spec["plugins"] if p.name == "cudask-device-ipc"] == [65536]
    with dask.config.set({"cudask.comm.map-ahead": False}):
        spec = nanny_options(resolve({}, "cluster"), devices, 0, n_workers=1, name=0)
    assert [p.map_ahead for p in spec["plugins"] if p.name == "cudask-device-ipc"] == [False]
    assert ipc_plugin.staging == 1 << 30  # cudask.comm.device-ipc-staging's default, without a pool
    with dask.config.set({"cudask.comm.device-ipc-staging": 0}):
        spec = nanny_options(resolve({}, "cluster"), devices, 0, n_workers=1, name=0)
    assert [p.staging for p in spec["plugins"] if p.name == "cudask-device-ipc"] == [0]
    spec = nanny_options(
        resolve({"rmm_pool_size": "1GB"}, "cluster"), devices, 0, n_workers=1, name=0
    )
    assert [p.staging for p in spec["plugins"] if p.name == "cudask-device-ipc"] == [
        0
    ]  # slabs instead
    spec = nanny_options(
        resolve({"workers_per_gpu": 4}, "cluster"), devices, 0, n_workers=4, name=0
    )
    assert {p.staging for p in spec["plugins"] if p.name == "cudask-device-ipc"} == {
        1 << 28
    }  # a share
    with (
        dask.config.set({"cudask.comm.device-ipc-staging": "100TiB"}),
        pytest.raises(
            OptionError,
            match=r"cudask.comm.device-ipc-staging='100TiB' \(.*\) is more "
            r"than the memory of",
        ),
    ):
        check_devices(resolve({}, "cluster"), devices)
    for unexportable in (
        {"rmm_async": True},
        {"rmm_managed_memory": True},
    ):  # a pool CUDA cannot export
        with warnings.catch_warnings():  # (the async pool's FutureWarning: not what is tested)
            warnings.simplefilter("ignore", FutureWarning)
            o = resolve({"rmm_pool_size": "1GB", **unexportable}, "cluster")
        spec = nanny_options(o, devices, 0, n_workers=1, name=0)
        assert [p.staging for p in spec["plugins"] if p.name == "cudask-device-ipc"] == [1 << 30]
    for bad in ("banana", -1, "1 parsec", True):
        with (
            dask.config.set({"cudask.comm.device-ipc-min-size": bad}),
            pytest.raises(OptionError, match=r"cudask.comm.device-ipc-min-size=.*is not a size"),
        ):
            nanny_options(resolve({}, "cluster"), devices, 0, n_workers=1, name=0)


def test_no_rmm_plugin_without_rmm_options(dgx):
    o = resolve({}, "cluster")
    devices = select_devices(dgx, "0", None)
    plugins = nanny_options(o, devices, 0, n_workers=1, name=0)["plugins"]
    assert not any(isinstance(p, RMMSetup) for p in plugins)


def test_visible_subset_and_n_workers(dgx):
    assert [d.gpu.index for d in select_devices(dgx, "5,2", None)] == [5, 2]
    assert len(select_devices(dgx, [0, 1, 2], 2)) == 3
    with pytest.raises(OptionError, match="more than the 2 visible"):
        select_devices(dgx, "0,1", 3)
    with pytest.raises(OptionError, match="at least 1"):
        select_devices(dgx, "0,1", 0)
    with pytest.raises(DeviceError, match="'9'"):
        select_devices(dgx, "0,9", None)


def test_sizes_per_device():
    m = discover(
        FakeBackend(
            [
                fake_gpu(0, memory_total=80 * GiB, cpus=[0]),
                fake_gpu(1, memory_total=16 * GiB, cpus=[0]),
            ]
        )
    )
    d = parse_visible_devices(None, m)
    from cudask import options

    real = options._library
    try:
        options._library = lambda mod: True
        o = resolve({"device_memory_limit": "default", "rmm_pool_size": 0.5}, "cluster")
    finally:
        options._library = real
    s0, s1 = device_sizes(o, d[0]), device_sizes(o, d[1])
    assert s0.device_memory_limit == int(80 * GiB * 0.8)
    assert s1.device_memory_limit == int(16 * GiB * 0.8)
    assert s1.rmm_pool_size == 8 * GiB and s1.rmm_pool_size % 256 == 0
    big = resolve({"device_memory_limit": "40GB"}, "cluster")
    with pytest.raises(OptionError, match="more than the 16.00 GiB available"):
        device_sizes(big, d[1])
    off = resolve({"device_memory_limit": 0}, "cluster")
    assert device_sizes(off, d[0]).device_memory_limit is None


def test_a_pool_larger_than_the_limit_warns_once():
    from cudask import options
    from cudask.errors import DeviceMemoryLimitWarning
    from cudask.worker.sizing import warn_pool_past_limit

    m = discover(FakeBackend([fake_gpu(i, memory_total=80 * GiB, cpus=[0]) for i in range(2)]))
    d = parse_visible_devices(None, m)
    real = options._library
    try:
        options._library = lambda mod: True
        over = resolve({"device_memory_limit": "20GB", "rmm_pool_size": 0.5}, "cluster")
        under = resolve({"device_memory_limit": "20GB", "rmm_pool_size": "16GB"}, "cluster")
    finally:
        options._library = real
    with pytest.warns(
        DeviceMemoryLimitWarning, match="rmm_pool_size=0.5 reserves 40.00 GiB"
    ) as got:
        warn_pool_past_limit(over, [device_sizes(over, x) for x in d])
    assert len(got) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_pool_past_limit(under, [device_sizes(under, x) for x in d])


def test_soc_without_dedicated_memory():
    m = discover(FakeBackend([fake_gpu(0, memory_total=None, cpus=[0])]))
    d = parse_visible_devices(None, m)
    assert device_sizes(resolve({}, "cluster"), d[0]).device_memory_limit is None
    with pytest.raises(OptionError, match="no dedicated memory"):
        device_sizes(resolve({"device_memory_limit": "1GB"}, "cluster"), d[0])


def test_all_limits_off_is_a_plain_dict(dgx):
    o = resolve({"device_memory_limit": None, "memory_limit": 0}, "cluster")
    devices = select_devices(dgx, "0", None)
    assert nanny_options(o, devices, 0, n_workers=1, name=0)["data"] is dict


def test_ports_resources_names():
    assert parse_ports("9000:9003", 4) == [9000, 9001, 9002, 9003]
    assert parse_ports(None, 2) == [None, None]
    assert parse_ports("9000", 1) == [9000]
    with pytest.raises(OptionError, match="Not enough ports .* for 2 GPUs: .* gives 1"):
        parse_ports("9000", 2)
    with pytest.raises(OptionError, match="not accepted"):
        parse_ports("nine", 1)
    assert parse_resources("GPU=1 MEM=10e9") == {"GPU": 1.0, "MEM": 1e10}
    with pytest.raises(OptionError, match="NAME=AMOUNT"):
        parse_resources("GPU")
    fake = [object(), object()]
    assert worker_names("w", fake[:1]) == ["w"]
    assert worker_names("w", fake) == ["w-0", "w-1"]
    assert worker_names(None, fake) == [None, None]


def test_ucx_config_reaches_nanny(dgx, monkeypatch):
    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)
    o = resolve({"enable_nvlink": True, "enable_tcp_over_ucx": True}, "cluster")
    devices = select_devices(dgx, "0", None)
    spec = nanny_options(o, devices, 0, n_workers=1, name=0)
    assert spec["protocol"] == "ucx"
    ucx = spec["config"]
    for ns in ("distributed-ucxx", "distributed.comm.ucx"):  # current and legacy names
        assert ucx[f"{ns}.nvlink"] is True and ucx[f"{ns}.tcp"] is True
        assert ucx[f"{ns}.infiniband"] is None
    assert Nanny  # the spec is for a Nanny


def _config_seen_by_the_worker() -> tuple[object, object, object]:
    import dask.config

    return (
        dask.config.get("distributed-ucxx.nvlink"),
        dask.config.get("distributed.comm.ucx.tcp"),
        dask.config.get("distributed.admin.event-loop"),
    )


def test_ucx_config_keeps_the_rest_of_the_worker_config(dgx, monkeypatch):
    """The Nanny hands its config to the worker process: ours must add to
    distributed's settings, not replace them (a nested dict did, and the worker
    process died looking for distributed.admin)."""
    from distributed import Client, LocalCluster

    from cudask import options

    monkeypatch.setattr(options, "_library", lambda m: True)
    o = resolve({"enable_nvlink": True, "enable_tcp_over_ucx": True}, "cluster")
    config = nanny_options(o, select_devices(dgx, "0", None), 0, n_workers=1, name=0)["config"]
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", config=config
        ) as cluster,
        Client(cluster) as client,
    ):
        (seen,) = client.run(_config_seen_by_the_worker).values()
    assert seen[0] is True and seen[1] is True and seen[2]


def test_worker_class_from_an_import_path():
    from distributed import Worker

    from cudask.worker.spec import worker_class

    assert worker_class("distributed.Worker") is Worker
    assert worker_class("distributed.Nanny") is Nanny  # dask-cuda accepts a Nanny too
    with pytest.raises(OptionError, match="cannot be imported"):
        worker_class("distributed.NoSuchWorker")
    with pytest.raises(OptionError, match="not a subclass"):
        worker_class("distributed.Scheduler")


def test_a_nanny_class_replaces_the_nanny(dgx):
    from cudask.testing.workers import TaggedNanny, TaggedWorker
    from cudask.worker.spec import CUDANanny, nanny_class

    devices = select_devices(dgx, "0", None)
    o = resolve({"worker_class": "cudask.testing.workers.TaggedNanny"}, "worker")
    assert nanny_class(o) is TaggedNanny
    spec = nanny_options(o, devices, 0, n_workers=1, name="n")
    assert "worker_class" not in spec and "close_timeout" not in spec  # its own close
    o = resolve({"worker_class": TaggedWorker}, "worker")
    assert nanny_class(o) is CUDANanny and issubclass(CUDANanny, Nanny)
    spec = nanny_options(o, devices, 0, n_workers=1, name="n")
    assert spec["worker_class"] is TaggedWorker
    assert spec["close_timeout"] == 60.0  # cudask's Nanny takes the close_timeout option


def test_host_tier_sized_like_distributeds_spill_buffer(dgx):
    import dask.config

    from cudask.worker.spec import host_tier

    devices = select_devices(dgx, "0", None)
    o = resolve({"memory_limit": "10GB", "device_memory_limit": "1GB"}, "cluster")
    _, kwargs = nanny_options(o, devices, 0, n_workers=1, name=0)["data"]
    assert kwargs["memory_limit"] == 6 * 10**9  # distributed.worker.memory.target: 0.6
    assert kwargs["max_spill"] is False
    with dask.config.set(
        {
            "distributed.worker.memory.target": False,
            "distributed.worker.memory.spill": 0.7,
            "distributed.worker.memory.max-spill": "1GB",
        }
    ):
        assert host_tier(10**10) == (7 * 10**9, 10**9)
    assert host_tier(None) == (None, False)


def test_jit_unspill_gets_the_proxy_store(dgx):
    o = resolve({"jit_unspill": True, "device_memory_limit": None, "memory_limit": 0}, "cluster")
    devices = select_devices(dgx, "0", None)
    cls, kwargs = nanny_options(o, devices, 0, n_workers=1, name=0)["data"]
    assert cls.__name__ == "ProxyStore" and kwargs["device_memory_limit"] is None


def test_spilling_without_cupy_is_refused_before_start(dgx, monkeypatch):
    from cudask import options
    from cudask.errors import MissingDependencyError
    from cudask.worker.sizing import check_devices

    devices = select_devices(dgx, "0,1", None)
    real = options._library
    monkeypatch.setattr(options, "_library", lambda m: False if m == "cupy" else real(m))
    with pytest.raises(
        MissingDependencyError, match="device_memory_limit='4GB'.*needs cupy.*=None"
    ):
        check_devices(resolve({"device_memory_limit": "4GB"}, "cluster"), devices)
    with pytest.raises(MissingDependencyError, match="jit_unspill"):
        check_devices(
            resolve({"jit_unspill": True, "device_memory_limit": None}, "cluster"), devices
        )
    sizes = check_devices(resolve({"device_memory_limit": None}, "cluster"), devices)
    assert [s.device_memory_limit for s in sizes] == [None, None]


def test_device_order_from_the_environment_is_kept(dgx, monkeypatch):
    from cudask.worker.spec import worker_env

    devices = select_devices(dgx, "0,1", None)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert worker_env(devices, 1) == {"CUDA_VISIBLE_DEVICES": "1,0"}
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    assert worker_env(devices, 1)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_no_nanny_gets_the_resolved_worker_class(dgx):
    import dask

    from cudask.testing.workers import TaggedWorker
    from cudask.worker.gpu_worker import GPUWorker
    from cudask.worker.spec import worker_options

    devices = select_devices(dgx, "2", None)
    for given, ipc, expected in (
        ("cudask.testing.workers.TaggedWorker", True, TaggedWorker),
        (None, True, GPUWorker),
        (None, False, GPUWorker),
    ):
        o = resolve({"worker_class": given}, "worker")
        with dask.config.set({"cudask.comm.device-ipc": ipc}):
            cls, opts, env = worker_options(nanny_options(o, devices, 0, n_workers=1, name="w"))
        assert cls is expected
        assert "worker_class" not in opts and "env" not in opts
        assert env["CUDA_VISIBLE_DEVICES"] == "2"


def test_bad_memory_config_fails_while_building_the_spec(dgx):
    import dask

    o = resolve({"device_memory_limit": 0.5}, "cluster")
    devices = select_devices(dgx, "0", None)
    with (
        dask.config.set({"cudask.memory.pinned-release-after": "whenever"}),
        pytest.raises(OptionError, match="pinned-release-after='whenever'"),
    ):
        nanny_options(o, devices, 0, n_workers=1, name=0)
