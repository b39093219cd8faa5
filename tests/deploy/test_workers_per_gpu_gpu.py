"""Several workers per GPU, and CUDA contexts where they should not be, on a real GPU.

Each test uses GPU 0 alone (CUDA_VISIBLE_DEVICES="0"). What needs a CUDA context in
the cluster's own process runs in a fresh Python process, so this test process stays
as it is; where NVML lists processes under other pids than this pid namespace's (a
container of its own), the context checks cannot tell and those tests skip, saying so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import cloudpickle
import pytest
from distributed import Client

from cudask import LocalCUDACluster
from cudask.devices import default_backend as nvml
from cudask.devices import discover
from cudask.testing import cpu_affinity, current_gpu_uuid, wait_for, workers_info

pytestmark = pytest.mark.gpu

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SRC = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["cudask"].__file__ or "")))


def _store_limit(dask_worker) -> object:  # type: ignore[no-untyped-def]
    return getattr(dask_worker.data, "device_memory_limit", None)


def _chunk(i: int, n: int):  # type: ignore[no-untyped-def]
    import cupy

    return cupy.arange(i * n, (i + 1) * n, dtype="float64")


def _total(*chunks) -> float:  # type: ignore[no-untyped-def]
    return float(sum(float(c.sum()) for c in chunks))


def _expected(chunks: int, n: int) -> float:
    last = chunks * n - 1
    return float(last * (last + 1) // 2)


@pytest.fixture(scope="module")
def gpu0():
    pytest.importorskip("cupy")
    return discover().gpus[0]


def test_two_workers_share_gpu0(gpu0) -> None:
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0",
            workers_per_gpu=2,
            dashboard_address=":0",
            device_memory_limit="2GB",
        ) as cluster,
        Client(cluster) as client,
    ):
        info = workers_info(client)
        names = {w["name"]: addr for addr, w in info.items()}
        assert set(names) == {"0-0", "0-1"}
        assert set(client.run(current_gpu_uuid).values()) == {gpu0.uuid}
        limits = client.run(_store_limit)
        assert set(limits.values()) == {1_000_000_000}  # 2GB shared by two workers
        affinity = client.run(cpu_affinity)
        a, b = (set(affinity[names[n]]) for n in ("0-0", "0-1"))
        if len(gpu0.cpu_affinity) >= 2:
            assert a and b and not a & b and a | b == set(gpu0.cpu_affinity)
        # 1 MiB CuPy chunks made on one worker, summed on the other (same GPU, CUDA IPC)
        n = 1 << 17
        made = [client.submit(_chunk, i, n, workers=[names["0-0"]], pure=False) for i in range(8)]
        total = client.submit(_total, *made, workers=[names["0-1"]], pure=False).result()
        assert total == _expected(8, n)


async def _kill(dask_worker) -> None:  # type: ignore[no-untyped-def]
    # a coroutine: distributed runs a function without waiting only when it is one
    os.kill(os.getpid(), signal.SIGKILL)


def test_one_of_two_workers_killed_loses_no_key(gpu0) -> None:
    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0",
            workers_per_gpu=2,
            dashboard_address=":0",
            device_memory_limit="1GB",
        ) as cluster,
        Client(cluster) as client,
    ):
        n = 1 << 17
        chunks = [client.submit(_chunk, i, n, pure=False) for i in range(32)]
        client.wait_for_workers(2)
        before = client.submit(_total, *chunks, pure=False).result()
        victim = next(iter(workers_info(client)))
        client.run(_kill, workers=[victim], wait=False)
        assert wait_for(lambda: victim not in workers_info(client), timeout=60)
        client.wait_for_workers(2, timeout=120)  # its nanny starts it again
        after = client.submit(_total, *chunks, pure=False).result()
        assert before == after == _expected(32, n)


def _python(script: str, timeout: float = 300) -> dict:
    """Run `script` in a fresh Python (this tree's cudask) and read its last line as JSON."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


LISTED = """
    import json, os, cupy
    from cudask.devices import default_backend, discover
    cupy.zeros(1 << 20)  # a context on device 0: NVML's GPU 0 (PCI_BUS_ID order)
    uuid = discover().gpus[0].uuid
    if os.getpid() not in [p.pid for p in default_backend().compute_processes(uuid)]:
        print(json.dumps({"namespace": True}))
        raise SystemExit(0)
"""


def test_a_context_in_the_clients_process_is_named(gpu0) -> None:
    out = _python(
        LISTED
        + """
    import warnings
    from distributed import Client
    from cudask import LocalCUDACluster
    from cudask.errors import CUDAContextWarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", CUDAContextWarning)
        with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=":0",
                              device_memory_limit=None) as cluster, Client(cluster) as client:
            found = client.run(lambda dask_worker: [
                (n.process.pid, n.role) for n in
                dask_worker.plugins["cudask-cuda-context"].neighbours or []])
    texts = [str(w.message) for w in seen if w.category is CUDAContextWarning]
    print(json.dumps({"pid": os.getpid(), "warnings": texts, "found": list(found.values())}))
    """
    )
    if out.get("namespace"):
        pytest.skip("NVML lists processes under pids of another pid namespace here")
    (text,) = out["warnings"]
    assert f"pid {out['pid']}" in text and "GPU 0" in text and gpu0.uuid in text
    (found,) = out["found"]
    assert [out["pid"], "the process that started this worker"] in found


HOLD = "import cupy, sys; cupy.zeros(1 << 20); print('ready', flush=True); sys.stdin.read()"


def test_a_worker_names_another_process_on_its_gpu(gpu0) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env={
            **os.environ,
            "CUDA_VISIBLE_DEVICES": str(gpu0.index),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with (
            LocalCUDACluster(
                CUDA_VISIBLE_DEVICES="0", dashboard_address=":0", device_memory_limit=None
            ) as cluster,
            Client(cluster) as client,
        ):
            found = client.run(
                lambda dask_worker: (
                    None
                    if (n := dask_worker.plugins["cudask-cuda-context"].neighbours) is None
                    else [(x.process.pid, x.role) for x in n]
                )
            )
        (listed,) = found.values()
        if listed is None:
            pytest.skip("NVML lists processes under pids of another pid namespace here")
        assert [holder.pid, "another process"] in [list(x) for x in listed]
    finally:
        holder.kill()
        holder.wait(timeout=60)
        # the tests after this one must not find it on the GPU still
        wait_for(
            lambda: holder.pid not in {p.pid for p in nvml().compute_processes(gpu0.uuid)},
            timeout=60,
        )
