"""`cudask kubernetes manifest|helm-values`: cudask GPU clusters as Kubernetes YAML.

Covers: the click group `kubernetes` (also `dask cudask kubernetes`) whose
commands print, for `kubectl apply -f -`, the DaskCluster resource that
KubeCUDACluster creates (`manifest`), or values for the dask Helm chart
(`helm-values`), from the same flags: pod sizes, image, namespace, env, extra
resources, and every `cudask worker` flag (generated from cudask.options). A bad
value is a usage error (exit status 2) with one line naming its flag and what is
accepted; nothing is contacted. Without --namespace the manifest names none, so
`kubectl apply` puts it in the current context's namespace.

Does not cover: building the resources (cudask.deploy.kube_spec) or creating them
(cudask.deploy.kubernetes). Threading: the command's thread; pure text out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click
import yaml

from cudask.cli.flags import SectionedCommand
from cudask.cli.user_errors import ConfigError
from cudask.cli.worker import click_option
from cudask.options import BY_NAME, options_for

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
# `cudask worker` options the pods' set-up decides (cudask.deploy.kube_checks.SET_BY_KUBERNETES)
LEFT_OUT = ("name", "scheduler_file", "dashboard", "dashboard_address")


def _pairs(flag: str, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{item!r} is not NAME=VALUE; e.g. {flag} EXTRA=1", param_hint=f"'{flag}'"
            )
        out[key] = value
    return out


#: The flags of the pods (the keywords of KubeCUDACluster), before `cudask worker`'s.
POD_FLAGS = (
    click.option(
        "--name",
        help="Name of the DaskCluster (lowercase letters, digits, '-'); default: cudask-<random>.",
    ),
    click.option("--image", help="Container image of every pod, with cudask installed (required)."),
    click.option(
        "--num-workers",
        type=int,
        default=1,
        show_default=True,
        help="Worker pods (each runs one dask worker per GPU).",
    ),
    click.option(
        "--nvidia-gpu", type=int, default=1, show_default=True, help="GPUs of each worker pod."
    ),
    click.option(
        "--worker-cpu",
        default="4",
        show_default=True,
        help="CPU cores of each worker pod (or a quantity such as 500m).",
    ),
    click.option(
        "--worker-memory",
        default="16",
        show_default=True,
        help="Memory of each worker pod: GiB, or a size such as 12Gi; each GPU "
        "worker gets an even share as its --memory-limit.",
    ),
    click.option(
        "--scheduler-cpu",
        default="1",
        show_default=True,
        help="CPU cores of the scheduler pod.",
    ),
    click.option(
        "--scheduler-memory",
        default="4",
        show_default=True,
        help="Memory of the scheduler pod: GiB, or a size such as 4Gi.",
    ),
    click.option(
        "--env",
        "env",
        multiple=True,
        metavar="NAME=VALUE",
        help="Environment variable of every pod (repeatable).",
    ),
    click.option(
        "--limit",
        "limits",
        multiple=True,
        metavar="RESOURCE=QUANTITY",
        help="Extra resource limit of the worker pods, e.g. ephemeral-storage=100Gi (repeatable).",
    ),
    click.option(
        "--request",
        "requests",
        multiple=True,
        metavar="RESOURCE=QUANTITY",
        help="Extra resource request of the worker pods (repeatable).",
    ),
    click.option(
        "--gpu-resource",
        default="nvidia.com/gpu",
        show_default=True,
        help="The device plugin's GPU resource, e.g. nvidia.com/mig-1g.10gb.",
    ),
)

#: The flags of the manifest alone: where and how the operator runs the cluster.
CLUSTER_FLAGS = (
    click.option(
        "--namespace",
        help="Namespace of the cluster; default: none in the "
        "manifest, so `kubectl apply` puts it in the "
        "current context's namespace (or -n's).",
    ),
    click.option(
        "--scheduler-service-type",
        default="ClusterIP",
        show_default=True,
        type=click.Choice(["ClusterIP", "NodePort", "LoadBalancer"]),
    ),
    click.option(
        "--idle-timeout",
        type=int,
        default=0,
        show_default=True,
        help="Seconds of an idle scheduler after which the operator deletes "
        "the cluster (0: never).",
    ),
)


def _pod_options(fn: Callable[..., Any], *, namespace: bool) -> Callable[..., Any]:
    """The flags of the pods (POD_FLAGS, and CLUSTER_FLAGS with `namespace`), then
    `cudask worker`'s."""
    for opt in reversed([o for o in options_for("cli") if o.name not in LEFT_OUT]):
        fn = click_option(opt)(fn)
    for decorator in reversed((*POD_FLAGS, *(CLUSTER_FLAGS if namespace else ()))):
        fn = decorator(fn)
    return fn


def _check(values: dict[str, Any]) -> Any:
    """kube_spec.check_pods on the flags; its OptionError is a usage error (exit 2)
    that names flags, not keywords (speak_flags)."""
    from cudask.deploy.kube_spec import check_pods
    from cudask.errors import OptionError

    env = _pairs("--env", values.pop("env"))
    resources = {
        part: _pairs(flag, values.pop(part))
        for part, flag in (("limits", "--limit"), ("requests", "--request"))
    }
    resources = {k: v for k, v in resources.items() if v}
    given: dict[str, Any] = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in values.items()
        if v is not None and v != ()
    }
    try:
        return check_pods(env=env or None, resources=resources or None, **given)
    except OptionError as exc:
        if exc.origin is not None:  # a value of the config here, not a flag
            raise ConfigError(str(exc)) from None
        key = exc.option or ""
        message = speak_flags(str(exc))
        if key and key in given or key == "env" and env or key == "resources" and resources:
            raise click.BadParameter(message, param_hint=f"'{_flag(key)}'") from None
        raise click.UsageError(message) from None


def _flag(keyword: str) -> str:
    """The flag of a keyword of check_pods (a pod's, or a `cudask worker` option)."""
    special = {"env": "--env", "resources": "--limit/--request"}
    if keyword in special:
        return special[keyword]
    return BY_NAME[keyword].cli_flag if keyword in BY_NAME else "--" + keyword.replace("_", "-")


_ASSIGNED = re.compile(r"(?<![\w.\-\[])([a-z][a-z0-9_]*)=(?:'([^']*)'|(-?\b[\w.:/+-]+\b))?")
_MENTIONED = re.compile(r"(?<![\w.\-'])([a-z]+_[a-z0-9_]+)(?![\w'=\[-])|^([a-z]+)(?= is missing)")


def speak_flags(message: str) -> str:
    """A check_pods message with keywords written as this command's flags:
    "namespace='Dask_GPU'" -> "--namespace Dask_GPU", "nvidia_gpu=True" (a boolean
    option) -> its flag, "worker_memory" -> "--worker-memory"."""
    from cudask.deploy.kube_checks import POD_KEYWORDS

    keywords = (set(POD_KEYWORDS) | set(BY_NAME)) - {"worker_command"}  # no flag: a keyword

    def assigned(m: re.Match[str]) -> str:
        keyword, text = m.group(1), m.group(2) if m.group(2) is not None else m.group(3)
        if keyword not in keywords:
            return m.group(0)
        opt = BY_NAME.get(keyword)
        if opt is not None and opt.kind in ("bool", "tristate") and text in ("True", "False"):
            return opt.cli_flag if text == "True" else str(opt.secondary)
        if text is None:  # no value, or one not spelt as a word (a list: --flag=[...])
            follows = m.string[m.end() : m.end() + 1]
            return f"{_flag(keyword)}=" if follows and follows in '[{("' else _flag(keyword)
        word = text if re.fullmatch(r"[\w.:/@%+=-]+", text) else f"'{text}'"
        return f"{_flag(keyword)} {word}"

    def mentioned(m: re.Match[str]) -> str:
        keyword = m.group(1) or m.group(2)
        return _flag(keyword) if keyword in keywords else m.group(0)

    message = re.sub(
        r"resources\['(limits|requests)'\]",
        lambda m: "--limit" if m.group(1) == "limits" else "--request",
        message,
    )
    message = message.replace("out of resources", "out of --limit/--request")
    return _MENTIONED.sub(mentioned, _ASSIGNED.sub(assigned, message))


def _echo_yaml(header: str, data: Any) -> None:
    click.echo(header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


@click.group(context_settings=CONTEXT)
def kubernetes() -> None:
    """cudask GPU clusters on Kubernetes, as YAML (nothing is contacted)."""


def manifest_command(**values: Any) -> None:
    """Print the DaskCluster resource for the dask-kubernetes operator: `kubectl apply -f -`.

    Worker pods of --nvidia-gpu GPUs run `cudask worker` (one dask worker per GPU);
    the scheduler pod has no GPU. The operator and the NVIDIA device plugin must be
    installed in the cluster (docs/kubernetes.md)."""
    from cudask.deploy.kube_spec import cluster_spec

    pods = _check(values)
    _echo_yaml(
        f"# cudask kubernetes manifest: DaskCluster {pods.name!r} for the dask-kubernetes "
        "operator (kubectl apply -f <this file>)\n",
        cluster_spec(pods),
    )


def helm_values_command(**values: Any) -> None:
    """Print values for the dask Helm chart: `helm install NAME dask/dask -f values.yaml`.

    The chart's worker pods run `cudask worker` with each GPU worker's share of the pod's
    memory; its scheduler pod has no GPU. See docs/kubernetes.md for what the chart
    version must provide."""
    from cudask.deploy.kube_spec import helm_values

    pods = _check(values)
    _echo_yaml(
        f"# cudask kubernetes helm-values: the dask Helm chart with cudask GPU workers "
        f"(helm install {pods.name} dask/dask -f <this file>)\n",
        helm_values(pods),
    )


#: The --help sections of the pods' own flags (the worker flags follow, by their groups).
POD_SECTIONS = {
    name: "Pods"
    for name in (
        "name",
        "image",
        "num_workers",
        "nvidia_gpu",
        "worker_cpu",
        "worker_memory",
        "scheduler_cpu",
        "scheduler_memory",
        "env",
        "limits",
        "requests",
        "gpu_resource",
        "namespace",
        "scheduler_service_type",
        "idle_timeout",
    )
}
manifest = click.command(
    "manifest", cls=SectionedCommand, sections=POD_SECTIONS, context_settings=CONTEXT
)(_pod_options(manifest_command, namespace=True))
helm_values = click.command(
    "helm-values", cls=SectionedCommand, sections=POD_SECTIONS, context_settings=CONTEXT
)(_pod_options(helm_values_command, namespace=False))
kubernetes.add_command(manifest)
kubernetes.add_command(helm_values)
