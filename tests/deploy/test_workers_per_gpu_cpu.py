"""workers_per_gpu on fake machines (nothing is started): LocalCUDACluster's specs
and scale(), CUDAWorker's names, ports and counts, the options refused with it
before any GPU is looked for, the CLI flag and config key, dask-jobqueue's and
Kubernetes' worker counts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from cudask.cli.main import cli
from cudask.deploy import local, node
from cudask.devices import discover
from cudask.errors import OptionError
from cudask.options import resolve
from cudask.testing import FakeBackend, fake_gpu
from cudask.worker.spec import NODE_WORKERS_KEY


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    machine = discover(FakeBackend.dgx(2, cores=8))
    monkeypatch.setattr(local, "discover", lambda: machine)
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # distributed's own monitor would ask NVML about the fake GPUs on a host with real ones
    monkeypatch.setattr("distributed.diagnostics.nvml.device_get_count", lambda: 0)
    yield


def _cluster_specs(**kwargs: Any) -> tuple[list[Any], Any]:
    """The worker specs LocalCUDACluster makes (its workers never start), and the
    OptionError of `scale(5)` afterwards (None when it scales)."""
    kwargs.setdefault("device_memory_limit", None)  # no CuPy needed

    async def main() -> tuple[list[Any], Any]:
        cluster = local.LocalCUDACluster(asynchronous=True, dashboard_address=":0", **kwargs)
        try:
            names = list(cluster.worker_spec)
            specs = dict(cluster.worker_spec)
            try:
                cluster.scale(5)
                error = None
            except OptionError as exc:
                error = exc
            return [(n, specs[n]) for n in names], error
        finally:
            await cluster.close()

    return asyncio.run(main())


def test_local_cluster_starts_n_workers_on_each_gpu(two_gpus: None) -> None:
    specs, error = _cluster_specs(workers_per_gpu=2)
    assert [name for name, _ in specs] == ["0-0", "1-0", "0-1", "1-1"]
    visible = {name: s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for name, s in specs}
    assert visible == {"0-0": "0,1", "0-1": "0,1", "1-0": "1,0", "1-1": "1,0"}
    cpus = {name: s["options"]["plugins"][0].cpus for name, s in specs}
    assert cpus == {"0-0": (0, 1), "0-1": (2, 3), "1-0": (4, 5), "1-1": (6, 7)}
    limits = {s["options"]["memory_limit"] for _, s in specs}
    assert len(limits) == 1  # 'auto': one share of four
    assert error is not None and "2 workers each" in str(error)


def test_local_cluster_n_workers_spreads_over_the_gpus(two_gpus: None) -> None:
    specs, _ = _cluster_specs(workers_per_gpu=3, n_workers=3)
    assert [name for name, _ in specs] == ["0-0", "1-0", "0-1"]
    with pytest.raises(OptionError, match="n_workers=7 is more than the 6 workers"):
        _cluster_specs(workers_per_gpu=3, n_workers=7)


def test_local_cluster_with_one_worker_per_gpu_is_unchanged(two_gpus: None) -> None:
    specs, error = _cluster_specs()
    assert [name for name, _ in specs] == [0, 1]
    assert [s["options"]["plugins"][0].cpus for _, s in specs] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert error is not None and "one worker each" in str(error)


def _node(**kwargs: Any) -> node.CUDAWorker:
    kwargs.setdefault("device_memory_limit", None)

    async def main() -> node.CUDAWorker:  # Nannies are made inside an event loop
        return node.CUDAWorker("tcp://10.0.0.1:8786", **kwargs)

    return asyncio.run(main())


def test_node_names_ports_and_count(two_gpus: None) -> None:
    w = _node(workers_per_gpu=2, name="pod", worker_port="9000:9003")
    assert [n.name for n in w.nannies] == ["pod-0", "pod-1", "pod-2", "pod-3"]
    assert [n.env["CUDA_VISIBLE_DEVICES"] for n in w.nannies] == ["0,1", "0,1", "1,0", "1,0"]
    assert [n._given_worker_port for n in w.nannies] == [9000, 9001, 9002, 9003]
    info = w.nannies[0].worker_kwargs["startup_information"]
    assert info[NODE_WORKERS_KEY](None) == 4  # the scheduler counts a pod's workers by it
    assert [n.worker_kwargs["plugins"][0].cpus for n in w.nannies] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
    ]
    with pytest.raises(
        OptionError, match=r"Not enough ports in --worker-port range for 4 GPUs: .* gives 2"
    ):
        _node(workers_per_gpu=2, worker_port="9000:9001")


def test_node_with_one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = discover(FakeBackend([fake_gpu(0, cpus=range(3))]))
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    w = _node(workers_per_gpu=4, name="gpu0")
    assert [n.name for n in w.nannies] == ["gpu0-0", "gpu0-1", "gpu0-2", "gpu0-3"]
    # three CPUs for four workers: all of them share them
    assert {n.worker_kwargs["plugins"][0].cpus for n in w.nannies} == {(0, 1, 2)}
    assert [n.name for n in _node(name="gpu0").nannies] == ["gpu0"]  # N = 1: as before


@pytest.fixture
def no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    def discover(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GPUs were looked for before the bad input was caught")

    monkeypatch.setattr(local, "discover", discover)
    monkeypatch.setattr(node, "discover", discover)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nanny": False}, r"workers_per_gpu=2 starts 2 worker processes per GPU.*nanny=False"),
        ({"listen_address": "tcp://0.0.0.0:9000"}, r"binds one worker, but workers_per_gpu=2"),
        ({"workers_per_gpu": 0}, r"workers_per_gpu=0 must be at least 1"),
        ({"workers_per_gpu": "two"}, r"workers_per_gpu='two' is not an integer"),
    ],
)
def test_refused_before_any_gpu_is_looked_for(
    no_discovery: None, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(OptionError, match=match):
        _node(**{"workers_per_gpu": 2, **kwargs})


def test_an_mpi_rank_is_told_to_ask_for_a_nanny(
    no_discovery: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node.mpi, "mpi_world_size", lambda: 4)  # a rank of 4
    with pytest.raises(OptionError, match=r"the default in an MPI rank.*give nanny=True"):
        _node(workers_per_gpu=2)


def test_cluster_keyword_refused_before_any_gpu(no_discovery: None) -> None:
    with pytest.raises(OptionError, match="workers_per_gpu=-1 must be at least 1"):
        local.LocalCUDACluster(workers_per_gpu=-1)


def test_cli_flag_and_config_key(no_discovery: None, monkeypatch: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(
        cli, ["worker", "tcp://127.0.0.1:8786", "--workers-per-gpu", "2", "--no-nanny"]
    )
    assert result.exit_code == 2 and "workers_per_gpu=2 starts 2 worker" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["worker", "tcp://127.0.0.1:8786", "--workers-per-gpu", "0"])
    assert result.exit_code == 2 and "workers_per_gpu=0 must be at least 1" in result.output
    monkeypatch.setenv("DASK_CUDASK__WORKER__WORKERS_PER_GPU", "3")
    import dask.config

    dask.config.refresh()
    try:
        assert resolve({}, "cluster").workers_per_gpu == 3
    finally:
        monkeypatch.delenv("DASK_CUDASK__WORKER__WORKERS_PER_GPU")
        dask.config.refresh()
    assert resolve({}, "cluster").workers_per_gpu == 1


def test_jobqueue_counts_a_jobs_workers() -> None:
    from cudask.deploy.jobqueue import job_kwargs

    kwargs = job_kwargs("slurm", gpus_per_job=2, cores=16, memory="64GB", workers_per_gpu=2)
    assert kwargs["processes"] == 4  # jobqueue's share of cores and memory for each worker
    assert "--workers-per-gpu" in kwargs["worker_extra_args"]
    with pytest.raises(OptionError, match=r"cores=3 is fewer than the job's 4 workers"):
        job_kwargs("slurm", gpus_per_job=2, cores=3, memory="64GB", workers_per_gpu=2)
    assert job_kwargs("slurm", gpus_per_job=2, cores=16, memory="64GB")["processes"] == 2


def test_kubernetes_pods_count_their_workers() -> None:
    from cudask.deploy.kube_checks import check_worker_options
    from cudask.deploy.kube_spec import check_pods, scheduler_args

    given = check_worker_options({"workers_per_gpu": 2}, 2, 16 << 30)
    assert given["memory_limit"] == "4GiB"  # the pod's 16 GiB over 2 GPUs x 2 workers
    pods = check_pods(image="img", nvidia_gpu=2, worker_memory=16, workers_per_gpu=2)
    assert pods.workers_per_pod == 4 and pods.memory_per_worker == 4 << 30
    assert scheduler_args(pods)[-2:] == ["--gpus-per-pod", "4"]
