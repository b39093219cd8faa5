"""Kubernetes resources for cudask GPU clusters, checked before anything is created.

Covers: `check_pods()`, every check of the inputs (pod CPU, memory and GPUs, image,
namespace, name, env, extra resources, cudask worker options and whether their
memory limit fits the pod), each failing with a one-line OptionError that names
the value and what is accepted; and what the checked `GPUPods` turn into:

- `cluster_spec()`: a DaskCluster resource (`kubernetes.dask.org/v1`) for the
  dask-kubernetes operator, made by the operator's own `make_cluster_spec` and then
  adjusted: worker pods run `cudask worker` (one dask worker per GPU the pod gets)
  with `nvidia.com/gpu` limits, CPU and memory, and `--memory-limit` = pod memory /
  GPUs; the scheduler pod has no GPU (`NVIDIA_VISIBLE_DEVICES=void`,
  `CUDA_VISIBLE_DEVICES=""`) and runs `dask scheduler` with cudask's monitor and the
  pod-counting API the operator scales through (cudask.deploy.operator_api).
- `helm_values()`: values for the dask Helm chart (dask/helm-chart, chart `dask`)
  that run the same pods.

Does not cover: talking to Kubernetes (cudask.deploy.kubernetes), which GPUs a pod
gets (the NVIDIA device plugin: docs/kubernetes.md).
"""

from __future__ import annotations

import copy
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dask.utils import format_bytes, parse_bytes

from cudask.deploy.checks import check_input
from cudask.errors import OptionError, require
from cudask.options import BY_NAME, flag_args, options_for
from cudask.worker.spec import parse_ports

GiB = 2**30
MiB = 2**20
GPU_RESOURCE = "nvidia.com/gpu"
WORKER_COMMAND = ("cudask", "worker")
SCHEDULER_COMMAND = (
    "dask",
    "scheduler",
    "--host",
    "0.0.0.0",
    "--preload",
    "cudask.monitor",
    "--preload",
    "cudask.deploy.operator_api",
)
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
INSTALL = "pip install 'cudask[kubernetes]'"
#: The scheduler pod never sees a GPU: the NVIDIA container runtime injects none
#: (`void`), and CUDA would find none if it did.
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}

# Worker options that the pods' set-up decides, and who decides them.
SET_BY_KUBERNETES = {
    "name": "the operator, which names each pod's workers after the pod's Deployment "
    "(--name $(DASK_WORKER_NAME))",
    "scheduler_file": "the operator, which gives the workers the scheduler's address "
    "(DASK_SCHEDULER_ADDRESS)",
    "dashboard": "the worker pod spec (dashboards on port 8788, as the operator's)",
    "dashboard_address": "the worker pod spec (dashboards on port 8788, as the operator's)",
}
# Environment variables that the pods' set-up decides.
MANAGED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the NVIDIA device plugin gives each worker pod its GPUs and "
    "the scheduler pod gets none",
    "NVIDIA_VISIBLE_DEVICES": "the NVIDIA device plugin gives each worker pod its GPUs and "
    "the scheduler pod gets none",
    "DASK_WORKER_NAME": "the operator sets it to each worker pod's Deployment name",
    "DASK_SCHEDULER_ADDRESS": "the operator sets it to the scheduler's service",
}
POD_KEYWORDS = (
    "name",
    "namespace",
    "image",
    "num_workers",
    "nvidia_gpu",
    "worker_cpu",
    "worker_memory",
    "scheduler_cpu",
    "scheduler_memory",
    "env",
    "resources",
    "gpu_resource",
    "worker_command",
    "scheduler_service_type",
    "idle_timeout",
    "worker_resources",
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RESOURCE_NAME = re.compile(
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[A-Za-z0-9]([-A-Za-z0-9_.]*"
    r"[A-Za-z0-9])?)?"
)
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
MAX_CLUSTER_NAME = 53  # 63, less the "-scheduler" the operator appends


def option_error(keyword: str, message: str) -> OptionError:
    exc = OptionError(message)
    exc.option = keyword
    return exc


@dataclass(frozen=True)
class GPUPods:
    """Checked inputs: one scheduler pod and `num_workers` worker pods of `gpus` GPUs."""

    name: str
    namespace: str | None
    image: str
    num_workers: int
    gpus: int
    worker_cpu: str  # Kubernetes quantities
    worker_memory: int  # bytes per worker pod
    scheduler_cpu: str
    scheduler_memory: int
    gpu_resource: str = GPU_RESOURCE
    env: list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    worker_options: dict[str, Any] = field(default_factory=dict)  # canonical, as given
    worker_command: tuple[str, ...] = WORKER_COMMAND
    scheduler_service_type: str = "ClusterIP"
    idle_timeout: int = 0

    @property
    def memory_per_worker(self) -> int:
        """Host memory of each GPU worker: the pod's, shared evenly by its GPUs."""
        return self.worker_memory // self.gpus

    def worker_flags(self) -> list[str]:
        """`cudask worker` flags for the worker options (memory_limit always among them)."""
        args: list[str] = []
        for key, value in self.worker_options.items():
            args += flag_args(BY_NAME[key], value)
        return args

    def worker_args(self) -> list[str]:
        return [*self.worker_command, *self.worker_flags()]


# ----------------------------------------------------------------------------- checks
def check_count(keyword: str, value: Any, minimum: int, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise option_error(
            keyword,
            f"{keyword}={value!r} is not accepted; accepted: a whole number "
            f"of at least {minimum}, e.g. {keyword}={example}",
        )
    return value


def _gpus(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise option_error(
            "nvidia_gpu",
            f"nvidia_gpu={value!r}: a cudask worker pod needs a GPU "
            "(it starts one dask worker per GPU it is given); accepted: a "
            "whole number of at least 1, e.g. nvidia_gpu=1 (CPU-only "
            "workers: dask_kubernetes.operator.KubeCluster)",
        )
    return check_count("nvidia_gpu", value, 1, 1)


def _cpu(keyword: str, value: Any) -> str:
    """A CPU amount as a Kubernetes quantity: "4", "1.5" -> "1500m", "500m"."""
    millis: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        millis = value * 1000
    elif isinstance(value, str):
        text = value.strip()
        try:
            millis = float(text[:-1]) if text.endswith("m") else float(text) * 1000
        except ValueError:
            millis = None
    if millis is None or not math.isfinite(millis) or millis <= 0:
        raise option_error(
            keyword,
            f"{keyword}={value!r} is not accepted; accepted: CPU cores as a "
            f"number above 0 or a quantity such as '500m', e.g. {keyword}=4",
        )
    millis = round(millis)
    if millis < 1:
        raise option_error(
            keyword,
            f"{keyword}={value!r} is less than 1m (a thousandth of a core); "
            f"accepted: at least '1m', e.g. {keyword}=4",
        )
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _memory(keyword: str, value: Any) -> int:
    """A memory amount in bytes: a number is GiB (12 -> 12 GiB), a string a size."""
    size: int | None = None
    if isinstance(value, str):
        try:
            value = float(value)  # a number as text (a CLI flag): GiB, too
        except ValueError:
            try:
                size = parse_bytes(value.strip())
            except (ValueError, TypeError):
                size = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        size = int(value * GiB) if math.isfinite(value) else None
    if size is None or size <= 0:
        raise option_error(
            keyword,
            f"{keyword}={value!r} is not accepted; accepted: GiB as a number "
            f"above 0 (e.g. {keyword}=12) or a size such as '12Gi' or '500Mi'",
        )
    return size


def memory_quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity: 12 GiB -> "12Gi", 500 MiB -> "500Mi"."""
    if size % GiB == 0:
        return f"{size // GiB}Gi"
    if size % MiB == 0:
        return f"{size // MiB}Mi"
    return str(size)


def size_text(size: int) -> str:
    """Bytes as a size dask reads: "6GiB", "500MiB", or the number of bytes."""
    quantity = memory_quantity(size)
    return quantity + "B" if quantity[-1] == "i" else quantity


def _dns_label(keyword: str, value: Any, maximum: int, example: str) -> str:
    if not isinstance(value, str) or len(value) > maximum or not _DNS_LABEL.fullmatch(value):
        raise option_error(
            keyword,
            f"{keyword}={value!r} is not accepted; accepted: lowercase letters, "
            f"digits and '-', starting and ending with a letter or digit, at "
            f"most {maximum} characters, e.g. {keyword}={example!r}",
        )
    return value


def _image(value: Any) -> str:
    if value is None or value == "":
        raise option_error(
            "image",
            "image is missing: give the container image the scheduler and "
            "worker pods run, with cudask installed (and CuPy for spilling), "
            "e.g. image='registry.example.com/cudask:0.1.0'",
        )
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise option_error(
            "image",
            f"image={value!r} is not accepted; accepted: an image reference "
            "without spaces, e.g. image='registry.example.com/cudask:0.1.0'",
        )
    return value


def _namespace(value: Any) -> str:
    if value is None or value == "":
        raise option_error(
            "namespace",
            "namespace is missing: give the Kubernetes namespace the "
            "cluster goes in (it must exist: `kubectl get namespaces`), "
            "e.g. namespace='dask-gpu'",
        )
    return _dns_label("namespace", value, 63, "dask-gpu")


def _env(value: Any) -> list[dict[str, Any]]:
    """Environment of every pod: a dict of strings, or Kubernetes EnvVar dicts."""
    accepted = (
        "accepted: a dict of strings such as {'EXTRA': '1'}, or a list of Kubernetes "
        "EnvVar dicts such as [{'name': 'EXTRA', 'value': '1'}]"
    )
    if value is None:
        return []
    if isinstance(value, Mapping):
        items = []
        for key, val in value.items():
            if not isinstance(val, str):
                raise option_error(
                    "env",
                    f"env[{key!r}]={val!r} is not a string; Kubernetes "
                    f"environment values are strings; {accepted}",
                )
            items.append({"name": key, "value": val})
    elif isinstance(value, Sequence) and not isinstance(value, str):
        items = [dict(item) if isinstance(item, Mapping) else item for item in value]
        for item in items:
            if (
                not isinstance(item, dict)
                or "name" not in item
                or set(item) - {"name", "value", "valueFrom"}
                or ("value" in item and not isinstance(item["value"], str))
            ):
                raise option_error("env", f"env entry {item!r} is not accepted; {accepted}")
    else:
        raise option_error("env", f"env={value!r} is not accepted; {accepted}")
    seen: set[str] = set()
    for item in items:
        name = item["name"]
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise option_error(
                "env",
                f"env name {name!r} is not accepted; accepted: letters, digits, "
                "'_', '-' and '.', not starting with a digit, e.g. 'EXTRA_PIP'",
            )
        if name in MANAGED_ENV:
            raise option_error("env", f"env sets {name}, which {MANAGED_ENV[name]}; leave it out")
        if name in seen:
            raise option_error("env", f"env names {name!r} twice; name each variable once")
        seen.add(name)
    return copy.deepcopy(items)


def _resources(value: Any, gpu_resource: str) -> dict[str, dict[str, Any]]:
    """Extra container resources of the worker pods (e.g. ephemeral-storage)."""
    example = "e.g. resources={'limits': {'ephemeral-storage': '100Gi'}}"
    if value is None:
        return {}
    if not isinstance(value, Mapping) or set(value) - {"limits", "requests"}:
        raise option_error(
            "resources",
            f"resources={value!r} is not accepted; accepted: a dict with "
            f"'limits' and/or 'requests', each a dict of quantities; {example}",
        )
    own = {"cpu": "worker_cpu", "memory": "worker_memory", gpu_resource: "nvidia_gpu"}
    out: dict[str, dict[str, Any]] = {}
    for part, amounts in value.items():
        if not isinstance(amounts, Mapping):
            raise option_error(
                "resources", f"resources[{part!r}]={amounts!r} is not a dict; {example}"
            )
        for key, amount in amounts.items():
            if key in own:
                raise option_error(
                    "resources",
                    f"resources[{part!r}] sets {key!r}, which "
                    f"{own[key]}= gives; leave it out of resources",
                )
            if (
                not isinstance(key, str)
                or not _RESOURCE_NAME.fullmatch(key)
                or isinstance(amount, bool)
                or not isinstance(amount, (str, int, float))
            ):
                raise option_error(
                    "resources",
                    f"resources[{part!r}][{key!r}]={amount!r} is not "
                    f"accepted; accepted: a resource name and a quantity; "
                    f"{example}",
                )
        out[part] = dict(amounts)
    return out


def _worker_class_form(value: Any) -> None:
    """Only its form: the class is imported where the workers run, not here."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*", value):
        raise option_error(
            "worker_class",
            f"worker_class={value!r} is not accepted here; accepted: "
            "the dotted import path of a class in the image, e.g. "
            "worker_class='distributed.Worker'",
        )


def _worker_options(values: Mapping[str, Any], gpus: int, pod_memory: int) -> dict[str, Any]:
    for key, why in SET_BY_KUBERNETES.items():
        if key in values:
            raise option_error(key, f"{key}={values[key]!r} is set by {why}; leave it out")
    values = dict(values)
    worker_class = values.pop("worker_class", None)
    if worker_class is not None:
        _worker_class_form(worker_class)
    # the CLI's checks and messages; libraries are the image's business, not this machine's
    resolved = check_input(values, "cli", libraries=False)
    given = {k: resolved[k] for k in values}
    if worker_class is not None:
        given["worker_class"] = worker_class
    if gpus > 1:
        for key in ("listen_address", "contact_address"):
            if given.get(key):
                raise option_error(
                    key,
                    f"{key}={given[key]!r} names one worker's address, but each "
                    f"pod runs {gpus} GPU workers; leave it out (each worker "
                    "listens on the pod's address) or give nvidia_gpu=1",
                )
    if given.get("worker_port") is not None:
        try:
            parse_ports(given["worker_port"], gpus)
        except OptionError as exc:
            raise option_error("worker_port", str(exc)) from None
    given["memory_limit"] = _memory_limit(given.get("memory_limit", "unset"), gpus, pod_memory)
    # a pod given fewer GPUs than its limit fails at start, naming both numbers
    given.setdefault("expected_gpus", gpus)
    return given


def _memory_limit(value: Any, gpus: int, pod_memory: int) -> Any:
    """Each GPU worker's host memory limit: the pod's memory / GPUs unless given, and a
    given one must fit the pod (gpus of them)."""
    per = pod_memory // gpus
    if value == "unset":
        return size_text(per)
    if value is None or value == 0 or (isinstance(value, str) and value.strip() in ("0", "auto")):
        return value  # no limit, or distributed's share of the pod's (cgroup) memory
    fits = (
        f"accepted: at most {format_bytes(per)} per worker (the pod's "
        f"{format_bytes(pod_memory)} / {gpus} GPUs), e.g. memory_limit={size_text(per)!r}"
    )
    if isinstance(value, float) and 0 < value <= 1:  # a fraction of the pod's memory, each
        if value * gpus > 1:
            raise option_error(
                "memory_limit",
                f"memory_limit={value!r} is a fraction of the pod's "
                f"memory for each of its {gpus} GPU workers: "
                f"{gpus} x {value} > 1 does not fit the pod; {fits}",
            )
        return value
    if isinstance(value, str):
        try:
            number = float(value)  # "0.5": distributed reads a fraction here too
        except ValueError:
            number = None
        if number is not None and number <= 1:
            return _memory_limit(number, gpus, pod_memory) and value
    size = int(value) if isinstance(value, (int, float)) else parse_bytes(str(value))
    if size > per:
        raise option_error(
            "memory_limit",
            f"memory_limit={value!r} for each of {gpus} GPU workers "
            f"({format_bytes(size * gpus)} in all) does not fit the "
            f"pod's worker_memory ({format_bytes(pod_memory)}); {fits}",
        )
    return value


def check_pods(
    *,
    name: str | None = None,
    namespace: str | None = None,
    image: str | None = None,
    num_workers: int = 1,
    nvidia_gpu: int = 1,
    worker_cpu: Any = 4,
    worker_memory: Any = 16,
    scheduler_cpu: Any = 1,
    scheduler_memory: Any = 4,
    env: Any = None,
    resources: Any = None,
    gpu_resource: str = GPU_RESOURCE,
    worker_command: Sequence[str] | None = None,
    scheduler_service_type: str = "ClusterIP",
    idle_timeout: int = 0,
    worker_resources: Any = None,
    require_namespace: bool = True,
    **worker_options: Any,
) -> GPUPods:
    """Every input checked, nothing created. Memory in GiB when a number ('12Gi' etc.
    as strings), CPU in cores; `num_workers` counts worker pods, each with `nvidia_gpu`
    GPUs and as many dask workers; `resources` are the worker pods' extra Kubernetes
    resources; `worker_options` are `cudask worker`'s (docs/options.md), with
    `worker_resources` for its `resources` (dask's abstract resources, 'GPU=1').
    Raises OptionError (`option` names the keyword at fault)."""
    accepted = {o.name for o in options_for("cli")} - set(SET_BY_KUBERNETES)
    unknown = sorted(set(worker_options) - accepted - set(SET_BY_KUBERNETES))
    if unknown:
        raise option_error(
            unknown[0],
            f"unknown keyword(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(POD_KEYWORDS)} and the `cudask worker` "
            f"options {', '.join(sorted(accepted))} (docs/options.md)",
        )
    if worker_resources is not None:
        worker_options["resources"] = worker_resources
    if (
        not isinstance(gpu_resource, str)
        or "/" not in gpu_resource
        or not _RESOURCE_NAME.fullmatch(gpu_resource)
    ):
        raise option_error(
            "gpu_resource",
            f"gpu_resource={gpu_resource!r} is not accepted; accepted: "
            "the device plugin's resource name, e.g. 'nvidia.com/gpu' "
            "or 'nvidia.com/mig-1g.10gb'",
        )
    gpus = _gpus(nvidia_gpu)
    pod_memory = _memory("worker_memory", worker_memory)
    command = tuple(worker_command) if worker_command is not None else WORKER_COMMAND
    if (
        not command
        or isinstance(worker_command, str)
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise option_error(
            "worker_command",
            f"worker_command={worker_command!r} is not accepted; "
            "accepted: a list of words, e.g. ['cudask', 'worker'] or "
            "['python', '-m', 'cudask.cli', 'worker']",
        )
    if scheduler_service_type not in SERVICE_TYPES:
        raise option_error(
            "scheduler_service_type",
            f"scheduler_service_type={scheduler_service_type!r} is not accepted; "
            f"accepted: {', '.join(SERVICE_TYPES)}",
        )
    return GPUPods(
        name=_dns_label("name", name, MAX_CLUSTER_NAME, "gpu-cluster")
        if name is not None
        else f"cudask-{uuid.uuid4().hex[:10]}",
        namespace=_namespace(namespace) if require_namespace or namespace is not None else None,
        image=_image(image),
        num_workers=check_count("num_workers", num_workers, 0, 2),
        gpus=gpus,
        worker_cpu=_cpu("worker_cpu", worker_cpu),
        worker_memory=pod_memory,
        scheduler_cpu=_cpu("scheduler_cpu", scheduler_cpu),
        scheduler_memory=_memory("scheduler_memory", scheduler_memory),
        gpu_resource=gpu_resource,
        env=_env(env),
        resources=_resources(resources, gpu_resource),
        worker_options=_worker_options(worker_options, gpus, pod_memory),
        worker_command=command,
        scheduler_service_type=scheduler_service_type,
        idle_timeout=check_count("idle_timeout", idle_timeout, 0, 3600),
    )


# ------------------------------------------------------------------------ resources
def worker_resources(p: GPUPods) -> dict[str, dict[str, str]]:
    """A worker container's resources: CPU and memory requested as limited (so the pod
    is not evicted first under memory pressure), the GPUs as a limit. Quantities are
    strings: the operator's CRD takes nothing else (Kubernetes also takes numbers)."""
    extra = {part: {k: str(v) for k, v in amounts.items()} for part, amounts in p.resources.items()}
    limits = {
        "cpu": p.worker_cpu,
        "memory": memory_quantity(p.worker_memory),
        p.gpu_resource: str(p.gpus),
        **extra.get("limits", {}),
    }
    requests = {
        "cpu": p.worker_cpu,
        "memory": memory_quantity(p.worker_memory),
        **extra.get("requests", {}),
    }
    return {"limits": limits, "requests": requests}


def scheduler_resources(p: GPUPods) -> dict[str, dict[str, str]]:
    amounts = {"cpu": p.scheduler_cpu, "memory": memory_quantity(p.scheduler_memory)}
    return {"limits": dict(amounts), "requests": dict(amounts)}


def scheduler_args(p: GPUPods) -> list[str]:
    """`dask scheduler` with cudask's monitor page and the pod-counting /api/v1."""
    return [*SCHEDULER_COMMAND, "--gpus-per-pod", str(p.gpus)]


def scheduler_env(p: GPUPods) -> list[dict[str, Any]]:
    return [*copy.deepcopy(p.env), *({"name": k, "value": v} for k, v in NO_GPU_ENV.items())]


def cluster_spec(p: GPUPods) -> dict[str, Any]:
    """The DaskCluster resource: the operator's make_cluster_spec, adjusted."""
    operator = require(
        "dask_kubernetes.operator", needed_for="cudask's Kubernetes clusters", install=INSTALL
    )
    spec: dict[str, Any] = operator.make_cluster_spec(  # type: ignore[attr-defined]
        name=p.name,
        image=p.image,
        n_workers=p.num_workers,
        resources=None,
        env=copy.deepcopy(p.env),
        worker_command=p.worker_args(),  # + --name $(DASK_WORKER_NAME) --dashboard ...
        scheduler_service_type=p.scheduler_service_type,
        idle_timeout=p.idle_timeout,
    )
    if p.namespace is not None:
        spec["metadata"]["namespace"] = p.namespace
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    worker["resources"] = worker_resources(p)
    worker["env"] = copy.deepcopy(p.env)
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = scheduler_args(p)
    scheduler["env"] = scheduler_env(p)
    scheduler["resources"] = scheduler_resources(p)
    return spec


# ------------------------------------------------------------------------ Helm chart
def helm_values(p: GPUPods) -> dict[str, Any]:
    """Values for the dask Helm chart (`helm install NAME dask/dask -f values.yaml`).

    The chart's worker container runs `<worker.image.dask_worker> <scheduler URL>
    [--nthreads T --memory-limit <pod limit>] --no-dashboard --dashboard-address P
    <extraArgs>` (dask/templates/dask-worker-deployment.yaml). cudask's command is two
    words, so `dask_worker` is `cudask` and `custom_scheduler_url` holds `worker`; the
    scheduler's address opens extraArgs, and the `--memory-limit` there (each GPU
    worker's share) overrides the chart's (the pod's): the later flag wins. Each
    worker is named after its pod (POD_NAME, from the downward API).
    `fullnameOverride` makes the scheduler's service `<name>-scheduler`."""
    if len(p.worker_command) != 2:
        raise option_error(
            "worker_command",
            f"worker_command={list(p.worker_command)!r}: the Helm "
            "chart puts its flags after the command's second word, "
            "so it takes a two-word command; accepted: e.g. "
            "['cudask', 'worker']",
        )
    last = p.image.rsplit("/", 1)[-1]
    repository, tag = p.image.rsplit(":", 1) if ":" in last else (p.image, "latest")
    image = {"repository": repository, "tag": tag}
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *copy.deepcopy(p.env),
    ]
    return {
        "fullnameOverride": p.name,
        "scheduler": {
            "image": dict(image),
            "extraArgs": ["--preload", "cudask.monitor"],
            "env": scheduler_env(p),
            "resources": scheduler_resources(p),
        },
        "worker": {
            "image": {**image, "dask_worker": p.worker_command[0]},
            "custom_scheduler_url": p.worker_command[1],
            "replicas": p.num_workers,
            "threads_per_worker": p.worker_options.get("nthreads") or 1,
            "resources": worker_resources(p),
            "env": env,
            "extraArgs": [
                f"tcp://{p.name}-scheduler:8786",
                *p.worker_flags(),
                "--name",
                "$(POD_NAME)",
            ],
        },
    }


__all__ = [
    "GPUPods",
    "check_pods",
    "cluster_spec",
    "helm_values",
    "memory_quantity",
    "scheduler_args",
    "scheduler_env",
    "scheduler_resources",
    "worker_resources",
]
