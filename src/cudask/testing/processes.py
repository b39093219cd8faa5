"""GPU workers of one host as separate worker processes (`cudask worker`, or
any command such as dask-cuda's), joined to a scheduler in this process: how
`cudask bench transfer` and the IPC tests put two workers on one GPU (["0", "0"]),
one on each of two, each process seeing its GPU alone (["0", "1"]), or one
process over two GPUs, which starts a worker per GPU with the others visible
(["0,1"]: as `dask cuda worker` on a node and LocalCUDACluster do).

Covers: `worker_processes(placement, ...)`, the scheduler, the worker processes and
their logs, stopped on exit (the client closed first, so the scheduler forgets its keys
rather than reports them lost; then each process sent SIGTERM); a process that ends
before its workers join is reported with every other that ends too. Does not cover: what
runs on them. Threading: the caller's thread; the scheduler runs on the cluster's
event-loop thread, and the caller's thread only tests whether a client id is among its
clients and asks joined workers their process ids through the client."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import psutil

from cudask.testing import wait_for


@contextmanager
def worker_processes(
    placement: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log_dir: str | Path | None = None,
    args: Sequence[str] = (),
    command: Sequence[str] | None = None,
    protocol: str = "tcp",
    timeout: float = 180,
) -> Iterator[Any]:
    """A distributed Client of a fresh scheduler (listening on `protocol`) with one
    worker process per entry of `placement`, each entry its CUDA_VISIBLE_DEVICES:
    `command` + [scheduler address, --name wI (an entry of one GPU), --protocol
    PROTOCOL] + `args` (default command: this interpreter's `-m cudask.cli
    worker`), which starts one worker per GPU of its entry. `env` adds to the
    environment.
    The workers' stderr goes to `log_dir`/worker-I.log when given (else to
    temporary files). A worker that does not join within `timeout` seconds ends
    it in RuntimeError with what the workers wrote; an exception raised in the
    block carries the end of each worker's log as a note."""
    from distributed import Client, LocalCluster

    with ExitStack() as stack:
        cluster = stack.enter_context(
            LocalCluster(n_workers=0, protocol=protocol, dashboard_address=":0")
        )
        client = stack.enter_context(Client(cluster))
        # Files, not pipes: a pipe nobody reads fills and stops a worker that logs.
        logs = [stack.enter_context(_log_file(log_dir, i)) for i in range(len(placement))]
        prefix = list(command or [sys.executable, "-m", "cudask.cli", "worker"])
        gpus = [len(devices.split(",")) for devices in placement]
        procs = [
            subprocess.Popen(
                [
                    *prefix,
                    cluster.scheduler_address,
                    *(["--name", f"w{i}"] if gpus[i] == 1 else []),
                    "--protocol",
                    protocol,
                    *args,
                ],
                env={**os.environ, **(env or {}), "CUDA_VISIBLE_DEVICES": devices},
                stdout=subprocess.DEVNULL,
                stderr=logs[i],
            )
            for i, devices in enumerate(placement)
        ]
        try:
            _wait_for_join(client, procs, gpus, logs, timeout)  # its error carries the logs already
            try:
                yield client
            except BaseException as exc:
                # What the workers wrote (and whether they still run) is what explains
                # a failure or a hang in the block.
                for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
                    state = "running" if p.poll() is None else f"exit code {p.returncode}"
                    exc.add_note(
                        f"worker process {i} ({state}), end of its log:\n{_tail(log, 4000)}"
                    )
                raise
        finally:
            # The client first, so that the scheduler forgets its keys rather than reports
            # them lost; then SIGTERM: each nanny closes its worker. (No retire_workers: it
            # would move data between the workers, and its close raced the nanny's.)
            try:
                _close_client(client, cluster.scheduler)
            finally:  # the processes stop even when closing the client fails
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(60)
                    except subprocess.TimeoutExpired:
                        p.kill()


def _close_client(client: Any, scheduler: Any, seconds: float = 30) -> None:
    """Close `client` and wait, at most `seconds`, until the scheduler has removed it,
    which releases its keys (a synchronous Client.close waits at most 0.1 s for that)."""
    client_id = client.id
    client.close()
    wait_for(lambda: client_id not in scheduler.clients, timeout=seconds)


def _wait_for_join(
    client: Any,
    procs: list[subprocess.Popen],
    gpus: Sequence[int],
    logs: list[IO[str]],
    timeout: float,
) -> None:
    """Until every process's workers (`gpus[i]` of process i) have joined. A process
    that ends first is a RuntimeError naming every process that ended, once each of
    the others has joined or ended too (processes started alike often fail alike, one
    a moment after the other); `timeout` seconds passing is one as well. Both carry
    what the workers wrote."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.wait_for_workers(sum(gpus), timeout=2)
            return
        except TimeoutError:
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            break
    # Settled: each process has ended or has all its workers joined, or time is up.
    wait_for(
        lambda: all(
            p.poll() is not None or joined >= n
            for p, joined, n in zip(procs, _joined(client, procs), gpus, strict=True)
        ),
        timeout=max(deadline - time.monotonic(), 0),
        interval=0.2,
    )
    ended = [i for i, p in enumerate(procs) if p.poll() is not None]
    for p in procs:
        p.kill()
    what = f"worker process(es) {ended} ended" if ended else f"not joined within {timeout} s"
    raise RuntimeError(
        f"cudask worker processes: {what}: " + " | ".join(_tail(log) for log in logs)
    )


def _joined(client: Any, procs: Sequence[subprocess.Popen]) -> list[int]:
    """How many workers of each process have joined the scheduler: a worker is the
    process's own (no nanny) or one of its descendants (under a nanny)."""
    owner = {p.pid: i for i, p in enumerate(procs)}
    counts = [0] * len(procs)
    for pid in client.run(os.getpid, on_error="ignore").values():
        try:
            worker = psutil.Process(pid)
            lineage = [worker, *worker.parents()]
        except psutil.Error:  # ended meanwhile
            continue
        index = next((owner[q.pid] for q in lineage if q.pid in owner), None)
        if index is not None:
            counts[index] += 1
    return counts


def _log_file(log_dir: str | Path | None, i: int) -> IO[str]:
    if log_dir is None:
        return tempfile.TemporaryFile("w+")  # the caller's ExitStack closes it
    return open(Path(log_dir) / f"worker-{i}.log", "w+")


def _tail(log: Any, chars: int = 1500) -> str:
    log.seek(0)
    return str(log.read())[-chars:]
