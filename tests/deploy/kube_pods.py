"""What the dask-kubernetes operator makes of a DaskCluster, for tests without a cluster.

- `operator_objects(spec)`: the DaskWorkerGroup, scheduler Deployment and Service,
  and worker Deployments that the operator's controller builds from a DaskCluster,
  with the controller's own functions (dask_kubernetes.operator.controller).
- `container_argv` / `container_env`: a container's command line and environment as
  the kubelet starts it: `$(VAR)` in args expanded from the container's env.
- `crd_schema(kind)`: the openAPIV3Schema of the operator's CRD, as shipped in
  dask-kubernetes (its Helm chart's crds/).
"""

from __future__ import annotations

import copy
import re
from importlib import resources
from typing import Any

import yaml


def operator_objects(spec: dict[str, Any], workers: int | None = None) -> dict[str, Any]:
    """The objects the controller creates for DaskCluster `spec` (and `workers` worker
    Deployments: the worker group's replicas by default)."""
    from dask_kubernetes.operator.controller import controller

    name = spec["metadata"]["name"]
    namespace = spec["metadata"].get("namespace", "default")
    scheduler = spec["spec"]["scheduler"]
    group = controller.build_default_worker_group_spec(
        name, copy.deepcopy(spec["spec"]["worker"]), {}, {}
    )
    count = spec["spec"]["worker"]["replicas"] if workers is None else workers
    return {
        "workergroup": group,
        "scheduler": controller.build_scheduler_deployment_spec(
            name, copy.deepcopy(scheduler["spec"]), {}, {}
        ),
        "service": controller.build_scheduler_service_spec(
            name, copy.deepcopy(scheduler["service"]), {}, {}
        ),
        "workers": [
            controller.build_worker_deployment_spec(
                worker_group_name=f"{name}-default",
                namespace=namespace,
                cluster_name=name,
                uuid=f"{i:010x}",
                pod_spec=spec["spec"]["worker"]["spec"],
                annotations={},
                labels={},
            )
            for i in range(count)
        ],
    }


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def container_env(c: dict[str, Any]) -> dict[str, str]:
    """The container's plain `value` environment variables (valueFrom ones left out)."""
    return {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of args: $(VAR) from the container's env, $$ -> $; an
    unknown $(VAR) stays as it is."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(one, text)


def container_argv(c: dict[str, Any]) -> list[str]:
    """command + args, expanded (the image's entrypoint runs them: `exec "$@"`)."""
    env = container_env(c)
    return [expand(a, env) for a in [*(c.get("command") or []), *(c.get("args") or [])]]


def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of CRD `kind` (daskcluster, daskworkergroup, ...)."""
    path = (
        resources.files("dask_kubernetes")
        / "operator"
        / "deployment"
        / "helm"
        / "dask-kubernetes-operator"
        / "crds"
        / f"{kind}.yaml"
    )
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])
