"""The scheduler's HTTP API for the dask-kubernetes operator, counted in pods.

Covers: the scheduler preload `cudask.deploy.operator_api` (`dask scheduler
--preload cudask.deploy.operator_api --gpus-per-pod N`), which serves the
`/api/v1` routes the operator's controller calls, with two of them made to count
worker *pods* instead of dask workers, since a cudask pod runs one worker per GPU:

- `POST /api/v1/retire_workers {"n": N}` retires every worker of N pods and answers
  one entry per pod, whose "name" is the pod's Deployment name, which the
  controller deletes (dask_kubernetes operator/controller/controller.py).
  `{"workers": [...]}` keeps distributed's meaning.
- `GET /api/v1/adaptive_target` answers the pods needed for the workers the
  scheduler wants (the operator's autoscaler sets the worker group's replicas to it).
- `/api/v1`, `/api/v1/get_workers`, `/api/v1/check_idle` are distributed's own.

A worker's pod is the name its CUDAWorker was started with (`--name
$(DASK_WORKER_NAME)`, the Deployment's name), reported at registration
(cudask.worker.spec.node_information); a worker that reports none (a plain
`dask worker`) is a pod of its own, known by its name, as the controller expects.

Does not cover: the Kubernetes resources (cudask.deploy.kube_spec), nor the
controller's fallback over the dask RPC, which names workers, not pods: it is
used only when this API fails.

Threading: the handlers run on the scheduler's event loop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import click
import dask.config
from distributed import Scheduler, SchedulerPlugin
from distributed.http.scheduler.api import APIHandler, CheckIdleHandler, GetWorkersHandler
from distributed.http.utils import RequestHandler
from distributed.scheduler import WorkerState
from distributed.utils import recursive_to_dict
from tornado.web import HTTPError

from cudask.worker.spec import NODE_KEY, NODE_WORKERS_KEY

PLUGIN_NAME = "cudask-operator-api"
#: distributed's own /api/v1 module; its retire_workers would shadow this one.
DISTRIBUTED_API = "distributed.http.scheduler.api"


def pod_of(ws: WorkerState) -> str:
    """The pod (worker Deployment) a worker belongs to."""
    node = ws.extra.get(NODE_KEY)
    if node is not None:
        return str(node)
    return str(ws.name) if ws.name is not None else ws.address


def pods(workers: Iterable[WorkerState]) -> dict[str, list[WorkerState]]:
    """The workers of each pod, pods in the order their first worker comes."""
    out: dict[str, list[WorkerState]] = {}
    for ws in workers:
        out.setdefault(pod_of(ws), []).append(ws)
    return out


def pods_to_retire(scheduler: Scheduler, n: int) -> list[str]:
    """The `n` pods to retire, in distributed's order of preference (idle pods first,
    then those holding the least data: Scheduler.workers_to_close, grouped by pod).
    Pods are retired whole or not at all: one with a worker that must not be closed
    (a long-running task, a plugin's valid_workers_downscaling) is left alone, and so
    is one holding data when no worker outside the chosen pods would be left to take
    it (distributed would retire its empty workers and keep the others)."""
    if n <= 0 or not scheduler.workers:
        return []
    members = pods(scheduler.workers.values())
    # n = every worker: workers_to_close then lists every group it may close, best first
    order = scheduler.workers_to_close(n=len(scheduler.workers), key=pod_of)
    closable: dict[str, set[str]] = {}
    for address in order:
        closable.setdefault(pod_of(scheduler.workers[address]), set()).add(address)
    remaining = set(scheduler.workers)
    chosen: list[str] = []
    data = False  # whether the chosen pods hold data, which needs a worker to go to
    for pod, addresses in closable.items():
        if len(chosen) == n:
            break
        if addresses != {ws.address for ws in members[pod]}:
            continue
        holds = data or any(getattr(ws, "has_what", None) for ws in members[pod])
        if holds and not remaining - addresses:
            continue
        chosen.append(pod)
        remaining -= addresses
        data = holds
    return chosen


async def retire_pods(scheduler: Scheduler, n: int) -> dict[str, dict[str, Any]]:
    """Retire every worker of `n` pods; one entry per pod whose workers all retired:
    {pod: {"name": pod, "workers": {address: identity}}}. Should a worker of a chosen
    pod still fail to hand its data over (distributed's "no-recipients"), that pod is
    not listed, so the controller leaves it running."""
    chosen = pods_to_retire(scheduler, n)
    members = pods(scheduler.workers.values())
    addresses = {pod: [ws.address for ws in members[pod]] for pod in chosen}
    retired = await scheduler.retire_workers(workers=[a for p in chosen for a in addresses[p]])
    return {
        pod: {"name": pod, "workers": {a: retired[a] for a in addresses[pod]}}
        for pod in chosen
        if all(a in retired for a in addresses[pod])
    }


def gpus_per_pod(scheduler: Scheduler, default: int) -> int:
    """GPU workers per pod: as the registered workers report it, else `default`."""
    counts = [int(ws.extra.get(NODE_WORKERS_KEY) or 1) for ws in scheduler.workers.values()]
    return max(counts) if counts else max(default, 1)


def pods_for(workers: int, per_pod: int) -> int:
    """Pods that hold `workers` GPU workers, `per_pod` to a pod."""
    return math.ceil(max(workers, 0) / max(per_pod, 1))


class _Handler(RequestHandler):
    """Errors are tornado's: a 500 (or the 400 below) that the controller reads as
    "fall back to the dask RPC"."""

    def initialize(
        self,
        dask_server: Any = None,
        extra: Any = None,  # type: ignore[override]
        gpus_per_pod: int = 1,
    ) -> None:
        super().initialize(dask_server=dask_server, extra=extra)
        self.gpus_per_pod = gpus_per_pod


class RetirePodsHandler(_Handler):
    """POST /api/v1/retire_workers: {"n": pods} or {"workers": [addresses]}."""

    async def post(self) -> None:
        try:
            params = json.loads(self.request.body or b"{}")
            n = int(params.get("n", 0) or 0)
            workers = list(params.get("workers", []))
        except (ValueError, TypeError, AttributeError) as exc:
            raise HTTPError(400, f"bad request body: {exc}") from None
        scheduler = self.server
        if n:
            info: dict[str, Any] = await retire_pods(scheduler, n)
        else:
            info = await scheduler.retire_workers(workers=workers)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(recursive_to_dict(info)))


class AdaptivePodsHandler(_Handler):
    """GET /api/v1/adaptive_target: {"workers": pods}, the operator's replica count."""

    def get(self) -> None:
        scheduler = self.server
        per_pod = gpus_per_pod(scheduler, self.gpus_per_pod)
        target = pods_for(scheduler.adaptive_target(), per_pod)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"workers": target, "gpus_per_pod": per_pod}))


def routes(scheduler: Scheduler, gpus: int) -> list[tuple[str, type, dict[str, Any]]]:
    """The /api/v1 routes, for `scheduler.http_application.add_handlers`."""
    ours = {"dask_server": scheduler, "gpus_per_pod": gpus}
    theirs = {"dask_server": scheduler}
    return [
        (r"/api/v1", APIHandler, theirs),
        (r"/api/v1/retire_workers", RetirePodsHandler, ours),
        (r"/api/v1/get_workers", GetWorkersHandler, theirs),
        (r"/api/v1/adaptive_target", AdaptivePodsHandler, ours),
        (r"/api/v1/check_idle", CheckIdleHandler, theirs),
    ]


class OperatorAPI(SchedulerPlugin):
    """Serves `routes()` on the scheduler's HTTP server (once per scheduler)."""

    name = PLUGIN_NAME

    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus
        self.served = False

    async def start(self, scheduler: Scheduler) -> None:
        if self.served:
            return
        if DISTRIBUTED_API in (dask.config.get("distributed.scheduler.http.routes") or []):
            raise RuntimeError(
                f"{DISTRIBUTED_API} is in distributed.scheduler.http.routes, and its "
                "/api/v1/retire_workers would answer before cudask's, which counts pods; "
                f"remove it from that list (cudask.deploy.operator_api serves /api/v1)"
            )
        app = getattr(scheduler, "http_application", None)
        if app is None:
            raise RuntimeError(
                "the scheduler has no HTTP server (dashboard off?): the "
                "dask-kubernetes operator scales through its /api/v1"
            )
        app.add_handlers(r".*", routes(scheduler, self.gpus))
        self.served = True


@click.command()
@click.option(
    "--gpus-per-pod",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPU workers in each worker pod, until workers report their own count.",
)
def dask_setup(scheduler: Scheduler, gpus_per_pod: int) -> None:
    """Preload hook: serve the pod-counting /api/v1 on this scheduler."""
    if PLUGIN_NAME not in scheduler.plugins:
        scheduler.add_plugin(OperatorAPI(gpus_per_pod))


__all__ = [
    "OperatorAPI",
    "dask_setup",
    "gpus_per_pod",
    "pod_of",
    "pods",
    "pods_for",
    "pods_to_retire",
    "retire_pods",
    "routes",
]
