"""The table of worker options: each option declared once, with its `--help` section.

Covers: `OPTIONS` (name, kind, default, help, bounds, the surfaces it appears on:
LocalCUDACluster, CUDAWorker, the CLI), `GROUPS` (the sections of `cudask worker
--help`), and the lookups `BY_NAME`, `BY_CLUSTER_KEYWORD` and `options_for`. The
keywords, flags and docs/options.md are generated from here. Does not cover: reading
and checking values (cudask.options, cudask.option_value).

Threading: built at import and never changed; read it from any thread.
"""

from __future__ import annotations

from typing import Any

from cudask.option_value import ALL, Option, Surface

NODE: frozenset[Surface] = frozenset({"worker", "cli"})  # one node's workers, not LocalCUDACluster


def _bool(
    name: str,
    help: str,
    cfg: str | None = None,
    *,
    on: str | None = None,
    off: str | None = None,
    group: str = "workers",
    surfaces: frozenset[Surface] = ALL,
    tristate: bool = False,
    default: Any = None,
) -> Option:
    flag = on or "--" + name.replace("_", "-")
    return Option(
        name,
        "tristate" if tristate else "bool",
        help,
        config=cfg,
        flag=flag,
        secondary=off or "--no-" + flag[2:],
        group=group,
        surfaces=surfaces,
        default=default,
    )


OPTIONS: tuple[Option, ...] = (
    # group: the section of `cudask worker --help` (GROUPS)
    Option(
        "nthreads",
        "int",
        "Threads of each worker.",
        config="threads-per-worker",
        cluster_name="threads_per_worker",
        minimum=1,
        group="workers",
    ),
    Option(
        "workers_per_gpu",
        "int",
        "Workers on each GPU (several for many small tasks, or a "
        "GPU shared by jobs): each gets 1/N of device_memory_limit, of the RMM pool sizes and "
        "release threshold, an even share of 'auto' host memory and of the GPU's CPUs; "
        "LocalCUDACluster names them GPU-K ('0-1'), a named node NAME-0, NAME-1, ... "
        "(docs/workers-per-gpu.md).",
        config="workers-per-gpu",
        minimum=1,
        group="workers",
    ),
    Option(
        "memory_limit",
        "size",
        "Host memory of each worker, past which data spills from "
        "host to disk: bytes, a string such as '40GB', a fraction of system memory, 'auto' "
        "(an even share of system memory) or 0/None for no limit.",
        config="memory-limit",
        group="memory",
    ),
    Option(
        "device_memory_limit",
        "size",
        "Device memory each worker keeps data in before it "
        "spills to host: bytes, '40GB', a fraction of the GPU's memory, 'auto' (all of it), "
        "'default' (80%; off on GPUs without dedicated memory) or 0/None for no spilling.",
        config="device-memory-limit",
        group="memory",
    ),
    Option(
        "local_directory",
        "path",
        "Directory for spilled data and worker files; default: dask's temporary-directory.",
        config="local-directory",
        group="memory",
    ),
    Option(
        "close_timeout",
        "seconds",
        "Seconds the nanny gives its worker to close: a closing "
        "worker has 0.8 of it to remove its spilled files and give back its pinned memory, "
        "then is killed and has as long again to end (distributed.Nanny's close timeout; a "
        "Nanny subclass of your own as worker_class keeps its own): '60s', 90, '2 minutes'.",
        config="close-timeout",
        group="workers",
    ),
    Option(
        "log_spilling",
        "bool",
        "Log every move of data between device, host and disk (INFO, "
        "in the worker's log: logger distributed.worker.memory).",
        config="log-spilling",
        flag="--log-spilling",
        secondary="--no-log-spilling",
        group="memory",
    ),
    _bool(
        "jit_unspill",
        "Hand tasks proxies that stay spilled until the task touches them (JIT-unspill).",
        "jit-unspill",
        on="--enable-jit-unspill",
        off="--disable-jit-unspill",
        group="memory",
    ),
    _bool(
        "gc_freeze",
        "Once the worker has started and imported CuPy, move the objects it "
        "has so far out of the garbage collector's scans (gc.freeze), so that Python's "
        "full collections, which pause every task, scan only what came later.",
        "gc-freeze",
        group="workers",
    ),
    Option(
        "protocol",
        "str",
        "Protocol: 'tcp', 'tls', 'ucx', ... (default: dask's, tcp).",
        config="protocol",
        group="network",
    ),
    Option(
        "interface",
        "str",
        "Network interface to listen on, such as 'eth0' or 'ib0'.",
        config="interface",
        group="network",
    ),
    _bool(
        "enable_tcp_over_ucx",
        "UCX over TCP (protocol 'ucx'); unset leaves the transports to UCX.",
        "enable-tcp-over-ucx",
        on="--enable-tcp-over-ucx",
        off="--disable-tcp-over-ucx",
        group="ucx",
        tristate=True,
    ),
    _bool(
        "enable_infiniband",
        "UCX over InfiniBand (protocol 'ucx').",
        "enable-infiniband",
        on="--enable-infiniband",
        off="--disable-infiniband",
        group="ucx",
        tristate=True,
    ),
    _bool(
        "enable_nvlink",
        "UCX over NVLink / CUDA IPC (protocol 'ucx').",
        "enable-nvlink",
        on="--enable-nvlink",
        off="--disable-nvlink",
        group="ucx",
        tristate=True,
    ),
    _bool(
        "enable_rdmacm",
        "UCX RDMA connection manager (needs InfiniBand).",
        "enable-rdmacm",
        on="--enable-rdmacm",
        off="--disable-rdmacm",
        group="ucx",
        tristate=True,
    ),
    Option(
        "rmm_pool_size",
        "size",
        "RMM pool of each worker: bytes, '20GB' or a fraction of "
        "the GPU's memory; default: no pool.",
        config="rmm-pool-size",
        group="rmm",
    ),
    Option(
        "rmm_maximum_pool_size",
        "size",
        "Largest size the RMM pool may grow to (needs rmm_pool_size or rmm_async).",
        config="rmm-maximum-pool-size",
        group="rmm",
    ),
    _bool(
        "rmm_managed_memory",
        "Allocate CUDA managed (unified) memory through RMM.",
        "rmm-managed-memory",
        group="rmm",
    ),
    _bool(
        "rmm_async",
        "Allocate through cudaMallocAsync (RMM's CudaAsyncMemoryResource).",
        "rmm-async",
        group="rmm",
    ),
    Option(
        "rmm_release_threshold",
        "size",
        "Memory the async pool holds before it releases memory to the system (needs rmm_async).",
        config="rmm-release-threshold",
        group="rmm",
    ),
    Option(
        "rmm_log_directory",
        "path",
        "Directory for RMM allocation logs, one file per worker.",
        config="rmm-log-directory",
        group="rmm",
    ),
    _bool(
        "rmm_track_allocations",
        "Track RMM allocations (read by `cudask config`).",
        "rmm-track-allocations",
        group="rmm",
    ),
    Option(
        "rmm_allocator_external_lib_list",
        "list",
        "Libraries whose GPU allocations go "
        "through RMM: 'cupy', 'torch' (comma-separated or a list).",
        config="rmm-allocator-external-lib-list",
        choices=("cupy", "torch"),
        group="rmm",
        flag="--set-rmm-allocator-for-libs",
        extra_flags=("--rmm-allocator-external-lib-list",),
    ),
    _bool(
        "enable_cudf_spill",
        "cuDF's own spilling too (needs cuDF): when an allocation "
        "fails, cuDF spills its least recently used buffers; the store still holds "
        "device_memory_limit; results reach any client.",
        "enable-cudf-spill",
        on="--enable-cudf-spill",
        off="--disable-cudf-spill",
        group="memory",
    ),
    Option(
        "cudf_spill_stats",
        "int",
        "cuDF spill statistics level: 0, 1 or 2.",
        config="cudf-spill-stats",
        group="memory",
        minimum=0,
        maximum=2,
    ),
    Option(
        "pre_import",
        "list",
        "Modules each worker imports at start; a missing one fails the "
        "start (comma-separated or a list).",
        config="pre-import",
        group="workers",
    ),
    # one node's workers (CUDAWorker and the CLI)
    Option(
        "scheduler_file",
        "path",
        "JSON file the scheduler wrote its address to.",
        surfaces=NODE,
        group="scheduler",
    ),
    Option(
        "host",
        "str",
        "Address the workers listen on and advertise; default: the interface's address.",
        surfaces=NODE,
        group="network",
    ),
    Option(
        "worker_port",
        "any",
        "Port of each worker: a number, or a range FIRST:LAST split "
        "across the GPUs (9000:9003 gives 9000..9003 to 4 workers); default: random.",
        surfaces=NODE,
        group="network",
    ),
    Option(
        "listen_address",
        "str",
        "Address the workers bind to, e.g. tcp://0.0.0.0:9000.",
        surfaces=NODE,
        group="network",
    ),
    Option(
        "contact_address",
        "str",
        "Address the workers advertise to the scheduler.",
        surfaces=NODE,
        group="network",
    ),
    Option(
        "name",
        "any",
        "Worker name (a string, or an int such as dask-mpi's rank): one "
        "worker registers exactly it, several (GPUs x workers_per_gpu) register NAME-0, "
        "NAME-1, ...; default: none (each worker is known by its address, as in distributed).",
        surfaces=NODE,
        group="workers",
    ),
    Option(
        "resources",
        "any",
        "Abstract resources of each worker, e.g. 'GPU=1 MEM=10e9'.",
        surfaces=NODE,
        group="workers",
    ),
    Option("pid_file", "path", "File to write the process id to.", surfaces=NODE, group="workers"),
    Option(
        "expected_gpus",
        "int",
        "GPUs this node must have: with fewer visible, fail at start "
        "naming both numbers (a Kubernetes pod given fewer than its nvidia.com/gpu limit, a "
        "batch job on the wrong nodes); default: none (a worker per GPU visible).",
        surfaces=NODE,
        group="workers",
        minimum=1,
    ),
    Option(
        "preload",
        "list",
        "Modules or scripts each worker preloads (repeatable).",
        surfaces=NODE,
        group="workers",
    ),
    Option(
        "death_timeout",
        "any",
        "Seconds a worker waits for the scheduler before it closes.",
        surfaces=NODE,
        group="scheduler",
    ),
    _bool(
        "dashboard",
        "Serve each worker's diagnostics dashboard.",
        None,
        surfaces=NODE,
        group="network",
        default=True,
    ),
    Option(
        "dashboard_address",
        "str",
        "Address of each worker's dashboard (port 0: random).",
        default=":0",
        surfaces=NODE,
        group="network",
    ),
    Option(
        "dashboard_prefix",
        "str",
        "URL prefix of the workers' dashboards.",
        surfaces=NODE,
        group="network",
    ),
    Option("tls_ca_file", "str", "CA certificate file for TLS.", surfaces=NODE, group="scheduler"),
    Option("tls_cert", "str", "Worker certificate file for TLS.", surfaces=NODE, group="scheduler"),
    Option("tls_key", "str", "Worker private key file for TLS.", surfaces=NODE, group="scheduler"),
    Option(
        "multiprocessing_method",
        "choice",
        "How worker processes are started.",
        default="spawn",
        choices=("spawn", "fork", "forkserver"),
        surfaces=NODE,
        group="workers",
    ),
    _bool(
        "nanny",
        "Run each worker under a Nanny process (--no-nanny for sites that forbid "
        "forking: workers then run in this process).",
        None,
        surfaces=NODE,
        group="workers",
        default=True,
    ),
    Option(
        "worker_class",
        "any",
        "Worker class the nanny starts, or a Nanny subclass to start "
        "instead of the Nanny, as dask-cuda accepts (import path on the CLI).",
        surfaces=ALL,
        group="workers",
    ),
)

#: The sections of `cudask worker --help`, in order: each option's `group` and its title.
GROUPS: dict[str, str] = {
    "scheduler": "Scheduler",
    "workers": "Workers",
    "memory": "Memory and spilling",
    "rmm": "RMM (device memory allocation)",
    "network": "Network and dashboard",
    "ucx": "UCX transports",
}

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
BY_CLUSTER_KEYWORD: dict[str, Option] = {
    o.cluster_keyword: o for o in OPTIONS if "cluster" in o.surfaces
}


def options_for(surface: Surface) -> list[Option]:
    return [o for o in OPTIONS if surface in o.surfaces]


__all__ = ["BY_CLUSTER_KEYWORD", "BY_NAME", "GROUPS", "NODE", "OPTIONS", "options_for"]
