"""CUDAWorker: the workers of one node, one per local GPU (or N), joined to a scheduler.

Covers: what `dask cuda worker` runs and what dask-mpi, dask-jobqueue runners,
SSHCluster and `dask spec` use as a worker class — one Nanny per GPU (N per GPU)
named NAME (one worker) or NAME-0, NAME-1, ... (several), each telling the scheduler NAME
(WorkerState.extra["cudask_node"], so a Kubernetes pod's workers map back to
it), awaitable, an async context
manager, finished() and close(); and a no-nanny mode (one GPU per process)
for sites that forbid forking. At start, a CUDA context this process holds on
one of its workers' GPUs is named (cudask.deploy.contexts). GPUs are those of the process's
CUDA_VISIBLE_DEVICES (all when unset), so `mpirun ... CUDA_VISIBLE_DEVICES=
$LOCAL_RANK dask cuda worker` gives one worker per rank; in a process that has
initialized MPI (dask-mpi), one worker on the GPU of its local rank
(cudask.deploy.mpi), its CUDA_VISIBLE_DEVICES rotated to start with that GPU.
Does not cover: the specs themselves (cudask.worker.spec).

Threading: await it, and call its methods, on one event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any, Self

import dask.config
from distributed import Nanny, Worker
from distributed.deploy.cluster import Cluster
from distributed.security import Security

from cudask import config
from cudask.deploy import mpi
from cudask.deploy.checks import check_input
from cudask.deploy.contexts import warn_own_contexts
from cudask.deploy.preflight import check_tls, scheduler_address
from cudask.devices import Device, discover, parse_visible_devices, require_gpus
from cudask.errors import CudaskError, DeviceError, OptionError
from cudask.options import BY_NAME, WorkerOptions, check_one_worker_options, options_for
from cudask.worker.sharing import node_slots, workers_per_gpu
from cudask.worker.sizing import check_devices
from cudask.worker.spec import (
    CUDANanny,
    nanny_class,
    nanny_options,
    node_information,
    parse_ports,
    parse_resources,
    ucx_config,
    worker_names,
    worker_options,
)

NODE_ONLY = {o.name for o in options_for("worker")} - {o.name for o in options_for("cluster")}


def _passthrough() -> set[str]:
    names: set[str] = set()
    for fn in (Nanny.__init__, Worker.__init__):
        names |= set(inspect.signature(fn).parameters) - {"self", "kwargs", "worker_kwargs"}
    return names - set(BY_NAME)


def _did_you_mean(unknown: list[str]) -> str:
    """A hint for option names written as flags (dask-mpi's --worker-options JSON)."""
    hints = [
        f"{k!r} -> {k.lstrip('-').replace('-', '_')!r}"
        for k in unknown
        if k.lstrip("-").replace("-", "_") in BY_NAME
    ]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


class CUDAWorker:
    """One worker per local GPU, as dask-cuda's CUDAWorker.

    `scheduler` is the scheduler address or a Cluster (also accepted as `scheduler_ip`, the
    name distributed.Worker gives it, which dask-jobqueue's runners use; default:
    --scheduler-file, then the `scheduler-address` config that dask-mpi sets).
    Other keywords are the worker options of docs/options.md; any remaining
    keyword goes to the Nanny/Worker (e.g. security, preload_argv).

    In an MPI rank (dask-mpi's `--worker-class cudask.CUDAWorker` or
    `initialize(worker_class="cudask.CUDAWorker")`), it starts one worker, on the GPU
    of the rank's local rank, in the rank's process unless nanny=True is given
    (docs/mpi.md, cudask.deploy.mpi). `visible` are the GPUs of CUDA_VISIBLE_DEVICES,
    `devices` those this process starts workers on.
    """

    def __init__(self, scheduler: str | Cluster | None = None, **kwargs: Any) -> None:
        try:
            self._init(scheduler, kwargs)
        except CudaskError as exc:
            mpi.abort_job(exc)  # an MPI rank: say why and end the job rather than hang
            raise

    @classmethod
    def from_options(cls, scheduler: str | None, options: WorkerOptions) -> CUDAWorker:
        """The workers of `options` as `cudask.deploy.checks.check_input` returned them:
        for `cudask worker`, which checks its flags itself (to name them in its
        errors), so the checks that need no GPU run once. `scheduler`: as for
        CUDAWorker (None: options.scheduler_file)."""
        self = cls.__new__(cls)
        try:
            self._place(scheduler, options, {}, stacklevel=4)
        except CudaskError as exc:
            mpi.abort_job(exc)
            raise
        return self

    def _init(self, given: str | Cluster | None, kwargs: dict[str, Any]) -> None:
        # a Cluster stands for its scheduler, as distributed's Worker and Nanny accept
        scheduler = given.scheduler_address if isinstance(given, Cluster) else given
        if "scheduler_ip" in kwargs:  # distributed.Worker's name for it (dask-jobqueue runners)
            scheduler_ip = kwargs.pop("scheduler_ip")
            if isinstance(scheduler_ip, Cluster):
                scheduler_ip = scheduler_ip.scheduler_address
            if scheduler is not None and scheduler_ip is not None and scheduler_ip != scheduler:
                raise OptionError(
                    f"two schedulers given: {scheduler!r} and "
                    f"scheduler_ip={scheduler_ip!r}; give one"
                )
            scheduler = scheduler or scheduler_ip
        values = {k: kwargs.pop(k) for k in list(kwargs) if k in BY_NAME}
        world = mpi.mpi_world_size()
        if world is not None and world > 1:
            values.setdefault("nanny", False)  # an MPI rank is its worker: see cudask.deploy.mpi
        unknown = sorted(set(kwargs) - _passthrough())
        if unknown:
            raise OptionError(
                f"CUDAWorker got unknown keyword(s) {', '.join(unknown)}{_did_you_mean(unknown)}; "
                f"accepted: {', '.join(sorted(o.name for o in options_for('worker')))} and "
                "distributed.Nanny's keywords"
            )
        origin = None
        if scheduler is None and not values.get("scheduler_file"):
            scheduler = dask.config.get("scheduler-address", None)  # dask-mpi sets it
            origin = config.origin("scheduler-address")
            if scheduler is None:
                raise OptionError(
                    "no scheduler: give its address (e.g. tcp://10.0.0.1:8786), "
                    "--scheduler-file, or DASK_SCHEDULER_ADDRESS"
                )
        # every check that needs no GPU, before any GPU is looked for
        options = check_input(
            values,
            "worker",
            visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            visible_origin="environment variable CUDA_VISIBLE_DEVICES",
            scheduler=scheduler,
            scheduler_origin=origin,
            security=kwargs.get("security"),
        )
        self._place(scheduler, options, kwargs, stacklevel=5)

    def _place(
        self, scheduler: str | None, options: WorkerOptions, kwargs: dict[str, Any], stacklevel: int
    ) -> None:
        """Find the GPUs and make a worker (Nanny) for each slot; `options` checked.
        `stacklevel`: warnings name the frame that many levels up from the warning's
        function, the caller of CUDAWorker."""
        rank = mpi.check_rank(os.environ)  # dask-mpi: the launcher's local rank, checked here
        machine = require_gpus(discover())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.visible: list[Device] = parse_visible_devices(visible, machine)
        if not self.visible:
            raise DeviceError("CUDA_VISIBLE_DEVICES is empty: no GPU to start a worker on")
        if options.expected_gpus and len(self.visible) < options.expected_gpus:
            raise DeviceError(
                f"expected_gpus={options.expected_gpus} but {len(self.visible)} GPU(s) are "
                f"visible ({', '.join(d.label for d in self.visible)}); give this node (pod, "
                "job) the GPUs it asks for, or lower --expected-gpus"
            )
        self.indices: list[int] = mpi.devices_for_rank(
            self.visible, rank, narrowed=visible is not None
        )
        devices = [self.visible[i] for i in self.indices]
        if not options.nanny and len(devices) > 1:
            raise OptionError(
                f"--no-nanny runs one worker in this process, so it needs exactly one GPU; "
                f"{len(devices)} are visible ({', '.join(d.label for d in devices)}). Set "
                "CUDA_VISIBLE_DEVICES to one GPU per process (e.g. from the MPI local rank)"
            )
        if not options.nanny and nanny_class(options) is not CUDANanny:
            raise OptionError(
                f"--no-nanny starts a Worker in this process, but worker_class="
                f"{options.worker_class!r} is a Nanny; give a Worker subclass"
            )
        check_one_worker_options(options.settings, len(devices))
        check_devices(options, devices)  # sizes and libraries, before any process
        per_gpu = workers_per_gpu(options)
        slots = node_slots(self.indices, per_gpu)
        names = worker_names(options.name, devices, per_gpu)
        ports = parse_ports(options.worker_port, len(slots))
        if options.nanny:  # without one, this process is the worker: its context is the worker's
            warn_own_contexts(devices, "the nannies' process", stacklevel=stacklevel)
        ucx = ucx_config(options)
        if ucx:  # the nannies of this process speak UCX too
            dask.config.set(ucx)
        self.options: WorkerOptions = options
        self.devices: list[Device] = devices
        self.scheduler = scheduler
        self.nannies: list[Nanny | Worker] = [
            self._make(scheduler, i, k, name, port, kwargs)
            for (i, k), name, port in zip(slots, names, ports)
        ]

    def _node_kwargs(self, port: int | None) -> dict[str, Any]:
        o = self.options
        kw: dict[str, Any] = {
            "scheduler_file": o.scheduler_file,
            "host": o.host,
            "listen_address": o.listen_address,
            "contact_address": o.contact_address,
            "resources": parse_resources(o.resources),
            "death_timeout": o.death_timeout,
            "preload": o.preload or [],
            "dashboard": bool(o.dashboard),
            "dashboard_address": o.dashboard_address,
        }
        if port is not None:
            kw["worker_port" if o.nanny else "port"] = port
        if o.tls_ca_file:
            kw["security"] = self._security()
        if o.dashboard_prefix:
            kw["http_prefix"] = o.dashboard_prefix
        if o.name is not None:  # which node (pod) each worker is of, for the scheduler
            kw["startup_information"] = node_information(
                o.name, len(self.devices) * workers_per_gpu(o)
            )
        return {k: v for k, v in kw.items() if v is not None}

    def _security(self) -> Security | None:
        o = self.options
        if not o.tls_ca_file:
            return None
        return Security(
            tls_ca_file=o.tls_ca_file,
            tls_worker_cert=o.tls_cert,
            tls_worker_key=o.tls_key,
            require_encryption=True,
        )

    def _make(
        self,
        scheduler: str | None,
        i: int,
        k: int,
        name: Any,
        port: int | None,
        extra: dict[str, Any],
    ) -> Nanny | Worker:
        # i indexes the visible GPUs: the worker's CUDA_VISIBLE_DEVICES lists them all,
        # its own first; 'auto' memory is a share per worker of every visible GPU
        opts = nanny_options(
            self.options,
            self.visible,
            i,
            n_workers=len(self.visible) * workers_per_gpu(self.options),
            name=name,
            extra={**self._node_kwargs(port), **extra},
            k=k,
        )
        if self.options.nanny:
            return nanny_class(self.options)(scheduler, **opts)
        cls, opts, env = worker_options(opts)
        # The one GPU was read from this process's CUDA_VISIBLE_DEVICES (by index, UUID
        # or prefix); when that is unset, pin the process to it before any CUDA call.
        # When it lists several (an MPI rank took one of them), put that one first.
        for var, value in env.items():
            if var == "CUDA_VISIBLE_DEVICES" and len(self.visible) > 1:
                os.environ[var] = value
            else:
                os.environ.setdefault(var, value)
        return cls(scheduler, **opts)

    async def _start(self) -> Self:
        method = self.options.multiprocessing_method
        if method == "forkserver":
            import multiprocessing.forkserver

            multiprocessing.forkserver.ensure_running()
        if self.options.tls_ca_file:  # a certificate refused: one clear error, now
            await check_tls(
                scheduler_address(self.scheduler, self.options.scheduler_file), self._security()
            )
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            await asyncio.gather(*self.nannies)
        if self.options.pid_file:
            await asyncio.to_thread(Path(self.options.pid_file).write_text, str(os.getpid()))
        return self

    def __await__(self) -> Generator[Any, None, Self]:
        return self._start().__await__()

    async def __aenter__(self) -> Self:
        return await self._start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def finished(self) -> None:
        """Wait until every worker of this node has closed."""
        await asyncio.gather(*(n.finished() for n in self.nannies))

    async def close(self, timeout: float | None = None) -> None:
        """Close every worker; `timeout`: each nanny's close timeout (default: the
        close_timeout option; a worker without a nanny: distributed.Worker's own)."""
        await asyncio.gather(
            *(n.close() if timeout is None else n.close(timeout=timeout) for n in self.nannies)
        )
        if self.options.pid_file and os.path.exists(self.options.pid_file):
            os.remove(self.options.pid_file)
