"""Other processes' CUDA contexts on a worker's GPU, said once in the worker's log.

Covers: `neighbours`, the processes NVML lists on the worker's GPU (or MIG
instance) other than the worker itself and the other workers of its cluster or
node (processes with the same parent that run as children of Python's
multiprocessing: the nannies of one LocalCUDACluster or `cudask worker` live in
one process and start their workers so, those of several workers per GPU too);
`report`, which CUDAContext calls once its context exists: one WARNING line
naming each such process (pid, command line, memory it holds). The process that
started the worker is named as such (a client that used the GPU before its
cluster started). Where NVML numbers processes in another pid namespace (a
container of its own: the worker is not found under its pid), nothing can be
told apart and only a DEBUG line is written.

Does not cover: the processes of the cluster itself, warned about at start
(cudask.deploy.contexts); contexts made after the worker started.

Threading: reads NVML and /proc from the calling thread (the worker's event
loop, at plugin setup); no state of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from dask.utils import format_bytes

from cudask.devices import GPUProcess, ProcessBackend, default_backend

logger = logging.getLogger("cudask.worker")

STARTER = "the process that started this worker"


@dataclass(frozen=True)
class Neighbour:
    """A process with a context on the worker's GPU: `role` says whose it is,
    `command` its command line where /proc shows it."""

    process: GPUProcess
    role: str
    command: str | None


def _parent(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat") as fh:
            text = fh.read()
        return int(text.rsplit(")", 1)[1].split()[1])  # the field after the state
    except (OSError, IndexError, ValueError):
        return None


def _spawned(pid: int, parent: int, proc: str) -> bool:
    """Whether `pid` runs as a child of Python's multiprocessing (spawn or
    forkserver; fork: its parent's command line), as the workers a nanny starts
    do; a process its parent started otherwise (a subprocess of the client) is
    not one of the cluster's."""
    command = _command(pid, proc, limit=4096) or ""
    return "multiprocessing" in command or command == _command(parent, proc, limit=4096)


def _command(pid: int, proc: str, limit: int = 80) -> str | None:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return (text[: limit - 3] + "...") if len(text) > limit else (text or None)


def neighbours(
    uuid: str, *, pid: int | None = None, backend: ProcessBackend | None = None, proc: str = "/proc"
) -> list[Neighbour] | None:
    """The processes on device `uuid` that are neither this worker (`pid`, default
    this process) nor a worker of its cluster; None when NVML cannot list them or
    does not list this worker under its pid (another pid namespace)."""
    backend = backend if backend is not None else default_backend()
    pid = os.getpid() if pid is None else pid
    listed = backend.compute_processes(uuid)
    if not any(p.pid == pid for p in listed):
        return None
    parent = _parent(pid, proc)
    out = []
    for p in listed:
        if p.pid == pid:
            continue
        if p.pid == parent:
            role = STARTER
        elif (
            parent is not None and _parent(p.pid, proc) == parent and _spawned(p.pid, parent, proc)
        ):
            continue  # a worker started by the same process: this cluster's
        else:
            role = "another process"
        out.append(Neighbour(p, role, _command(p.pid, proc)))
    return out


def describe(worker: object, label: str, found: list[Neighbour]) -> str:
    """The log line: which processes, how much each holds, what it means."""
    parts = []
    for n in found:
        held = (
            format_bytes(n.process.used_memory)
            if n.process.used_memory is not None
            else "memory not reported"
        )
        who = ", ".join(x for x in (n.role if n.role == STARTER else None, n.command, held) if x)
        parts.append(f"pid {n.process.pid} ({who})")
    return (
        f"cudask: worker {worker}: {label} also holds CUDA contexts of {len(found)} other "
        f"process(es): {'; '.join(parts)}. This worker's memory limits do not count their "
        "memory; a client or library that used this GPU before the cluster started, or "
        "another job on this GPU, leaves it less (docs/cuda-contexts.md)"
    )


def report(
    worker: object, uuid: str, *, label: str | None = None, backend: ProcessBackend | None = None
) -> list[Neighbour] | None:
    """Log once (WARNING) the other processes holding contexts on `uuid`; return
    them (None: NVML could not tell). Never raises for NVML's or /proc's sake."""
    try:
        found = neighbours(uuid, backend=backend)
    except Exception as exc:  # noqa: BLE001 - NVMLUnavailable, or a driver's surprise: say nothing
        logger.debug("cudask: worker %s: cannot list the processes on %s: %s", worker, uuid, exc)
        return None
    if found is None:
        logger.debug(
            "cudask: worker %s: NVML does not list this process on %s (another pid "
            "namespace?): other processes' contexts cannot be told apart",
            worker,
            uuid,
        )
    elif found:
        logger.warning(describe(worker, label or uuid, found))
    return found


__all__ = ["STARTER", "Neighbour", "describe", "neighbours", "report"]
