"""Device arrays between two workers of one host by CUDA IPC, on real GPUs.

One GPU: two `cudask worker` processes on the same GPU (CUDA IPC between
processes works there as between GPUs). Two GPUs: LocalCUDACluster, NVLink or
PCIe peer access. Each value made on one worker is digested on the other and
compared with the digest where it was made; the workers' IPC counters show
which way it went."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import ipc_hold
import pytest
from ipc_hold import hold_next

from cudask.testing import wait_for, workers_info
from cudask.testing.integrity import digest, make_value
from cudask.testing.processes import worker_processes

# Functions below run on worker processes that cannot import this module (nor ipc_hold).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(ipc_hold)

MiB = 1 << 20


def _ipc_stats() -> dict[str, Any]:
    from cudask.comm import ipc

    return {**ipc.stats(), "declined-because": ipc.declined()}


def _exchange(client: Any, a: str, b: str) -> list[tuple[str, str, str]]:
    """Values of each kind made on `a` and digested on `b` (and on `a`)."""
    out = []
    for i, (kind, nbytes) in enumerate(
        (
            ("f8", 256 * MiB),
            ("i1", 64 * MiB),
            ("view", 64 * MiB),
            ("dict", 64 * MiB),
            ("f8", 4096),
            ("host", 8 * MiB),
            ("block", 64 * MiB),
            ("reversed", 32 * MiB),
        )
    ):
        x = client.submit(make_value, i, nbytes, kind, workers=[a], pure=False)
        there = client.submit(digest, x, workers=[a], pure=False)
        here = client.submit(digest, x, workers=[b], pure=False)
        out.append((kind, there.result(timeout=300), here.result(timeout=300)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["ipc", "no-ipc", "ipc-jit"])
def test_two_workers_on_one_gpu(mode: str) -> None:
    pytest.importorskip("cupy")
    env = {"DASK_CUDASK__COMM__DEVICE_IPC": "False"} if mode == "no-ipc" else {}
    args = ["--device-memory-limit", "16GB"]
    if mode == "ipc-jit":
        args.append("--enable-jit-unspill")
    with worker_processes(["0", "0"], env=env, args=args) as client:
        a, b = sorted(workers_info(client))
        results = _exchange(client, a, b)
        stats = client.run(_ipc_stats)
    for kind, there, here in results:
        assert there == here, kind
    sent, received = stats[a], stats[b]
    view = 2896 * 2896 * 8  # make_value's square view of 64 MiB of float64
    if mode == "ipc":
        # By handle: f8 (256 MiB), i1 (64 MiB), the view (a transpose: Fortran order,
        # 64 MiB; copied as one block), the dict's device array (32 MiB), the block
        # (half the columns of the square: a pitched copy) and the reversed array (a
        # copy kernel). The 4 KiB array (under device-ipc-min-size) and the host array
        # went the usual way.
        assert sent["sent"] == received["received"] == 6, (sent, received)
        assert sent["declined"] == 0, sent
        assert (
            received["received-bytes"]
            == sent["sent-bytes"]
            == (256 * MiB + 64 * MiB + view + 32 * MiB + view // 2 + 32 * MiB)
        ), (sent, received)
    elif mode == "ipc-jit":
        # Proxies on the device: at least the five plain arrays by handle.
        assert sent["sent"] == received["received"] >= 5, (sent, received)
        assert received["received-bytes"] >= 256 * MiB + 64 * MiB + view, received
    else:
        assert sent["sent"] == received["received"] == 0, (sent, received)


def _fill(nbytes: int) -> Any:
    import cupy

    return cupy.full(nbytes // 8, 3.0)


def _touch(x: Any) -> float:
    return float(x[-1])


@pytest.mark.multigpu
def test_two_gpus_by_peer_access() -> None:
    """LocalCUDACluster on two GPUs: values cross by IPC over the peer link;
    a 2 GiB array's worker-to-worker time is printed (benchmarks measure it)."""
    pytest.importorskip("cupy")
    from distributed import Client

    from cudask import LocalCUDACluster

    with (
        LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0,1", dashboard_address=":0", device_memory_limit="32GB"
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = sorted(workers_info(client))
        results = _exchange(client, a, b)
        x = client.submit(_fill, 2048 * MiB, workers=[a], pure=False)
        x.result(timeout=120)
        start = time.perf_counter()
        assert client.submit(_touch, x, workers=[b], pure=False).result(timeout=120) == 3.0
        print(f"2 GiB worker to worker: {time.perf_counter() - start:.3f} s")
        stats = client.run(_ipc_stats)
    for kind, there, here in results:
        assert there == here, kind
    assert stats[b]["received"] >= 5, stats


def _cells(block_info: Any = None, n: int = 0) -> Any:
    import cupy

    (r0, r1), (c0, c1) = block_info[None]["array-location"]
    return cupy.arange(r0, r1, dtype="f8")[:, None] * n + cupy.arange(c0, c1, dtype="f8")[None, :]


@pytest.mark.gpu
def test_all_to_all_rechunk_of_device_arrays_works_by_default() -> None:
    """dask would choose P2P for this rechunk, which cannot carry CuPy arrays;
    a process running a LocalCUDACluster rechunks by tasks unless told otherwise."""
    cupy = pytest.importorskip("cupy")
    import dask
    import dask.array as da
    from dask.array.rechunk import _choose_rechunk_method
    from distributed import Client

    from cudask import LocalCUDACluster

    n, k = 8192, 16
    old, new = ((n // k,) * k, (n,)), ((n,), (n // k,) * k)
    with dask.config.set({"array.rechunk.method": None}):
        with LocalCUDACluster(dashboard_address=":0") as cluster, Client(cluster):
            assert dask.config.get("array.rechunk.method") == "tasks"
            x = da.map_blocks(_cells, n=n, dtype="f8", chunks=old, meta=cupy.empty((0, 0)))
            y = x.rechunk(new)
            assert isinstance(y._meta, cupy.ndarray)
            total = float(y.sum().compute())
        with dask.config.set({"array.rechunk.method": None}), Client(processes=False, n_workers=1):
            assert _choose_rechunk_method(old, new) == "p2p"  # what dask alone would pick
    assert total == n * n * (n * n - 1) / 2


def _mapped() -> int:
    from cudask.comm import ipc

    return ipc.mapped()


def _passing() -> int:
    """Mappings open here that are not of a running worker's lasting allocation
    (its pool slabs, its staging area): a message's, a leased chunk's, a dead process's."""
    import math

    from cudask.comm import ipc, lifetimes

    mappings = ipc._state.mappings
    with mappings._lock:
        kept = [
            m.sender
            for m in mappings._open.values()
            if m.sender is not None and m.expires == math.inf
        ]
        passing = len(mappings._open) - len(kept)
    return passing + sum(1 for sender in kept if not lifetimes.alive(sender))


def _none_passing(client: Any, workers: list[str]) -> bool:
    return all(n == 0 for n in client.run(_passing, workers=workers).values())


def _mapped_from(pid: int) -> int:
    """Mappings open here of allocations of process `pid`."""
    from cudask.comm import ipc

    mappings = ipc._state.mappings
    with mappings._lock:
        return sum(
            1 for m in mappings._open.values() if m.sender is not None and m.sender.pid == pid
        )


def _pid() -> int:
    import os

    return os.getpid()


# victim, the IPC call held, bytes per value: just over the staging area (1 GiB), so the
# value goes from its own allocation, or small enough to be staged every round while the
# slots of the rounds before, whose sends failed, stay held (staging.FAILED_HOLD)
KILLS = {
    "sender": ("export", (1 << 30) + (1 << 20)),
    "receiver": ("open", (1 << 30) + (1 << 20)),
    "receiver-staged": ("copy", 64 * MiB),
}


@pytest.mark.gpu
@pytest.mark.parametrize("victim", list(KILLS))
def test_a_worker_killed_mid_transfer(victim: str, tmp_path: Path) -> None:
    """SIGKILL the sending or the receiving worker while an array is on its way by
    IPC, three rounds: every result still comes back right (lost values are
    recomputed after the nanny restarts the worker) and no worker is left holding a
    mapping but those of a running peer's staging area. The arrays are larger than
    the staging area, or (receiver-staged) fit it, so the receiver copies from the
    area it mapped ahead. The kill lands in flight, for certain: the victim's next IPC call is
    held (ipc_hold) and the test kills it once the victim says it is there: the
    sender making the handle the receiver asked for, or the receiver holding a
    handle the sender counted as sent, nothing of it mapped yet (receiver-staged:
    the area mapped, nothing copied yet)."""
    pytest.importorskip("cupy")
    import os
    import signal

    from distributed import wait

    method, nbytes = KILLS[victim]
    with worker_processes(["0", "0"], args=["--device-memory-limit", "16GB"]) as client:
        a, b = sorted(workers_info(client))
        names = {a: "w0", b: "w1"}
        for round_ in range(3):
            # each worker (a restarted one too) has met the other: areas made and mapped ahead
            assert wait_for(
                lambda: (
                    all(client.run(_introduced).values())
                    and all(s["staging-bytes"] > 0 for s in client.run(_staging_stats).values())
                ),
                timeout=120,
            )
            staged = client.run(_staging_stats, workers=[a])[a]["staged"]
            xs = [
                client.submit(
                    make_value,
                    100 + 10 * round_ + i,
                    nbytes,
                    "f8",
                    workers=[a],
                    allow_other_workers=True,
                    pure=False,
                )
                for i in range(3)
            ]
            wait(xs)
            there = client.gather(
                [
                    client.submit(digest, x, workers=[a], allow_other_workers=True, pure=False)
                    for x in xs
                ]
            )
            target = a if victim == "sender" else b
            pid = client.run(_pid, workers=[target])[target]
            sent = client.run(_ipc_stats, workers=[a])[a]["sent"]
            marker = tmp_path / f"holding-{round_}"
            client.run(hold_next, method, str(marker), workers=[target])
            here = [
                client.submit(digest, x, workers=[b], allow_other_workers=True, pure=False)
                for x in xs
            ]
            assert wait_for(marker.exists, timeout=120), "no transfer by IPC began"
            assert marker.read_text() == str(pid)  # the victim is the one holding it
            if victim != "sender":  # the sender, not held, answers: it sent the handle
                assert client.run(_ipc_stats, workers=[a])[a]["sent"] > sent
            os.kill(pid, signal.SIGKILL)
            assert client.gather(here) == there
            if (
                victim == "receiver-staged"
            ):  # the sender lives on: its area took this round's values
                assert client.run(_staging_stats, workers=[a])[a]["staged"] > staged
            client.wait_for_workers(2, timeout=180)
            workers = list(workers_info(client))
            by_name = {info["name"]: addr for addr, info in workers_info(client).items()}
            a, b = by_name[names[a]], by_name[names[b]]
            names = {a: "w0", b: "w1"}
            # leased mappings close a quarter of a lease after their last use (cudask.comm.leases),
            # the killed worker's staging area at the receiver's next sweep
            assert wait_for(functools.partial(_none_passing, client, workers), timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "placement",
    [
        ["0", "0"],
        pytest.param(["0", "1"], marks=pytest.mark.multigpu),
        pytest.param(["0,1"], marks=pytest.mark.multigpu),
    ],
    ids=["one-gpu", "two-gpus", "two-gpus-one-process"],
)
def test_pool_slabs_stay_mapped(placement: list[str]) -> None:
    """With an RMM pool that CuPy allocates from, each worker maps the other's pool
    slab when they start (cudask.comm.ahead: opening a mapping of a slab costs
    milliseconds per GB) and keeps it for every transfer; every value arrives
    identical. Once the sender is killed, the receiver closes the mapping (its
    sweep runs every 2 s)."""
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    import os
    import signal

    args = [
        "--device-memory-limit",
        "16GB",
        "--rmm-pool-size",
        "4GiB",
        "--set-rmm-allocator-for-libs",
        "cupy",
    ]
    with worker_processes(placement, args=args) as client:
        a, b = sorted(workers_info(client))
        assert wait_for(
            lambda: all(s["mappings-opened-ahead"] == 1 for s in client.run(_ipc_stats).values()),
            timeout=120,
        )
        for i in range(4):  # one message each: each finds the mapping made ahead
            x = client.submit(make_value, 300 + i, 256 * MiB, "f8", workers=[a], pure=False)
            there = client.submit(digest, x, workers=[a], pure=False).result(timeout=120)
            assert client.submit(digest, x, workers=[b], pure=False).result(timeout=120) == there
            del x
        stats = client.run(_ipc_stats, workers=[b])[b]
        assert stats["received"] >= 4 and stats["mappings-opened"] == 0, stats
        assert stats["mappings-reused"] >= 4 and stats["mappings-kept"] == 1, stats
        pid = client.run(_pid, workers=[a])[a]
        os.kill(pid, signal.SIGKILL)  # its nanny starts another, whose slab b maps ahead
        assert wait_for(lambda: client.run(_mapped_from, pid, workers=[b])[b] == 0, timeout=120)


def _lease_stats() -> dict[str, float]:
    from cudask.comm import leases

    return leases.stats()


def _give_back_cached_blocks() -> None:
    from cudask.comm.leases import current_pool

    current_pool().free_all_blocks()


def _keys(dask_worker: Any) -> int:
    return len(dask_worker.data)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "placement",
    [["0", "0"], pytest.param(["0", "1"], marks=pytest.mark.multigpu)],
    ids=["one-gpu", "two-gpus"],
)
def test_leased_chunks_stay_mapped(placement: list[str]) -> None:
    """Without an RMM pool, the worker's CuPy allocates from cudask's leasing pool:
    the receiver maps a sent chunk once and keeps it for the next transfers, every
    value identical. When the sender's pool gives its cached chunks back, the sent
    one stays allocated until its lease ends; the receiver closes its mapping after
    a quarter of the lease, and the sender then frees the chunk, none closed late."""
    pytest.importorskip("cupy")
    # mappings kept 7.5 s after each use; no staging area, which would carry these values
    env = {
        "DASK_CUDASK__COMM__DEVICE_IPC_LEASE": "30s",
        "DASK_CUDASK__COMM__DEVICE_IPC_STAGING": "0",
    }
    with worker_processes(placement, env=env, args=["--device-memory-limit", "16GB"]) as client:
        a, b = sorted(workers_info(client))
        assert client.run(_lease_stats, workers=[a])[a]["lease-seconds"] == 30.0
        for i in range(4):  # one 256 MiB value at a time: each in the chunk the last one left
            x = client.submit(make_value, 400 + i, 256 * MiB, "f8", workers=[a], pure=False)
            there = client.submit(digest, x, workers=[a], pure=False).result(timeout=120)
            assert client.submit(digest, x, workers=[b], pure=False).result(timeout=120) == there
            del x
            assert wait_for(lambda: client.run(_keys, workers=[a])[a] == 0, timeout=120)
        stats = client.run(_ipc_stats, workers=[b])[b]
        assert stats["received"] >= 4 and stats["mappings-reused"] >= 1, stats
        assert stats["mappings-opened"] + stats["mappings-reused"] == stats["received"], stats
        client.run(_give_back_cached_blocks, workers=[a])
        assert client.run(_lease_stats, workers=[a])[a]["chunks-retired-bytes"] >= 256 * MiB
        assert wait_for(lambda: client.run(_mapped, workers=[b])[b] == 0, timeout=120)
        assert wait_for(
            lambda: client.run(_lease_stats, workers=[a])[a]["chunks-retired-bytes"] == 0,
            timeout=120,
        )
        assert client.run(_lease_stats, workers=[a])[a]["chunks-freed-late"] >= 1
        assert client.run(_ipc_stats, workers=[b])[b]["mappings-closed-late"] == 0


def _staging_stats() -> dict[str, float]:
    from cudask.comm import staging

    return staging.stats()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "placement",
    [["0", "0"], pytest.param(["0", "1"], marks=pytest.mark.multigpu)],
    ids=["one-gpu", "two-gpus"],
)
def test_a_staging_area_is_mapped_once(placement: list[str]) -> None:
    """With a staging area, each value that fits goes as a copy in it: the receiver
    maps the sender's area once (at start or on the first value) whatever chunk of
    CuPy's pool each value came from, every value identical; a value larger than
    the area goes from its own allocation."""
    pytest.importorskip("cupy")
    env = {"DASK_CUDASK__COMM__DEVICE_IPC_STAGING": "512MiB"}
    with worker_processes(placement, env=env, args=["--device-memory-limit", "16GB"]) as client:
        a, b = sorted(workers_info(client))
        # made once the workers have met (cudask.comm.ahead)
        assert wait_for(
            lambda: client.run(_staging_stats, workers=[a])[a]["staging-bytes"] == 512 * MiB,
            timeout=120,
        )
        kept = []
        for i, (kind, nbytes) in enumerate(
            (
                ("f8", 64 * MiB),
                ("view", 96 * MiB),
                ("block", 128 * MiB),
                ("reversed", 32 * MiB),
                ("f8", 768 * MiB),
            )
        ):
            x = client.submit(make_value, 600 + i, nbytes, kind, workers=[a], pure=False)
            kept.append(x)  # held: each later value lands in another chunk
            there = client.submit(digest, x, workers=[a], pure=False).result(timeout=120)
            assert client.submit(digest, x, workers=[b], pure=False).result(timeout=120) == there, (
                kind
            )
        # every slot given back once its send ended (the sender's keep_alive may still be ending)
        assert wait_for(
            lambda: client.run(_staging_stats, workers=[a])[a]["staging-in-use"] == 0, timeout=120
        )
        staged = client.run(_staging_stats, workers=[a])[a]
        assert staged["staged"] == 4 and staged["staging-failed"] == 0, (
            staged
        )  # the 768 MiB one: direct
        stats = client.run(_ipc_stats, workers=[b])[b]
        assert stats["received"] == 5, stats
        # the area once (ahead, or by the first value) and the large value's own chunk
        assert stats["mappings-opened"] + stats["mappings-opened-ahead"] == 2, stats


def _introduced(dask_worker: Any) -> bool:
    """Whether the worker's exchange with its host's peers has nothing under way."""
    exchange = dask_worker.plugins["cudask-device-ipc"]._ahead
    return exchange is not None and not exchange.tasks


@pytest.mark.gpu
def test_a_worker_alone_on_its_host_makes_no_staging_area() -> None:
    """The area is made when a worker first meets a peer of its host: one alone holds none."""
    pytest.importorskip("cupy")
    with worker_processes(["0"], args=["--device-memory-limit", "16GB"]) as client:
        (a,) = workers_info(client)
        assert wait_for(lambda: client.run(_introduced, workers=[a])[a], timeout=120)
        assert client.run(_staging_stats, workers=[a])[a]["staging-bytes"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rmm",
    [["--rmm-async"], ["--rmm-managed-memory"], ["--rmm-async", "--rmm-pool-size", "2GB"]],
    ids=["async", "managed", "async-pool"],
)
def test_memory_cuda_cannot_export_goes_through_the_area(rmm: list[str]) -> None:
    """CuPy allocating from RMM's cudaMallocAsync or managed memory, which CUDA IPC
    cannot export: a value that fits the staging area goes as a copy in it, one that
    does not goes through host memory (declined), both identical on arrival."""
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    env = {"DASK_CUDASK__COMM__DEVICE_IPC_STAGING": "512MiB"}
    args = ["--device-memory-limit", "16GB", *rmm, "--set-rmm-allocator-for-libs", "cupy"]
    with worker_processes(["0", "0"], env=env, args=args) as client:
        a, b = sorted(workers_info(client))
        assert wait_for(
            lambda: client.run(_staging_stats, workers=[a])[a]["staging-bytes"] == 512 * MiB,
            timeout=120,
        )
        for i, nbytes in enumerate((64 * MiB, 768 * MiB)):
            x = client.submit(make_value, 700 + i, nbytes, "f8", workers=[a], pure=False)
            there = client.submit(digest, x, workers=[a], pure=False).result(timeout=120)
            assert client.submit(digest, x, workers=[b], pure=False).result(timeout=120) == there
        assert wait_for(
            lambda: client.run(_staging_stats, workers=[a])[a]["staging-in-use"] == 0, timeout=120
        )
        assert client.run(_staging_stats, workers=[a])[a]["staged"] == 1
        sender = client.run(_ipc_stats, workers=[a])[a]
        assert sender["declined"] == 1 and sender["sent"] == 1, sender  # the 768 MiB value
        assert client.run(_ipc_stats, workers=[b])[b]["received"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("sent", [False, True], ids=["kept-to-itself", "sent"])
def test_a_sent_pool_outlives_its_worker(sent: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RMM plugin's teardown frees the pool's slabs, unless one of them went to
    another worker by IPC handle: peers keep such slabs mapped until this process
    ends, so the pool is held until then (the deallocation the recording upstream
    sees is the real one, made when the pool is destroyed)."""
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    import gc
    import types

    from cudask.comm import lifetimes
    from cudask.worker.rmm import RMMSetup

    monkeypatch.setattr(lifetimes, "_pools", [])
    monkeypatch.setattr(lifetimes, "_kept", [])  # dropped, pool and all, when the test ends
    plugin = RMMSetup(
        pool_size=256 * MiB,
        maximum_pool_size=None,
        managed_memory=False,
        async_alloc=False,
        release_threshold=None,
        log_directory=None,
        track_allocations=False,
    )
    plugin.setup(types.SimpleNamespace(name="w0"))
    recorded = plugin.slabs
    assert recorded is not None and len(recorded.bases) == 1, recorded  # the initial pool
    slab = next(iter(recorded.bases))
    if sent:
        assert lifetimes.sending(slab)
    plugin.teardown(types.SimpleNamespace(name="w0"))
    gc.collect()
    assert (slab in recorded.bases) == sent  # freed by the pool's end unless kept
    assert len(lifetimes._kept) == int(sent) and not lifetimes.sending(slab)


class _ExportRefused:
    """CudaBackend whose export fails, as when the driver refuses a handle."""

    def __init__(self) -> None:
        from cudask.comm.ipc_cuda import CudaBackend

        self.backend = CudaBackend()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def export(self, ptr: int) -> tuple[bytes, int]:
        raise RuntimeError("cudaErrorMapBufferObjectFailed")


@pytest.mark.gpu
def test_an_area_that_cannot_be_exported_is_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An area whose handle cannot be exported goes back to the GPU; no area is made."""
    cupy = pytest.importorskip("cupy")
    from cudask.comm import staging

    monkeypatch.setattr(staging, "_area", None)
    monkeypatch.setattr(staging, "_copier", None)
    monkeypatch.setattr(staging, "_pending", None)
    runtime = cupy.cuda.runtime
    runtime.free(0)  # the primary context, before the first reading
    before = runtime.memGetInfo()[0]
    staging.defer(_ExportRefused(), 1 << 30)
    assert staging.ensure() is None and staging.stats()["staging-bytes"] == 0
    assert runtime.memGetInfo()[0] > before - 64 * MiB  # the 1 GiB came back
