"""Checks of the inputs of cudask's Kubernetes GPU clusters, one value at a time.

Covers: each input of `cudask.deploy.kube_spec.check_pods` on its own: counts,
GPUs, CPU and memory amounts (and their Kubernetes quantities), names, image,
namespace, env, extra resources, the worker command and service type, and the
`cudask worker` options with whether their memory limit fits the pod. Each
failing check raises a one-line OptionError that names the value and what is
accepted, with `option` set to the keyword at fault.

Does not cover: the order the inputs are checked in and the checked record
(`cudask.deploy.kube_spec`), talking to Kubernetes (`cudask.deploy.kubernetes`).

Threading: pure functions; call them from any thread.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dask.utils import format_bytes, parse_bytes

from cudask.deploy.checks import check_input
from cudask.errors import OptionError
from cudask.options import options_for
from cudask.worker import sharing
from cudask.worker.spec import parse_ports

GiB = 2**30
MiB = 2**20
GPU_RESOURCE = "nvidia.com/gpu"
WORKER_COMMAND = ("cudask", "worker")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")

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


# ----------------------------------------------------------------------------- checks
def check_count(keyword: str, value: Any, minimum: int, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(
            f"{keyword}={value!r} is not accepted; accepted: a whole number "
            f"of at least {minimum}, e.g. {keyword}={example}",
            option=keyword,
        )
    return value


def check_gpus(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise OptionError(
            f"nvidia_gpu={value!r}: a cudask worker pod needs a GPU "
            "(it starts one dask worker per GPU it is given); accepted: a "
            "whole number of at least 1, e.g. nvidia_gpu=1 (CPU-only "
            "workers: dask_kubernetes.operator.KubeCluster)",
            option="nvidia_gpu",
        )
    return check_count("nvidia_gpu", value, 1, 1)


def check_cpu(keyword: str, value: Any) -> str:
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
        raise OptionError(
            f"{keyword}={value!r} is not accepted; accepted: CPU cores as a "
            f"number above 0 or a quantity such as '500m', e.g. {keyword}=4",
            option=keyword,
        )
    millis = round(millis)
    if millis < 1:
        raise OptionError(
            f"{keyword}={value!r} is less than 1m (a thousandth of a core); "
            f"accepted: at least '1m', e.g. {keyword}=4",
            option=keyword,
        )
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def check_memory(keyword: str, value: Any) -> int:
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
        raise OptionError(
            f"{keyword}={value!r} is not accepted; accepted: GiB as a number "
            f"above 0 (e.g. {keyword}=12) or a size such as '12Gi' or '500Mi'",
            option=keyword,
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


def check_dns_label(keyword: str, value: Any, maximum: int, example: str) -> str:
    if not isinstance(value, str) or len(value) > maximum or not _DNS_LABEL.fullmatch(value):
        raise OptionError(
            f"{keyword}={value!r} is not accepted; accepted: lowercase letters, "
            f"digits and '-', starting and ending with a letter or digit, at "
            f"most {maximum} characters, e.g. {keyword}={example!r}",
            option=keyword,
        )
    return value


def check_image(value: Any) -> str:
    if value is None or value == "":
        raise OptionError(
            "image is missing: give the container image the scheduler and "
            "worker pods run, with cudask installed (and CuPy for spilling), "
            "e.g. image='registry.example.com/cudask:0.1.0'",
            option="image",
        )
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise OptionError(
            f"image={value!r} is not accepted; accepted: an image reference "
            "without spaces, e.g. image='registry.example.com/cudask:0.1.0'",
            option="image",
        )
    return value


def check_namespace(value: Any) -> str | None:
    """A namespace, or None (also for ''): the current kubectl context's, as
    dask-kubernetes' KubeCluster and `kubectl apply` take it."""
    if value is None or value == "":
        return None
    return check_dns_label("namespace", value, 63, "dask-gpu")


def check_env(value: Any) -> list[dict[str, Any]]:
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
                raise OptionError(
                    f"env[{key!r}]={val!r} is not a string; Kubernetes "
                    f"environment values are strings; {accepted}",
                    option="env",
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
                raise OptionError(f"env entry {item!r} is not accepted; {accepted}", option="env")
    else:
        raise OptionError(f"env={value!r} is not accepted; {accepted}", option="env")
    seen: set[str] = set()
    for item in items:
        name = item["name"]
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise OptionError(
                f"env name {name!r} is not accepted; accepted: letters, digits, "
                "'_', '-' and '.', not starting with a digit, e.g. 'EXTRA_PIP'",
                option="env",
            )
        if name in MANAGED_ENV:
            raise OptionError(
                f"env sets {name}, which {MANAGED_ENV[name]}; leave it out", option="env"
            )
        if name in seen:
            raise OptionError(f"env names {name!r} twice; name each variable once", option="env")
        seen.add(name)
    return copy.deepcopy(items)


def check_resources(value: Any, gpu_resource: str) -> dict[str, dict[str, Any]]:
    """Extra container resources of the worker pods (e.g. ephemeral-storage)."""
    example = "e.g. resources={'limits': {'ephemeral-storage': '100Gi'}}"
    if value is None:
        return {}
    if not isinstance(value, Mapping) or set(value) - {"limits", "requests"}:
        raise OptionError(
            f"resources={value!r} is not accepted; accepted: a dict with "
            f"'limits' and/or 'requests', each a dict of quantities; {example}",
            option="resources",
        )
    own = {"cpu": "worker_cpu", "memory": "worker_memory", gpu_resource: "nvidia_gpu"}
    out: dict[str, dict[str, Any]] = {}
    for part, amounts in value.items():
        if not isinstance(amounts, Mapping):
            raise OptionError(
                f"resources[{part!r}]={amounts!r} is not a dict; {example}", option="resources"
            )
        for key, amount in amounts.items():
            if key in own:
                raise OptionError(
                    f"resources[{part!r}] sets {key!r}, which "
                    f"{own[key]}= gives; leave it out of resources",
                    option="resources",
                )
            if (
                not isinstance(key, str)
                or not _RESOURCE_NAME.fullmatch(key)
                or isinstance(amount, bool)
                or not isinstance(amount, (str, int, float))
            ):
                raise OptionError(
                    f"resources[{part!r}][{key!r}]={amount!r} is not "
                    f"accepted; accepted: a resource name and a quantity; "
                    f"{example}",
                    option="resources",
                )
        out[part] = dict(amounts)
    return out


def _worker_class_form(value: Any) -> None:
    """Only its form: the class is imported where the workers run, not here."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*", value):
        raise OptionError(
            f"worker_class={value!r} is not accepted here; accepted: "
            "the dotted import path of a class in the image, e.g. "
            "worker_class='distributed.Worker'",
            option="worker_class",
        )


def check_worker_options(values: Mapping[str, Any], gpus: int, pod_memory: int) -> dict[str, Any]:
    for key, why in SET_BY_KUBERNETES.items():
        if key in values:
            raise OptionError(f"{key}={values[key]!r} is set by {why}; leave it out", option=key)
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
                raise OptionError(
                    f"{key}={given[key]!r} names one worker's address, but each "
                    f"pod runs {gpus} GPU workers; leave it out (each worker "
                    "listens on the pod's address) or give nvidia_gpu=1",
                    option=key,
                )
    workers = gpus * sharing.workers_per_gpu(resolved)  # dask workers of each pod
    if given.get("worker_port") is not None:
        try:
            parse_ports(given["worker_port"], workers)
        except OptionError as exc:
            raise OptionError(str(exc), option="worker_port") from None
    given["memory_limit"] = _memory_limit(given.get("memory_limit", "unset"), workers, pod_memory)
    # a pod given fewer GPUs than its limit fails at start, naming both numbers
    given.setdefault("expected_gpus", gpus)
    return given


def _memory_limit(value: Any, gpus: int, pod_memory: int) -> Any:
    """Each GPU worker's host memory limit: the pod's memory / its `gpus` workers (GPUs
    x workers_per_gpu) unless given, and a given one must fit the pod (gpus of them)."""
    per = pod_memory // gpus
    if value == "unset":
        return size_text(per)
    if value is None or value == 0 or (isinstance(value, str) and value.strip() in ("0", "auto")):
        return value  # no limit, or distributed's share of the pod's (cgroup) memory
    fits = (
        f"accepted: at most {format_bytes(per)} per worker (the pod's "
        f"{format_bytes(pod_memory)} / {gpus} GPU workers), e.g. memory_limit={size_text(per)!r}"
    )
    if isinstance(value, float) and 0 < value <= 1:  # a fraction of the pod's memory, each
        if value * gpus > 1:
            raise OptionError(
                f"memory_limit={value!r} is a fraction of the pod's "
                f"memory for each of its {gpus} GPU workers: "
                f"{gpus} x {value} > 1 does not fit the pod; {fits}",
                option="memory_limit",
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
        raise OptionError(
            f"memory_limit={value!r} for each of {gpus} GPU workers "
            f"({format_bytes(size * gpus)} in all) does not fit the "
            f"pod's worker_memory ({format_bytes(pod_memory)}); {fits}",
            option="memory_limit",
        )
    return value


def check_known(worker_options: Mapping[str, Any]) -> None:
    """Every keyword beyond the pods' own is a `cudask worker` option."""
    accepted = {o.name for o in options_for("cli")} - set(SET_BY_KUBERNETES)
    unknown = sorted(set(worker_options) - accepted - set(SET_BY_KUBERNETES))
    if unknown:
        raise OptionError(
            f"unknown keyword(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(POD_KEYWORDS)} and the `cudask worker` "
            f"options {', '.join(sorted(accepted))} (docs/options.md)",
            option=unknown[0],
        )


def check_gpu_resource(gpu_resource: Any) -> str:
    if (
        not isinstance(gpu_resource, str)
        or "/" not in gpu_resource
        or not _RESOURCE_NAME.fullmatch(gpu_resource)
    ):
        raise OptionError(
            f"gpu_resource={gpu_resource!r} is not accepted; accepted: "
            "the device plugin's resource name, e.g. 'nvidia.com/gpu' "
            "or 'nvidia.com/mig-1g.10gb'",
            option="gpu_resource",
        )
    return gpu_resource


def check_worker_command(worker_command: Sequence[str] | None) -> tuple[str, ...]:
    command = tuple(worker_command) if worker_command is not None else WORKER_COMMAND
    if (
        not command
        or isinstance(worker_command, str)
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise OptionError(
            f"worker_command={worker_command!r} is not accepted; "
            "accepted: a list of words, e.g. ['cudask', 'worker'] or "
            "['python', '-m', 'cudask.cli', 'worker']",
            option="worker_command",
        )
    return command


def check_service_type(scheduler_service_type: Any) -> str:
    if scheduler_service_type not in SERVICE_TYPES:
        raise OptionError(
            f"scheduler_service_type={scheduler_service_type!r} is not accepted; "
            f"accepted: {', '.join(SERVICE_TYPES)}",
            option="scheduler_service_type",
        )
    return scheduler_service_type


__all__ = [
    "GPU_RESOURCE",
    "MANAGED_ENV",
    "MAX_CLUSTER_NAME",
    "POD_KEYWORDS",
    "SERVICE_TYPES",
    "SET_BY_KUBERNETES",
    "WORKER_COMMAND",
    "check_count",
    "check_cpu",
    "check_dns_label",
    "check_env",
    "check_gpu_resource",
    "check_gpus",
    "check_image",
    "check_known",
    "check_memory",
    "check_namespace",
    "check_resources",
    "check_service_type",
    "check_worker_command",
    "check_worker_options",
    "memory_quantity",
    "size_text",
]
