"""LocalCUDACluster: one worker per visible GPU of this machine (or N per GPU).

Covers: turning dask-cuda's keywords (and LocalCluster's own) into one Nanny
spec per worker through cudask.worker.spec, on the GPUs of CUDA_VISIBLE_DEVICES
(the keyword, else the environment variable, else every GPU), scale() within the visible GPUs'
workers (one on each GPU before a second on any), and, at start, a warning naming
a CUDA context this process holds on a GPU a worker will own
(cudask.deploy.contexts).
Everything else — the scheduler, the dashboard, the sync/async context
manager — is distributed's LocalCluster.
Does not cover: option rules (cudask.options) or what a worker does at start
(cudask.worker.plugins).

Threading: as LocalCluster: sync use from one thread, async use on its loop.
Starting one sets `array.rechunk.method` in this process (cudask.comm.rechunk).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any

import dask.config
from distributed import LocalCluster, Nanny, Worker

from cudask.comm.rechunk import prefer_task_rechunk
from cudask.deploy.checks import check_input
from cudask.deploy.contexts import warn_own_contexts
from cudask.devices import Device, Machine, discover, parse_visible_devices, require_gpus
from cudask.errors import DeviceError, OptionError, ProtocolMismatchError
from cudask.monitor.state import NAME as MONITOR
from cudask.monitor.state import MonitorPlugin
from cudask.options import BY_CLUSTER_KEYWORD, WorkerOptions, options_for
from cudask.worker.sharing import cluster_slots, workers_per_gpu
from cudask.worker.sizing import check_devices
from cudask.worker.spec import (
    CUDANanny,
    gpu_name,
    nanny_class,
    nanny_options,
    ucx_config,
)

logger = logging.getLogger("cudask")


def select_devices(
    machine: Machine,
    visible: str | int | Sequence[str | int] | None,
    n_workers: int | None,
    per_gpu: int = 1,
) -> list[Device]:
    """The GPUs the cluster may use (CUDA_VISIBLE_DEVICES, default: all) and check
    n_workers against them (`per_gpu` workers each)."""
    devices = parse_visible_devices(visible, require_gpus(machine))
    if not devices:
        raise DeviceError("CUDA_VISIBLE_DEVICES is empty: no GPU to start a worker on")
    if n_workers is not None and (
        isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1
    ):
        raise OptionError(f"n_workers={n_workers!r} must be a whole number of at least 1")
    if n_workers is not None and n_workers > len(devices) * per_gpu:
        gpus = f"{len(devices)} visible GPU(s) ({', '.join(d.label for d in devices)})"
        raise OptionError(
            f"n_workers={n_workers} is more than the {gpus}; one worker per GPU"
            if per_gpu == 1
            else f"n_workers={n_workers} is more than the {len(devices) * per_gpu} workers of "
            f"the {gpus} with workers_per_gpu={per_gpu}"
        )
    return devices


def visible_devices(
    keyword: str | int | Sequence[str | int] | None,
) -> tuple[str | int | Sequence[str | int] | None, str | None]:
    """The GPUs a cluster may use and where that was said: the keyword, else this
    process's CUDA_VISIBLE_DEVICES (as a shared node or Slurm sets it), else None
    (every GPU)."""
    if keyword is not None:
        return keyword, None
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value, None if value is None else "environment variable CUDA_VISIBLE_DEVICES"


def _passthrough_keywords() -> set[str]:
    names: set[str] = set()
    for fn in (LocalCluster.__init__, Nanny.__init__, Worker.__init__):
        names |= {p for p in inspect.signature(fn).parameters if p not in ("self", "kwargs")}
    return names - {"worker_kwargs"}


class LocalCUDACluster(LocalCluster):
    """A LocalCluster with one worker per GPU, as dask-cuda's LocalCUDACluster.

    Worker options (threads_per_worker, memory_limit, device_memory_limit,
    rmm_*, protocol, enable_*, jit_unspill, ...) are documented in
    docs/options.md and default to the `cudask.worker` config; any other
    keyword goes to distributed.LocalCluster (dashboard_address, host,
    silence_logs, security, scheduler_port, ...).
    """

    def __init__(
        self,
        CUDA_VISIBLE_DEVICES: str | int | Sequence[str | int] | None = None,
        n_workers: int | None = None,
        **kwargs: Any,
    ) -> None:
        worker_values = {k: kwargs.pop(k) for k in list(kwargs) if k in BY_CLUSTER_KEYWORD}
        if not kwargs.pop("processes", True):
            raise OptionError(
                "processes=False is not supported: each GPU needs its own worker "
                "process (CUDA_VISIBLE_DEVICES is per process)"
            )
        unknown = sorted(set(kwargs) - _passthrough_keywords())
        if unknown:
            raise OptionError(
                f"LocalCUDACluster got unknown keyword(s) {', '.join(unknown)}; accepted: "
                f"{', '.join(sorted(BY_CLUSTER_KEYWORD))} and distributed.LocalCluster's keywords"
            )
        visible, origin = visible_devices(CUDA_VISIBLE_DEVICES)
        # every check that needs no GPU, before any GPU is looked for
        options = check_input(
            worker_values,
            "cluster",
            visible_devices=visible,
            visible_origin=origin,
            n_workers=n_workers,
            cluster=kwargs,
        )
        machine = discover()
        per_gpu = workers_per_gpu(options)
        devices = select_devices(machine, visible, n_workers, per_gpu)
        check_devices(options, devices)  # sizes and libraries, before any process
        warn_own_contexts(devices)  # this process (client, scheduler, nannies) on their GPUs
        self.options: WorkerOptions = options
        self.devices: list[Device] = devices
        self.slots: list[tuple[int, int]] = cluster_slots(len(devices), per_gpu)
        self.machine = machine
        self._user_data = kwargs.pop("data", None)
        self._extra_worker_kwargs = {
            k: kwargs.pop(k)
            for k in list(kwargs)
            if k not in inspect.signature(LocalCluster.__init__).parameters
        }
        if options.protocol is not None:
            kwargs["protocol"] = options.protocol
        if options.interface is not None:
            kwargs["interface"] = options.interface
        ucx = ucx_config(options)
        if ucx:  # the scheduler and nannies of this process speak UCX too
            dask.config.set(ucx)
        prefer_task_rechunk()  # arrays of this process's clusters are device arrays
        # the scheduler watches its GPU workers: dashboard page, Prometheus, `cudask top`
        scheduler_kwargs = dict(kwargs.pop("scheduler_kwargs", None) or {})
        plugins = list(scheduler_kwargs.get("plugins") or [])
        if not any(getattr(p, "name", None) == MONITOR for p in plugins):
            plugins.append(MonitorPlugin())
        scheduler_kwargs["plugins"] = plugins
        super().__init__(
            n_workers=0,
            threads_per_worker=options.nthreads,
            processes=True,
            scheduler_kwargs=scheduler_kwargs,
            **kwargs,
        )
        self.scale(n_workers if n_workers is not None else len(self.slots))
        if not self.asynchronous:
            self.sync(self._correct_state)

    def _worker_name(self, i: int, k: int) -> int | str:
        return gpu_name(self.devices[i], k, workers_per_gpu(self.options))

    def _next_slot(self) -> tuple[int, int]:
        used = set(self.worker_spec)
        for i, k in self.slots:
            if self._worker_name(i, k) not in used:
                return i, k
        raise OptionError(
            f"cannot scale beyond the {len(self.slots)} workers of the "
            f"{len(self.devices)} visible GPU(s) "
            f"({', '.join(d.label for d in self.devices)})"
        )

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        i, k = self._next_slot()
        name = self._worker_name(i, k)
        options = dict(self.new_spec["options"])
        options.update(self._extra_worker_kwargs)
        options.update(
            nanny_options(self.options, self.devices, i, n_workers=len(self.slots), name=name, k=k)
        )
        if self._user_data is not None:
            options["data"] = self._user_data
        return {name: {"cls": nanny_class(self.options), "options": options}}

    def scale(self, n: int = 0, memory: Any = None, cores: Any = None) -> Any:
        if memory is None and cores is None and n > len(self.slots):
            per_gpu = workers_per_gpu(self.options)
            each = "one worker each" if per_gpu == 1 else f"{per_gpu} workers each"
            raise OptionError(
                f"cannot scale to {n} workers: {len(self.devices)} visible GPU(s) "
                f"({', '.join(d.label for d in self.devices)}), {each}"
            )
        return super().scale(n, memory=memory, cores=cores)


def worker_spec(
    interface: str | None = None,
    protocol: str | None = None,
    dashboard_address: str | None = ":8787",
    threads_per_worker: int = 1,
    silence_logs: Any = True,
    CUDA_VISIBLE_DEVICES: str | int | Sequence[str | int] | None = None,
    enable_tcp_over_ucx: bool | None = None,
    enable_infiniband: bool | None = None,
    enable_nvlink: bool | None = None,
    cls: type[Nanny] | None = None,
    **kwargs: Any,
) -> dict[Any, dict[str, Any]]:
    """The spec of every worker a LocalCUDACluster with these options would start, as
    {name: {"cls": ..., "options": ...}} for distributed.SpecCluster; dask-cuda's
    worker_spec, built by the same spec builder as LocalCUDACluster's workers. Other
    keywords are LocalCUDACluster's worker options (device_memory_limit, rmm_pool_size,
    ...). A UCX transport with a protocol other than "ucx" is a TypeError, as there."""
    asked = [
        k
        for k, v in (
            ("enable_infiniband", enable_infiniband),
            ("enable_nvlink", enable_nvlink),
            ("enable_tcp_over_ucx", enable_tcp_over_ucx),
        )
        if v
    ]
    if asked and protocol not in ("ucx", "ucxx"):
        raise ProtocolMismatchError(
            f"Enabling InfiniBand or NVLink requires protocol='ucx': "
            f"{asked[0]}=True, protocol={protocol!r}"
        )
    named = {
        "threads_per_worker": threads_per_worker,
        "protocol": protocol,
        "interface": interface,
        "enable_tcp_over_ucx": enable_tcp_over_ucx,
        "enable_infiniband": enable_infiniband,
        "enable_nvlink": enable_nvlink,
    }
    values = {**{k: v for k, v in named.items() if v is not None}, **kwargs}
    visible, origin = visible_devices(CUDA_VISIBLE_DEVICES)
    options = check_input(values, "cluster", visible_devices=visible, visible_origin=origin)
    per_gpu = workers_per_gpu(options)
    devices = select_devices(discover(), visible, None, per_gpu)
    check_devices(options, devices)
    slots = cluster_slots(len(devices), per_gpu)
    shared = {
        "dashboard_address": dashboard_address,
        "silence_logs": silence_logs,
        "interface": interface,
        "protocol": protocol,
        "nthreads": options.nthreads,
    }
    spec = {}
    for i, k in slots:
        name = gpu_name(devices[i], k, per_gpu)
        opts = {
            **shared,
            **nanny_options(options, devices, i, n_workers=len(slots), name=name, k=k),
        }
        chosen = cls or nanny_class(options)
        if not issubclass(chosen, CUDANanny):  # the option is cudask's Nanny's keyword
            opts.pop("close_timeout", None)
        spec[name] = {"cls": chosen, "options": opts}
    return spec


def _signature() -> inspect.Signature:
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(
            "CUDA_VISIBLE_DEVICES", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None
        ),
        inspect.Parameter("n_workers", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    ]
    params += [
        inspect.Parameter(
            o.cluster_keyword, inspect.Parameter.KEYWORD_ONLY, default=o.default_value()
        )
        for o in options_for("cluster")
    ]
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


# help() and IDEs show every keyword with its configured default; declared once in options.py
LocalCUDACluster.__init__.__signature__ = _signature()  # type: ignore[attr-defined]
