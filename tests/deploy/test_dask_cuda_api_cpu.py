"""dask-cuda's cluster API on fake machines (CPU): CUDA_VISIBLE_DEVICES from the
environment, UUIDs kept as given, worker_spec, CUDAWorker given a Cluster, and the
address rules with dask-cuda's words, all before any process starts."""

from __future__ import annotations

import pytest

from cudask import CUDAWorker
from cudask.deploy import local, node
from cudask.devices import discover
from cudask.errors import OptionError, ProtocolMismatchError
from cudask.testing import FakeBackend, fake_gpu
from cudask.worker_spec import worker_spec


@pytest.fixture
def four(monkeypatch):
    """Four fake GPUs where NVML would be, for the cluster and the node."""
    machine = discover(FakeBackend([fake_gpu(i, cpus=[i]) for i in range(4)], cpus=set(range(4))))
    monkeypatch.setattr(local, "discover", lambda: machine)
    monkeypatch.setattr(node, "discover", lambda: machine)
    return machine


def _visible(spec):
    return {name: s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for name, s in spec.items()}


def test_the_environment_chooses_the_gpus_in_its_order(four, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert local.visible_devices(None) == ("2,0", "environment variable CUDA_VISIBLE_DEVICES")
    assert _visible(worker_spec(device_memory_limit=None)) == {2: "2,0", 0: "0,2"}


def test_the_keyword_beats_the_environment(four, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert _visible(worker_spec(CUDA_VISIBLE_DEVICES="3", device_memory_limit=None)) == {3: "3"}


def test_every_gpu_without_either(four, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert list(worker_spec(device_memory_limit=None)) == [0, 1, 2, 3]


def test_uuids_are_kept_as_given(four, monkeypatch):
    """A UUID (or a prefix of one) reaches the workers as the GPU's full UUID, not as an
    index: CUDA's order and NVML's may differ, and MIG instances have none."""
    uuid1, uuid3 = four.gpus[1].uuid, four.gpus[3].uuid
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{uuid3},{uuid1[:12]},0")
    seen = _visible(worker_spec(device_memory_limit=None))
    assert seen == {3: f"{uuid3},{uuid1},0", 1: f"{uuid1},0,{uuid3}", 0: f"0,{uuid3},{uuid1}"}


def test_the_close_timeout_goes_to_cudasks_nanny_only(four, monkeypatch):
    """cudask's Nanny takes close_timeout; distributed's (dask-cuda's cls) would hand an
    unknown keyword on to its Worker."""
    from distributed import Nanny

    from cudask.worker.closing import Nanny as CUDANanny

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (ours, *_) = worker_spec(device_memory_limit=None, close_timeout="2 minutes").values()
    assert ours["cls"] is CUDANanny and ours["options"]["close_timeout"] == 120.0
    (theirs, *_) = worker_spec(device_memory_limit=None, cls=Nanny).values()
    assert theirs["cls"] is Nanny and "close_timeout" not in theirs["options"]


def test_a_bad_environment_value_names_the_variable(four, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,,1")
    with pytest.raises(OptionError, match="^environment variable CUDA_VISIBLE_DEVICES: "):
        worker_spec(device_memory_limit=None)


def test_worker_spec_options(four):
    spec = worker_spec(
        CUDA_VISIBLE_DEVICES=[0, 1],
        interface="lo",
        protocol="tcp",
        dashboard_address=":0",
        threads_per_worker=4,
        silence_logs=False,
        device_memory_limit=None,
    )
    assert len(spec) == 2
    for s in spec.values():
        o = s["options"]
        assert (
            o["interface"],
            o["protocol"],
            o["dashboard_address"],
            o["nthreads"],
            o["silence_logs"],
        ) == ("lo", "tcp", ":0", 4, False)


@pytest.mark.parametrize("transport", ["enable_infiniband", "enable_nvlink"])
@pytest.mark.parametrize("protocol", [None, "tcp"])
def test_a_ucx_transport_without_ucx_is_a_type_error(transport, protocol):
    """Refused before any GPU is looked for (no fake machine here)."""
    with pytest.raises(TypeError, match="Enabling InfiniBand or NVLink requires protocol='ucx'"):
        worker_spec(protocol=protocol, **{transport: True})


def test_a_cluster_rejects_tcp_with_a_ucx_transport_as_a_type_error():
    from cudask import LocalCUDACluster

    with pytest.raises(ProtocolMismatchError, match="needs protocol='ucx'"):
        LocalCUDACluster(protocol="tcp", enable_tcp_over_ucx=True)


def test_cuda_worker_takes_a_cluster(four, monkeypatch):
    from distributed import LocalCluster

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster:
        worker = CUDAWorker(cluster, device_memory_limit=None)
        assert worker.scheduler == cluster.scheduler_address
        assert len(worker.nannies) == 1


@pytest.mark.parametrize(
    "visible, kwargs, match",
    [
        (
            "0",
            {"host": "127.0.0.1", "listen_address": "tcp://0.0.0.0:9000"},
            "Cannot specify listen_address when host or interface is given",
        ),
        (
            "0",
            {"interface": "lo", "listen_address": "tcp://0.0.0.0:9000"},
            "Cannot specify listen_address when host or interface is given",
        ),
        (
            "0",
            {"contact_address": "tcp://127.0.0.1:9000"},
            "Must specify listen_address when contact_address is provided",
        ),
        (
            "0,1",
            {"listen_address": "tcp://0.0.0.0:9000"},
            "Cannot specify listen_address or contact_address when using multiple GPUs",
        ),
        (
            "0,1",
            {"listen_address": "tcp://0.0.0.0:9000", "contact_address": "tcp://127.0.0.1:9000"},
            "Cannot specify listen_address or contact_address when using multiple GPUs",
        ),
        (
            "0",
            {"worker_port": "9000", "listen_address": "tcp://0.0.0.0:9000"},
            "Cannot specify worker_port when listen_address is given",
        ),
        (
            "0,1,2",
            {"worker_port": "9000:9001"},
            "Not enough ports in --worker-port range for 3 GPUs",
        ),
    ],
)
def test_address_rules_before_any_gpu_is_looked_for(monkeypatch, visible, kwargs, match):
    """No fake machine: these are judged from the options and CUDA_VISIBLE_DEVICES alone."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(ValueError, match=match):
        CUDAWorker(scheduler="tcp://127.0.0.1:8786", **kwargs)


def test_worker_config_reports_plugins_limits_and_protocol():
    from types import SimpleNamespace

    from cudask.deploy.inspection import get_worker_config
    from cudask.worker.rmm import RMMSetup

    rmm = RMMSetup(
        pool_size=2_000_000_000,
        maximum_pool_size=3_000_000_000,
        managed_memory=False,
        async_alloc=False,
        release_threshold=None,
        log_directory=None,
        track_allocations=False,
    )
    worker = SimpleNamespace(
        plugins={"cudask-rmm": rmm},
        memory_manager=SimpleNamespace(
            memory_limit=10,
            memory_pause_fraction=0.95,
            memory_spill_fraction=0.7,
            memory_target_fraction=0.6,
        ),
        data=SimpleNamespace(device_memory_limit=30),
        scheduler=SimpleNamespace(address="tcp://127.0.0.1:8786"),
    )
    report = get_worker_config(worker)
    assert report["[plugin] RMMSetup"]["initial_pool_size"] == 2_000_000_000
    assert report["[plugin] RMMSetup"]["maximum_pool_size"] == 3_000_000_000
    assert report["device-memory-limit"] == 30
    assert report["protocol"] == "tcp" and report["memory_limit"] == 10


def test_cluster_configuration_and_waiting_on_a_real_cluster(capsys):
    from distributed import Client, LocalCluster

    from cudask import utils

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert utils.wait_workers(client, n_gpus=2)
        assert not utils.wait_workers(client, min_timeout=0.5, seconds_per_gpu=0, n_gpus=3)
        report = utils.get_cluster_configuration(client)
        assert report["nworkers"] == 2 and report["nthreads"] == 2
        assert "distributed.scheduler.worker-ttl" in report
        assert "device-memory-limit" not in report  # a dict store does not spill
        utils.all_to_all(client)
        utils.print_cluster_config(client)
    assert "Dask Cluster Configuration" in capsys.readouterr().out


def test_a_pool_size_beside_the_async_allocator_warns_before_start():
    from cudask.deploy.checks import check_input

    with pytest.warns(
        FutureWarning, match="'rmm_pool_size' is not needed when 'rmm_async' is enabled"
    ):
        check_input({"rmm_pool_size": "1GB", "rmm_async": True}, "cluster", libraries=False)
