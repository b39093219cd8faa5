"""dask-mpi with cudask.CUDAWorker on real GPUs (issue 15, item 2).

Covers: `mpirun -np N+1 dask-mpi --worker-class cudask.CUDAWorker --worker-options
JSON` and `mpirun -np N+2 python <a dask_mpi.initialize() script>` on N GPUs (at most
2): one worker per worker rank, each on the GPU of its local rank (CUDA device 0 is
that GPU, checked by UUID against NVML), with the worker options in effect (device
memory limit, threads, nanny or none). Needs mpirun, mpi4py and dask-mpi (carried as a
wheel to GPU machines: dask_mpi-2026.3.0-py3-none-any.whl); skips without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dask.utils import parse_bytes
from distributed import Client

from cudask.devices import GPU, discover
from cudask.testing import current_gpu_uuid, wait_for, workers_info

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("mpi_initialize_script.py")
LIMIT = "1GB"


@pytest.fixture(scope="module")
def machine() -> Any:
    return discover()


@pytest.fixture
def dask_mpi(mpirun: Any) -> Any:
    pytest.importorskip("cupy")
    pytest.importorskip(
        "dask_mpi",
        reason="dask-mpi is not installed here; carry its wheel "
        "(dask_mpi-2026.3.0-py3-none-any.whl, pure Python)",
    )
    return mpirun


def _visible(machine: Any, order: list[int] | None) -> tuple[list[GPU], dict[str, str]]:
    """The GPUs the ranks see, in CUDA_VISIBLE_DEVICES order, and the environment
    change: `order` names them; None: every GPU (unset) on one or two GPUs, else 0,1."""
    if order is None and len(machine.gpus) <= 2:
        return list(machine.gpus), {}
    order = order or [0, 1]
    return [machine.gpus[i] for i in order], {"CUDA_VISIBLE_DEVICES": ",".join(map(str, order))}


def _env(mpirun: Any, change: dict[str, str]) -> dict[str, str]:
    env = mpirun.env(**change)
    if "CUDA_VISIBLE_DEVICES" not in change:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)


def _fail(proc: subprocess.Popen[bytes], what: str) -> None:
    _end(proc)
    err = proc.stderr.read().decode(errors="replace")[-4000:] if proc.stderr else ""
    pytest.fail(f"{what}; the MPI job's stderr:\n{err}")


def _run_command(
    mpirun: Any,
    tmp_path: Path,
    gpus: list[GPU],
    change: dict[str, str],
    worker_options: dict[str, Any],
) -> None:
    """`dask-mpi --worker-class cudask.CUDAWorker` on len(gpus) + 1 ranks: rank 0 is the
    scheduler, ranks 1.. the workers, local rank r on visible GPU r mod len(gpus)."""
    n = len(gpus)
    sched_file = tmp_path / "sched.json"
    proc = subprocess.Popen(
        [
            *mpirun.argv(n + 1),
            sys.executable,
            "-m",
            "dask_mpi.cli",
            "--worker-class",
            "cudask.CUDAWorker",
            "--scheduler-file",
            str(sched_file),
            "--scheduler-port",
            "0",
            "--no-dashboard",
            "--name",
            "gpu",
            "--worker-options",
            json.dumps(worker_options),
        ],
        env=_env(mpirun, change),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        if not wait_for(lambda: sched_file.exists() or proc.poll() is not None, timeout=120):
            _fail(proc, "the scheduler rank wrote no scheduler file")
        with Client(scheduler_file=str(sched_file), timeout=60) as client:
            try:
                client.wait_for_workers(n, timeout=180)
            except TimeoutError:
                _fail(proc, f"{len(workers_info(client))}/{n} workers joined")
            info = workers_info(client)
            by_name = {w["name"]: addr for addr, w in info.items()}
            assert set(by_name) == {f"gpu-{r}" for r in range(1, n + 1)}
            uuids = client.run(current_gpu_uuid)
            limits = client.run(lambda dask_worker: dask_worker.data.device_memory_limit)
            threads = client.run(lambda dask_worker: dask_worker.state.nthreads)
            nannies = client.run(lambda dask_worker: dask_worker.nanny is not None)
            for r in range(1, n + 1):
                addr = by_name[f"gpu-{r}"]
                assert uuids[addr] == gpus[r % n].uuid, (r, uuids)
                assert limits[addr] == parse_bytes(LIMIT)
                assert threads[addr] == worker_options.get("nthreads", 1)
                assert nannies[addr] is worker_options.get("nanny", False)
            client.shutdown()  # the scheduler rank returns, the workers close
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            _fail(proc, "the MPI job did not end after client.shutdown()")
    finally:
        _end(proc)


def test_dask_mpi_command(dask_mpi: Any, tmp_path: Path, machine: Any) -> None:
    # under a nanny: the `dask-mpi` script guards its main, so the spawned worker can start
    gpus, change = _visible(machine, None)
    _run_command(
        dask_mpi,
        tmp_path,
        gpus,
        change,
        {"device_memory_limit": LIMIT, "nthreads": 2, "nanny": True},
    )


@pytest.mark.multigpu
def test_dask_mpi_command_two_gpus_in_a_given_order(
    dask_mpi: Any, tmp_path: Path, machine: Any
) -> None:
    gpus, change = _visible(machine, [1, 0])  # rank 1 takes visible GPU 1, that is GPU 0
    _run_command(dask_mpi, tmp_path, gpus, change, {"device_memory_limit": LIMIT})


def _run_script(
    mpirun: Any,
    tmp_path: Path,
    gpus: list[GPU],
    change: dict[str, str],
    worker_options: dict[str, Any],
) -> dict[str, Any]:
    """A dask_mpi.initialize() program on len(gpus) + 2 ranks: scheduler, client,
    then one worker per GPU (ranks 2..: local rank r on visible GPU r mod len(gpus))."""
    n = len(gpus)
    out = tmp_path / "workers.json"
    proc = subprocess.Popen(
        [
            *mpirun.argv(n + 2),
            sys.executable,
            str(SCRIPT),
            str(out),
            json.dumps(worker_options),
            str(n),
        ],
        env=_env(mpirun, change),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if proc.poll() is None or not out.exists():
            _fail(proc, "the dask-mpi program did not finish with its report")
        assert proc.returncode == 0
    finally:
        _end(proc)
    workers: dict[str, Any] = json.loads(out.read_text())
    assert set(workers) == {str(r) for r in range(2, n + 2)}  # dask-mpi names them by rank
    for r in range(2, n + 2):
        w = workers[str(r)]
        gpu = gpus[r % n]
        assert w["uuid"] == gpu.uuid, (r, workers)
        assert w["limit"] == parse_bytes(LIMIT)
        if n > 1:  # every visible GPU, its own first (CUDA IPC between workers)
            assert w["visible"].split(",")[0] == str(gpu.index)
            assert sorted(w["visible"].split(",")) == sorted(str(g.index) for g in gpus)
    return workers


def test_dask_mpi_initialize(dask_mpi: Any, tmp_path: Path, machine: Any) -> None:
    """The script has no `if __name__ == "__main__":` guard, as dask-mpi's examples: each
    worker rank is its worker (no nanny, whose spawned process would run it again)."""
    gpus, change = _visible(machine, None)
    workers = _run_script(dask_mpi, tmp_path, gpus, change, {"device_memory_limit": LIMIT})
    assert {w["nanny"] for w in workers.values()} == {False}
    assert {w["nthreads"] for w in workers.values()} == {1}  # initialize(nthreads=1)


@pytest.mark.multigpu
def test_dask_mpi_initialize_two_gpus_in_a_given_order(
    dask_mpi: Any, tmp_path: Path, machine: Any
) -> None:
    """The rank is the worker: its own CUDA_VISIBLE_DEVICES ("1,0" for every rank here)
    is rewritten to put its GPU first before CUDA starts."""
    gpus, change = _visible(machine, [1, 0])
    workers = _run_script(
        dask_mpi, tmp_path, gpus, change, {"device_memory_limit": LIMIT, "nthreads": 3}
    )
    assert {w["nthreads"] for w in workers.values()} == {3}
