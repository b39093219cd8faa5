"""Worker specs: one Nanny (or Worker) per GPU, or N (workers_per_gpu), from resolved options.

Covers: the one spec builder behind LocalCUDACluster, CUDAWorker and the
CLI — the rotated CUDA_VISIBLE_DEVICES, the data store, the ordered plugin list,
names, ports, UCX config and resources, over the per-device sizes of
cudask.worker.sizing.
Does not cover: starting anything (cudask.deploy) or option rules
(cudask.options).

Threading: no state of its own; call it from any thread.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import dask.config
from dask.utils import parse_bytes
from distributed import Nanny, Worker, WorkerPlugin

from cudask.comm import ipc_settings as comm_settings
from cudask.comm.ipc import SERIALIZERS
from cudask.comm.ucx import transports
from cudask.devices import Device, worker_visible_devices
from cudask.errors import OptionError
from cudask.memory.settings import store_settings
from cudask.options import UCX_PROTOCOLS, WorkerOptions
from cudask.worker.closing import CloseStore
from cudask.worker.closing import Nanny as CUDANanny
from cudask.worker.gpu_worker import GPUWorker
from cudask.worker.metrics import StoreMetrics
from cudask.worker.plugins import (
    CPUAffinity,
    CUDAContext,
    CudfSpill,
    DeviceIPC,
    GCFreeze,
    PreImport,
)
from cudask.worker.rmm import RMMSetup
from cudask.worker.sharing import cpu_share, workers_per_gpu
from cudask.worker.sizing import (
    DeviceSizes,
    check_devices,
    device_ipc_min_size,
    device_sizes,
    host_memory_limit,
    staging_size,
)


def host_tier(memory_limit: int | None) -> tuple[int | None, int | Literal[False]]:
    """Size of the store's host tier and its disk cap, as distributed sizes its own
    SpillBuffer: `distributed.worker.memory.target` (else `.spill`) of the host limit,
    so data reach disk before the memory manager pauses the worker (at `.pause`);
    `max-spill` caps the disk."""
    max_spill = dask.config.get("distributed.worker.memory.max-spill")
    cap: int | Literal[False] = (
        parse_bytes(max_spill)
        if isinstance(max_spill, str)
        else (int(max_spill) if max_spill else False)
    )
    if memory_limit is None:
        return None, cap
    fraction = dask.config.get("distributed.worker.memory.target") or dask.config.get(
        "distributed.worker.memory.spill"
    )
    return (int(memory_limit * fraction) if fraction else memory_limit), cap


def data_store(o: WorkerOptions, sizes: DeviceSizes, memory_limit: int | None) -> Any:
    """The worker's `data=`: the tiered store (JIT-unspill variant when asked), or a
    plain dict when every limit is off."""
    if sizes.device_memory_limit is None and memory_limit is None and not o.jit_unspill:
        return dict
    host, max_spill = host_tier(memory_limit)
    # The cudask.memory.* keys, checked here so a bad one fails before any worker starts.
    store_settings(sizes.device_memory_limit, host)
    kwargs = {
        "device_memory_limit": sizes.device_memory_limit,
        "memory_limit": host,
        "max_spill": max_spill,
        "log_spilling": o.log_spilling,
    }
    if o.jit_unspill:
        from cudask.memory.jit.proxy_store import ProxyStore

        return (ProxyStore, kwargs)
    if sizes.device_memory_limit is None:  # nothing spills from the device: a dict holds it
        from cudask.memory.unlimited import UnlimitedStore

        kwargs.pop("device_memory_limit")
        return (UnlimitedStore, kwargs)
    from cudask.memory.store import TieredStore

    return (TieredStore, kwargs)


def plugins(o: WorkerOptions, device: Device, sizes: DeviceSizes, k: int = 0) -> list[WorkerPlugin]:
    """The ordered plugin list of one worker, worker k on its GPU (see
    cudask.worker.plugins)."""
    out: list[WorkerPlugin] = [
        CPUAffinity(cpu_share(device.gpu.cpu_affinity, workers_per_gpu(o), k)),
        CUDAContext(device.uuid),
        CloseStore(),  # torn down before the RMM resources and IPC of the ones after it
    ]
    rmm = RMMSetup(
        pool_size=sizes.rmm_pool_size,
        maximum_pool_size=sizes.rmm_maximum_pool_size,
        managed_memory=bool(o.rmm_managed_memory),
        async_alloc=bool(o.rmm_async),
        release_threshold=sizes.rmm_release_threshold,
        log_directory=o.rmm_log_directory,
        track_allocations=bool(o.rmm_track_allocations),
        external_libs=o.rmm_allocator_external_lib_list or (),
    )
    if rmm.needed:
        out.append(rmm)
    if o.pre_import:
        out.append(PreImport(o.pre_import))
    if o.enable_cudf_spill or o.cudf_spill_stats:
        out.append(CudfSpill(bool(o.enable_cudf_spill), int(o.cudf_spill_stats or 0)))
    out.append(StoreMetrics())
    min_size = device_ipc_min_size(o)
    if min_size is not None:
        out.append(
            DeviceIPC(
                device.uuid,
                min_size,
                comm_settings.device_ipc_lease(),
                map_ahead=comm_settings.map_ahead(),
                staging=staging_size(o, sizes, device),
            )
        )
    if o.gc_freeze:
        out.append(GCFreeze())
    return out


UCX_CONFIG_NAMESPACES = ("distributed-ucxx", "distributed.comm.ucx")


def ucx_config(o: WorkerOptions) -> dict[str, Any]:
    """distributed-ucxx's config for the transports the enable_* options name.

    Written under "distributed-ucxx" (what distributed-ucxx 0.52 reads first)
    and "distributed.comm.ucx" (its fallback, and what older releases read), as
    dotted keys: the Nanny merges its `config` into a snapshot of the whole config
    one level deep, so a nested {"distributed": ...} would replace all of
    distributed's settings in the worker process."""
    if o.protocol not in UCX_PROTOCOLS:
        return {}
    ucx = transports(o.enable_tcp_over_ucx, o.enable_infiniband, o.enable_nvlink, o.enable_rdmacm)
    return {f"{ns}.{k}": v for ns in UCX_CONFIG_NAMESPACES for k, v in ucx.items()}


MAX_PORT = 65535


def parse_ports(value: str | int | None, n: int) -> list[int | None]:
    """--worker-port: a port for one GPU, or FIRST:LAST split across n GPUs."""
    if value is None or value == "" or value == 0 or value == "0":
        return [None] * n
    text = str(value)
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not m:
        raise OptionError(
            f"worker_port={value!r} is not accepted; give a port such as 9000 or "
            "a range FIRST:LAST such as 9000:9003"
        )
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else first
    if last < first:
        raise OptionError(f"worker_port={value!r}: the range ends before it starts")
    if last > MAX_PORT:
        raise OptionError(
            f"worker_port={value!r}: port {last} is out of range; accepted: ports "
            f"from 1 to {MAX_PORT}, e.g. worker_port=9000 or 9000:9003"
        )
    count = last - first + 1
    if count < n:
        raise OptionError(
            f"Not enough ports in --worker-port range for {n} GPUs: "
            f"worker_port={value!r} gives {count}; give a range of at least {n}, "
            f"e.g. {first}:{first + n - 1}"
        )
    return list(range(first, first + n))


def parse_resources(value: str | dict | None) -> dict[str, float] | None:
    if value is None or isinstance(value, dict):
        return value
    out: dict[str, float] = {}
    for item in value.replace(",", " ").split():
        key, sep, amount = item.partition("=")
        try:
            out[key] = float(amount)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise OptionError(
                f"resources={value!r}: {item!r} is not NAME=AMOUNT; example: 'GPU=1 MEM=10e9'"
            )
    return out


def worker_names(name: str | None, devices: Sequence[Device], per_gpu: int = 1) -> list[Any]:
    """CUDAWorker names: exactly `name` for one worker, name-0, name-1, ... for several
    (GPU by GPU, its `per_gpu` workers in turn: the names dask-jobqueue gives the
    processes of a job)."""
    count = len(devices) * per_gpu
    if name is None:
        return [None] * count
    if count == 1:
        return [name]
    return [f"{name}-{j}" for j in range(count)]


#: What each worker of a named CUDAWorker tells the scheduler when it registers
#: (distributed.Worker's `startup_information`; the scheduler keeps it in
#: WorkerState.extra and shows it in scheduler_info()["workers"]): the name the node
#: was started with, and how many GPU workers it started.
NODE_KEY = "cudask_node"
NODE_WORKERS_KEY = "cudask_node_workers"


@dataclass(frozen=True)
class Constant:
    """A picklable `startup_information` entry: `value`, whichever worker asks."""

    value: Any

    def __call__(self, worker: Any) -> Any:
        return self.value


def node_information(name: Any, n_workers: int) -> dict[str, Constant]:
    """`startup_information` of the workers of one CUDAWorker named `name`.

    Their names are NAME or NAME-0, NAME-1, ... (worker_names); this says, without
    parsing names, which workers came from one node (a Kubernetes pod, whose
    deployment is NAME) and how many it started (cudask.deploy.operator_api)."""
    return {NODE_KEY: Constant(name), NODE_WORKERS_KEY: Constant(n_workers)}


def gpu_name(device: Device, k: int = 0, per_gpu: int = 1) -> int | str:
    """LocalCUDACluster names each worker after its GPU (as dask-cuda does); with
    several workers per GPU, worker k of a GPU is GPU-k ("0-1")."""
    name = device.uuid if device.mig else device.gpu.index
    return name if per_gpu == 1 else f"{name}-{k}"


def nanny_options(
    o: WorkerOptions,
    devices: Sequence[Device],
    i: int,
    *,
    n_workers: int,
    name: Any,
    extra: dict[str, Any] | None = None,
    k: int = 0,
) -> dict[str, Any]:
    """Keyword arguments of the Nanny (and through it the Worker) for GPU i (worker
    k on it); `n_workers` is how many share 'auto' host memory."""
    device = devices[i]
    sizes = device_sizes(o, device)
    memory_limit = host_memory_limit(o, n_workers)
    options: dict[str, Any] = {
        "nthreads": o.nthreads,
        "memory_limit": memory_limit or 0,
        "data": data_store(o, sizes, memory_limit),
        "env": worker_env(devices, i),
        "plugins": plugins(o, device, sizes, k),
        "name": name,
        "config": {**ucx_config(o)},
    }
    if o.local_directory is not None:
        options["local_directory"] = o.local_directory
    if any(isinstance(p, DeviceIPC) for p in options["plugins"]):
        # Requests name these, so the worker answering sends by IPC where it may.
        options["serializers"] = options["deserializers"] = list(SERIALIZERS)
    if o.protocol is not None:
        options["protocol"] = o.protocol
    if o.interface is not None:
        options["interface"] = o.interface
    cls = worker_class(o.worker_class) if o.worker_class is not None else None
    if cls is None:  # links alias tasks of spilled keys; answers by CUDA IPC where asked
        cls = GPUWorker
    if issubclass(cls, Worker):  # a Nanny subclass (see nanny_class) keeps its own worker
        options["worker_class"] = cls
    if nanny_class(o) is CUDANanny:
        options["close_timeout"] = o.close_timeout
    options.update(extra or {})
    return options


WORKER_CLASS_ACCEPTED = (
    "accepted: a subclass of distributed.Worker or distributed.Nanny, or its "
    "import path, e.g. worker_class='distributed.Worker'"
)


def worker_class(value: Any) -> type:
    """worker_class as a class (it may come as an import path from the CLI): a
    distributed.Worker subclass, which each nanny starts, or, as dask-cuda accepts,
    a distributed.Nanny subclass, which is then started instead of the Nanny."""
    given = value
    if isinstance(value, str):
        from distributed.utils import import_term

        try:
            value = import_term(value)
        except (ImportError, AttributeError, ValueError) as exc:
            raise OptionError(
                f"worker_class={value!r} cannot be imported ({exc}); {WORKER_CLASS_ACCEPTED}"
            ) from None
    if not (isinstance(value, type) and issubclass(value, (Worker, Nanny))):
        what = (
            "a module"
            if inspect.ismodule(value)
            else ("not a class" if not isinstance(value, type) else "another class")
        )
        raise OptionError(
            f"worker_class={given!r} is {what}, not a subclass of "
            f"distributed.Worker or distributed.Nanny; {WORKER_CLASS_ACCEPTED}"
        )
    return value


def nanny_class(o: WorkerOptions) -> type[Nanny]:
    """What is started for each GPU: worker_class when it is a Nanny subclass,
    else cudask's Nanny (cudask.worker.closing: distributed's, closing within
    `close_timeout`)."""
    if o.worker_class is not None:
        cls = worker_class(o.worker_class)
        if issubclass(cls, Nanny):
            return cls
    return CUDANanny


def worker_env(devices: Sequence[Device], i: int) -> dict[str, str]:
    """The environment worker i starts with: its GPU first in CUDA_VISIBLE_DEVICES,
    and CUDA numbering GPUs by PCI bus as NVML (whose indices those are) does,
    instead of fastest first, unless this process's environment chooses an order."""
    env = {"CUDA_VISIBLE_DEVICES": worker_visible_devices(devices, i)}
    if "CUDA_DEVICE_ORDER" not in os.environ:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def worker_options(nanny_opts: dict[str, Any]) -> tuple[type, dict[str, Any], dict[str, str]]:
    """Turn Nanny keywords into what --no-nanny needs: the worker class (the
    resolved worker_class, else distributed.Worker), its keywords, and the
    environment the process must have (see worker_env)."""
    opts = dict(nanny_opts)
    env = opts.pop("env")
    opts.pop("config", None)
    opts.pop("close_timeout", None)  # the Nanny's
    cls = opts.pop("worker_class", None) or Worker
    return cls, opts, env


__all__ = [
    "NODE_KEY",
    "NODE_WORKERS_KEY",
    "CUDANanny",
    "Constant",
    "DeviceSizes",
    "Nanny",
    "Worker",
    "check_devices",
    "data_store",
    "device_ipc_min_size",
    "device_sizes",
    "gpu_name",
    "host_memory_limit",
    "nanny_class",
    "nanny_options",
    "node_information",
    "parse_ports",
    "parse_resources",
    "plugins",
    "ucx_config",
    "worker_class",
    "worker_env",
    "worker_names",
    "worker_options",
]
