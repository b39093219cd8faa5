"""dask-jobqueue: batch jobs whose workers are cudask's, one per GPU of the job.

Covers: `job_kwargs()`, the keywords that make a dask-jobqueue cluster
(SLURMCluster, PBSCluster, or jobqueue's LocalCluster, which runs the job script
as a local process) run `python -m cudask.cli worker` in each job:

- `worker_command="cudask.cli worker"` (jobqueue runs `python -m <worker_command>`),
- `processes` = GPUs per job (x workers_per_gpu): `cudask worker` starts one
  worker per GPU the job sees (or N), named NAME-0, NAME-1, ... as jobqueue names
  the processes of a job, and jobqueue hands each process `cores / processes`
  threads and `memory / processes` of host memory,
- the GPU request: `#SBATCH --gres=gpu:N` (SLURM), `#PBS -l select=1:ncpus=C:ngpus=N:mem=M`
  (PBS),
- cudask's worker options as `cudask worker` flags (`worker_extra_args`), checked
  the way the CLI checks them, with the same messages, before any job is submitted.

`worker_flags()` gives the flags alone, for the other queue systems.
Does not cover: dask-jobqueue itself (never imported here), nor which GPUs a job
gets: the queue system sets the job's CUDA_VISIBLE_DEVICES.

Threading: pure functions; call them from any thread.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from dask.utils import parse_bytes

from cudask.deploy.checks import check_input
from cudask.errors import OptionError
from cudask.options import BY_NAME, WorkerOptions, flag_args
from cudask.worker import sharing
from cudask.worker.spec import parse_resources

WORKER_COMMAND = "cudask.cli worker"
"""dask-jobqueue's `worker_command`: the job runs `<python> -m cudask.cli worker`."""

QUEUE_SYSTEMS = ("slurm", "pbs", "local")

# Options dask-jobqueue puts on the worker's command line itself, and what sets them.
SET_BY_JOBQUEUE = {
    "nthreads": "cores= (each worker gets cores / gpus_per_job threads)",
    "memory_limit": "memory= (each worker gets memory / gpus_per_job)",
    "name": "the cluster, which names each job's workers",
    "scheduler_file": "the cluster, which passes its scheduler's address",
    "tls_ca_file": "security= of the cluster",
    "tls_cert": "security= of the cluster",
    "tls_key": "security= of the cluster",
}
# Options that are dask-jobqueue keywords of the same name (they reach the workers' flags).
JOB_KEYWORDS = ("local_directory", "death_timeout", "interface", "protocol")


def _check(options: Mapping[str, Any]) -> WorkerOptions:
    """The checks of `cudask worker`, with its messages, but for the optional libraries:
    they need to be where the workers run, not where the jobs are submitted."""
    return check_input(options, "cli", libraries=False)


def _flags(names: Sequence[str], resolved: WorkerOptions) -> list[str]:
    args: list[str] = []
    for name in names:
        value = resolved[name]
        if name == "resources" and isinstance(value, str):
            value = parse_resources(value)  # "GPU=1 MEM=10e9" -> one word, GPU=1.0,MEM=...
        args += flag_args(BY_NAME[name], value)
    return [shlex.quote(a) for a in args]


def worker_flags(options: Mapping[str, Any]) -> list[str]:
    """`cudask worker` flags (shell-quoted) for worker options given as keywords
    (docs/options.md), checked as the CLI checks them."""
    return _flags(list(options), _check(options))


def _pbs_memory(n: int) -> str:
    """PBS's mem= for n bytes (binary units, named kb/mb/gb), rounded up."""
    if n >= 10 * 2**30:
        return f"{math.ceil(n / 2**30)}gb"
    return f"{math.ceil(n / 2**20)}mb"


def _check_job(
    queue_system: str,
    gpus_per_job: int,
    cores: int,
    memory: str | int,
    worker_options: dict[str, Any],
) -> int:
    """The job's own keywords checked (the worker options are checked after); its
    memory in bytes."""
    if queue_system not in QUEUE_SYSTEMS:
        raise OptionError(
            f"queue_system={queue_system!r} is not accepted; accepted: "
            f"{', '.join(QUEUE_SYSTEMS)} (for others, give worker_command="
            f"{WORKER_COMMAND!r} and worker_extra_args=worker_flags(...) yourself)"
        )
    if isinstance(gpus_per_job, bool) or not isinstance(gpus_per_job, int) or gpus_per_job < 1:
        raise OptionError(
            f"gpus_per_job={gpus_per_job!r} is not accepted; accepted: a whole "
            "number of at least 1, e.g. gpus_per_job=4"
        )
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < gpus_per_job:
        raise OptionError(
            f"cores={cores!r} is not accepted; accepted: a whole number of at "
            f"least gpus_per_job={gpus_per_job} (each GPU's worker gets cores / "
            f"gpus_per_job threads), e.g. cores={8 * gpus_per_job}"
        )
    for name, value in worker_options.items():
        if name in SET_BY_JOBQUEUE:
            raise OptionError(
                f"{name}={value!r}: dask-jobqueue sets this for "
                f"each worker; give {SET_BY_JOBQUEUE[name]} instead"
            )
    if worker_options.get("nanny") is False and gpus_per_job > 1:
        raise OptionError(
            f"nanny=False runs one worker in the job's process, so it needs "
            f"gpus_per_job=1, not {gpus_per_job}"
        )
    try:
        job_memory = parse_bytes(memory) if isinstance(memory, str) else memory
    except (ValueError, TypeError):
        job_memory = None
    if isinstance(job_memory, bool) or not isinstance(job_memory, int) or job_memory <= 0:
        raise OptionError(
            f"memory={memory!r} is not accepted; accepted: the job's host memory "
            "as bytes or a string such as '64GB'"
        )
    return job_memory


def job_kwargs(
    queue_system: str,
    *,
    gpus_per_job: int = 1,
    cores: int,
    memory: str | int,
    job_extra_directives: Sequence[str] = (),
    **worker_options: Any,
) -> dict[str, Any]:
    """Keywords for a dask-jobqueue cluster of GPU jobs running cudask workers.

    `queue_system` is 'slurm' (SLURMCluster), 'pbs' (PBSCluster) or 'local'
    (dask_jobqueue.LocalCluster); `cores` and `memory` are the whole job's, as
    jobqueue takes them; `job_extra_directives` are added after the GPU request;
    other keywords are cudask worker options (e.g. device_memory_limit='60GB',
    rmm_pool_size='40GB'). Example::

        SLURMCluster(queue="gpu", walltime="02:00:00", **job_kwargs(
            "slurm", gpus_per_job=4, cores=32, memory="256GB", device_memory_limit=0.8))
    """
    job_memory = _check_job(queue_system, gpus_per_job, cores, memory, worker_options)
    resolved = _check(worker_options)
    per_gpu = sharing.workers_per_gpu(resolved)
    if per_gpu > 1:
        if cores < gpus_per_job * per_gpu:
            raise OptionError(
                f"cores={cores!r} is fewer than the job's {gpus_per_job * per_gpu} "
                f"workers (gpus_per_job={gpus_per_job} x workers_per_gpu="
                f"{per_gpu}); each needs a thread, e.g. "
                f"cores={8 * gpus_per_job * per_gpu}"
            )
        worker_options = {**worker_options, "workers_per_gpu": per_gpu}  # as the workers see it
    kwargs: dict[str, Any] = {
        "cores": cores,
        "memory": memory,
        "processes": gpus_per_job * per_gpu,
        "worker_command": WORKER_COMMAND,
        "worker_extra_args": _flags([k for k in worker_options if k not in JOB_KEYWORDS], resolved),
        **{k: resolved[k] for k in JOB_KEYWORDS if k in worker_options},
    }
    directives = list(job_extra_directives)
    if queue_system == "slurm":
        directives.insert(0, f"--gres=gpu:{gpus_per_job}")
    elif queue_system == "pbs":
        kwargs["resource_spec"] = (
            f"select=1:ncpus={cores}:ngpus={gpus_per_job}:mem={_pbs_memory(job_memory)}"
        )
    if directives:
        kwargs["job_extra_directives"] = directives
    return kwargs


__all__ = [
    "JOB_KEYWORDS",
    "QUEUE_SYSTEMS",
    "SET_BY_JOBQUEUE",
    "WORKER_COMMAND",
    "job_kwargs",
    "worker_flags",
]
