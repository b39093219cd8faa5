"""LocalCUDACluster, CUDAWorker and `dask cuda worker` on real GPUs: devices, CPU
affinity, the dashboard, scaling, the CLI and its flags. RMM resources and spilling
are in test_cluster_memory_gpu.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import cloudpickle
import pytest
from distributed import Client

from cudask import LocalCUDACluster
from cudask.devices import discover
from cudask.testing import cpu_affinity, current_gpu_uuid, wait_for, workers_info

pytestmark = pytest.mark.gpu

# Functions defined here run on LocalCUDACluster workers: send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# Functions run on workers come from an importable module: workers started by the CLI
# cannot import this test file.
_uuid_of_device0 = current_gpu_uuid
_affinity = cpu_affinity


def _cupy_view() -> dict:
    """What CuPy sees in a task thread once the background import is done: the
    context the driver created at start, on the worker's own GPU."""
    from distributed import get_worker

    from cudask.devices.topology import normalize_bus_id

    ctx = get_worker().plugins["cudask-cuda-context"]
    if ctx.importer is not None:
        ctx.importer.join(timeout=60)
    was_imported = "cupy" in sys.modules
    import cupy

    return {
        "imported": was_imported,
        "device": cupy.cuda.runtime.getDevice(),
        "bus": normalize_bus_id(cupy.cuda.Device().pci_bus_id),
        "sum": float(cupy.arange(10).sum()),
        "context_s": ctx.seconds,
    }


def _frozen(dask_worker) -> int | None:
    """Objects the gc-freeze plugin froze, once its thread is done (out of band: a
    worker given a task first freezes nothing)."""
    freeze = dask_worker.plugins["cudask-gc-freeze"]
    if freeze.thread is not None:
        freeze.thread.join(timeout=60)
    return freeze.frozen


@pytest.fixture(scope="module")
def machine():
    return discover()


def test_each_worker_device0_is_its_gpu_and_pinned(machine):
    pytest.importorskip("cupy")
    with (
        LocalCUDACluster(
            dashboard_address=":0", device_memory_limit="1GB", gc_freeze=True
        ) as cluster,
        Client(cluster) as client,
    ):
        assert len(workers_info(client)) == len(machine.gpus)
        # Start-up objects, CuPy's among them, frozen once the import was done.
        assert all(client.run(_frozen).values())
        uuids = client.run(_uuid_of_device0)
        affinity = client.run(_affinity)
        names = {w["name"]: addr for addr, w in workers_info(client).items()}
        for gpu in machine.gpus:
            addr = names[gpu.index]
            assert uuids[addr] == gpu.uuid
            assert affinity[addr] == list(gpu.cpu_affinity)
            view = client.submit(_cupy_view, workers=[addr], pure=False).result()
            assert view["imported"] and view["device"] == 0 and view["sum"] == 45.0
            assert view["bus"] == gpu.pci_bus_id and 0 < view["context_s"] < 60
        assert client.submit(lambda: 21 * 2).result() == 42


def _gpu_metrics(dask_scheduler) -> dict:
    """What the dashboard's GPU pages read: each worker's flattened gpu metrics."""
    keys = ("gpu_memory_used", "gpu-memory-total", "gpu_utilization")
    return {
        addr: {"name": ws.name, **{k: ws.metrics.get(k) for k in keys}}
        for addr, ws in dask_scheduler.workers.items()
    }


def test_dashboard_gpu_pages_show_every_worker(machine):
    import urllib.request

    with (
        LocalCUDACluster(dashboard_address=":0", device_memory_limit="1GB") as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(len(machine.gpus))

        def reported() -> bool:  # heartbeats carry the GPU metrics
            diag = client.run_on_scheduler(_gpu_metrics)
            return len(diag) == len(machine.gpus) and all(
                d["gpu-memory-total"] is not None and d["gpu_memory_used"] is not None
                for d in diag.values()
            )

        assert wait_for(reported, timeout=90, interval=0.5), client.run_on_scheduler(_gpu_metrics)
        diag = client.run_on_scheduler(_gpu_metrics)
        assert len(diag) == len(machine.gpus)
        for d in diag.values():
            gpu = machine.gpus[d["name"]]
            assert d["gpu-memory-total"] == gpu.memory_total  # the worker's own GPU
            assert d["gpu_memory_used"] > 0  # its CUDA context at least
        base = cluster.dashboard_link.rsplit("/", 1)[0]
        for page in ("individual-gpu-memory", "individual-gpu-utilization"):
            with urllib.request.urlopen(f"{base}/{page}", timeout=30) as response:
                assert response.status == 200
        every = client.run(lambda dask_worker: dask_worker.metrics["cudask"](dask_worker))
        assert len(every) == len(machine.gpus)
        for metrics in every.values():
            assert "device-bytes" in metrics and "host-bytes" in metrics


def test_visible_devices_as_uuid_and_scale(machine):
    pytest.importorskip("cupy")
    gpu = machine.gpus[-1]
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=gpu.uuid[:15],
            dashboard_address=":0",
            device_memory_limit=None,
            memory_limit=0,
        ) as cluster,
        Client(cluster) as client,
    ):
        assert list(client.run(_uuid_of_device0).values()) == [gpu.uuid]
        cluster.scale(0)
        deadline = time.time() + 30
        while workers_info(client) and time.time() < deadline:
            time.sleep(0.2)
        assert not workers_info(client)
        cluster.scale(1)
        client.wait_for_workers(1, timeout=60)


def test_async_context_manager():
    import asyncio

    async def main() -> int:
        async with (
            LocalCUDACluster(n_workers=1, asynchronous=True, dashboard_address=":0") as c,
            Client(c, asynchronous=True) as client,
        ):
            return await client.submit(lambda: 7)

    assert asyncio.run(main()) == 7


def test_pre_import_and_config_cli(tmp_path, machine):
    with (
        LocalCUDACluster(n_workers=1, pre_import="json,decimal", dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        assert all(client.run(lambda: "decimal" in sys.modules).values())
        out = subprocess.run(
            [sys.executable, "-m", "cudask.cli", "config", cluster.scheduler_address, "--json"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        report = next(iter(json.loads(out.stdout).values()))
        assert report["gpu"] == machine.gpus[0].uuid and 0 < report["cuda_context_s"] < 60
        assert report["plugins"][:2] == ["cudask-cpu-affinity", "cudask-cuda-context"]
        assert "cudask-pre-import" in report["plugins"]


def _wait_for_file(path, timeout=30.0):
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    assert os.path.exists(path), f"{path} never appeared"


def _run_scheduler(tmp_path):
    sched_file = tmp_path / "sched.json"
    proc = subprocess.Popen(
        [
            "dask",
            "scheduler",
            "--scheduler-file",
            str(sched_file),
            "--port",
            "0",
            "--dashboard-address",
            ":0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_file(sched_file)
    return proc, sched_file


def test_cli_workers_join_through_scheduler_file(tmp_path, machine):
    pytest.importorskip("cupy")
    sched, sched_file = _run_scheduler(tmp_path)
    worker = subprocess.Popen(
        [
            "dask",
            "cuda",
            "worker",
            "--scheduler-file",
            str(sched_file),
            "--device-memory-limit",
            "1GB",
            "--name",
            "node",
            "--protocol",
            "tcp",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with Client(scheduler_file=str(sched_file)) as client:
            _wait_for_workers(client, len(machine.gpus), worker, timeout=90)
            names = sorted(w["name"] for w in workers_info(client).values())
            expected = (
                ["node"]
                if len(machine.gpus) == 1
                else [f"node-{i}" for i in range(len(machine.gpus))]
            )
            assert names == expected
            uuids = sorted(client.run(_uuid_of_device0).values())
            assert uuids == sorted(g.uuid for g in machine.gpus)
    finally:
        worker.terminate()
        worker.wait(60)
        sched.terminate()
        sched.wait(30)


def test_worker_per_mpi_rank(tmp_path, machine):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not installed")
    pytest.importorskip("cupy")
    sched, sched_file = _run_scheduler(tmp_path)
    n = len(machine.gpus)
    cmd = [
        mpirun,
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(n),
        "bash",
        "-c",
        (
            f"CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec {sys.executable} -m cudask.cli "
            f"worker --scheduler-file {sched_file} --device-memory-limit 1GB "
            "--name rank-$OMPI_COMM_WORLD_RANK"
        ),
    ]
    ranks = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMPI_MCA_plm_rsh_agent": ""},
    )
    try:
        with Client(scheduler_file=str(sched_file)) as client:
            _wait_for_workers(client, n, ranks)
            info = workers_info(client)
            assert sorted(w["name"] for w in info.values()) == sorted(f"rank-{r}" for r in range(n))
            by_name = {w["name"]: a for a, w in info.items()}
            uuids = client.run(_uuid_of_device0)
            for r in range(n):
                assert uuids[by_name[f"rank-{r}"]] == machine.gpus[r].uuid
    finally:
        ranks.terminate()
        try:
            ranks.wait(60)
        except subprocess.TimeoutExpired:
            ranks.kill()
        sched.terminate()
        sched.wait(30)


@pytest.mark.multigpu
def test_two_gpus_two_workers(machine):
    pytest.importorskip("cupy")
    with (
        LocalCUDACluster(CUDA_VISIBLE_DEVICES=[1, 0], dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        uuids = client.run(_uuid_of_device0)
        assert sorted(uuids.values()) == sorted(g.uuid for g in machine.gpus[:2])
        names = {w["name"] for w in workers_info(client).values()}
        assert names == {0, 1}


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_workers(client, n: int, *procs: subprocess.Popen, timeout: float = 120) -> None:
    """wait_for_workers, failing with the processes' own error output."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure to join: stop the workers, show their stderr
        _stop(*procs)
        errors = "\n---\n".join(
            p.stderr.read().decode(errors="replace")[-3000:] for p in procs if p.stderr is not None
        )
        pytest.fail(f"only {len(workers_info(client))}/{n} workers; their stderr:\n{errors}")


def test_no_nanny_worker_and_dask_spec(tmp_path, machine):
    """`dask cuda worker --no-nanny` (one GPU, this process) and CUDAWorker as the
    class of `dask spec` (how dask-jobqueue / SSHCluster start workers)."""
    pytest.importorskip("cupy")
    gpu = machine.gpus[-1]
    sched, sched_file = _run_scheduler(tmp_path)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    solo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cudask.cli",
            "worker",
            "--scheduler-file",
            str(sched_file),
            "--no-nanny",
            "--name",
            "solo",
            "--worker-class",
            "cudask.testing.workers.TaggedWorker",
            "--device-memory-limit",
            "1GB",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    spec = json.dumps(
        {
            "cls": "cudask.CUDAWorker",
            "opts": {
                "name": "spec",
                "device_memory_limit": "1GB",
                "scheduler_file": str(sched_file),
            },
        }
    )
    spec_proc = subprocess.Popen(
        ["dask", "spec", "--spec", spec], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        with Client(scheduler_file=str(sched_file)) as client:
            _wait_for_workers(client, 2, solo, spec_proc)
            info = workers_info(client)
            by_name = {w["name"]: addr for addr, w in info.items()}
            assert set(by_name) == {"solo", "spec"}
            uuids = client.run(_uuid_of_device0)
            assert uuids[by_name["solo"]] == uuids[by_name["spec"]] == gpu.uuid
            kinds = client.run(lambda dask_worker: type(dask_worker.data).__name__)
            assert set(kinds.values()) == {"TieredStore"}
            classes = client.run(lambda dask_worker: type(dask_worker).__name__)
            assert classes[by_name["solo"]] == "TaggedWorker"
            assert classes[by_name["spec"]] == "GPUWorker"
    finally:
        _stop(solo, spec_proc, sched)


@pytest.mark.multigpu
def test_cli_port_range_split_across_gpus(tmp_path, machine):
    pytest.importorskip("cupy")
    sched, sched_file = _run_scheduler(tmp_path)
    worker = subprocess.Popen(
        [
            "dask",
            "cuda",
            "worker",
            "--scheduler-file",
            str(sched_file),
            "--name",
            "node",
            "--worker-port",
            "41000:41019",
            "--no-dashboard",
            "--device-memory-limit",
            "0.5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with Client(scheduler_file=str(sched_file)) as client:
            n = len(machine.gpus)
            _wait_for_workers(client, n, worker)
            info = workers_info(client)
            assert sorted(w["name"] for w in info.values()) == [f"node-{i}" for i in range(n)]
            ports = [int(addr.rsplit(":", 1)[1]) for addr in info]
            assert len(set(ports)) == n and all(41000 <= p <= 41019 for p in ports)
            uuids = client.run(_uuid_of_device0)
            for addr, w in info.items():
                i = int(w["name"].rsplit("-", 1)[1])
                assert uuids[addr] == machine.gpus[i].uuid
            limits = client.run(lambda dask_worker: dask_worker.data.device_memory_limit)
            for addr, w in info.items():
                i = int(w["name"].rsplit("-", 1)[1])
                assert limits[addr] == machine.gpus[i].memory_total // 2
    finally:
        _stop(worker, sched)


@pytest.mark.multigpu
def test_scale_within_the_visible_gpus(machine):
    pytest.importorskip("cupy")
    from cudask.errors import OptionError

    with (
        LocalCUDACluster(dashboard_address=":0", device_memory_limit="1GB") as cluster,
        Client(cluster) as client,
    ):
        n = len(machine.gpus)
        client.wait_for_workers(n)
        cluster.scale(1)
        deadline = time.time() + 60
        while len(workers_info(client)) > 1 and time.time() < deadline:
            time.sleep(0.2)
        assert len(workers_info(client)) == 1
        cluster.scale(n)
        client.wait_for_workers(n, timeout=90)
        assert sorted(client.run(_uuid_of_device0).values()) == sorted(g.uuid for g in machine.gpus)
        with pytest.raises(OptionError, match="visible GPU"):
            cluster.scale(n + 1)


def test_cli_node_flags_over_tls(tmp_path, machine, tls_files):
    """TLS, --pid-file, --resources, --preload, --dashboard-prefix, --death-timeout."""
    import urllib.request

    from distributed.security import Security

    cert, key = tls_files
    tls = ["--tls-ca-file", cert, "--tls-cert", cert, "--tls-key", key]
    sched_file, pid_file = tmp_path / "sched.json", tmp_path / "worker.pid"
    sched = subprocess.Popen(
        [
            "dask",
            "scheduler",
            "--scheduler-file",
            str(sched_file),
            "--protocol",
            "tls",
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            *tls,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_for_file(sched_file)
    worker = subprocess.Popen(
        [
            "dask",
            "cuda",
            "worker",
            "--scheduler-file",
            str(sched_file),
            *tls,
            "--name",
            "flags",
            "--pid-file",
            str(pid_file),
            "--resources",
            "GPU=1",
            "--preload",
            "cudask.testing.preload",
            "--dashboard-prefix",
            "gpu",
            "--death-timeout",
            "60",
            "--device-memory-limit",
            "1GB",
        ],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": str(machine.gpus[0].index)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    security = Security(
        tls_ca_file=cert, tls_client_cert=cert, tls_client_key=key, require_encryption=True
    )
    try:
        with Client(scheduler_file=str(sched_file), security=security) as client:
            _wait_for_workers(client, 1, worker, sched)
            ((address, info),) = workers_info(client).items()
            assert address.startswith("tls://") and info["name"] == "flags"
            assert info["resources"] == {"GPU": 1}
            (preloaded,) = client.run(
                lambda dask_worker: getattr(dask_worker, "cudask_preloaded", False)
            ).values()
            assert preloaded is True
            assert pid_file.read_text().strip() == str(worker.pid)
            host = address.split("://")[1].rsplit(":", 1)[0]
            port = info["services"]["dashboard"]
            with urllib.request.urlopen(f"http://{host}:{port}/gpu/health", timeout=30) as r:
                assert r.status == 200
        out = subprocess.run(
            ["dask", "cuda", "config", "--scheduler-file", str(sched_file), "--json", *tls],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (report,) = json.loads(out.stdout).values()
        assert report["gpu"] == machine.gpus[0].uuid and report["protocol"] == "tls"
    finally:
        _stop(worker, sched)


def test_a_nanny_subclass_as_worker_class():
    """dask-cuda accepts a Nanny subclass as worker_class: it replaces the Nanny."""
    with (
        LocalCUDACluster(
            n_workers=1, worker_class="cudask.testing.workers.TaggedNanny", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        (nanny,) = client.run(lambda dask_worker: type(dask_worker).__name__, nanny=True).values()
        assert nanny == "TaggedNanny"
        assert client.submit(lambda: 6 * 7).result() == 42
