"""Kubernetes GPU clusters without a cluster and without a GPU (cudask.deploy.kube_spec,
.kubernetes; `cudask kubernetes`): the resources and command lines.

- The DaskCluster validates against the operator's CRD schema (shipped in
  dask-kubernetes), the objects the operator's controller builds from it validate
  against Kubernetes' own schemas (kubernetes-validate), and it has the structure of
  the operator's make_cluster_spec; a broken one fails both (the validators bite).
- Each pod's command parses with the real commands (`cudask worker`, `dask scheduler`
  with its preloads) to what was meant: GPUs, CPU, memory-limit = pod / GPUs, no GPU
  on the scheduler. The Helm values, put through the chart's worker command line, too.
- Bad input: one-line errors naming the value and what is accepted, before anything
  is created; CLI usage errors exit 2.

Scaling down by pod and the cluster classes: test_kubernetes_cluster.py.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask.config
import jsonschema
import pytest
import yaml
from click.testing import CliRunner

try:
    import kubernetes_validate
    from dask_kubernetes.operator import KubeCluster, make_cluster_spec
except ImportError:  # both come with cudask[test-deploy]
    pytest.skip(
        "needs dask-kubernetes and kubernetes-validate (pip install -e '.[test,test-deploy]')",
        allow_module_level=True,
    )
from kube_platform import PLATFORM, _spec
from kube_pods import container, container_argv, container_env, crd_schema, operator_objects

from cudask.cli.main import cli, dask_cudask
from cudask.cli.worker import worker
from cudask.deploy import kubernetes as kube
from cudask.deploy.checks import check_input
from cudask.deploy.kube_spec import check_pods, helm_values
from cudask.errors import OptionError

K8S_VERSION = "1.30"
DOCS = Path(__file__).parents[2] / "docs" / "kubernetes"


def _worker_values(argv: list[str]) -> dict[str, Any]:
    """What `cudask worker` makes of a command line (click's parsing, then the CLI's own
    checks): the given values, by option name."""
    assert argv[:2] == ["cudask", "worker"], argv
    ctx = worker.make_context("worker", argv[2:])
    given = {k: v for k, v in ctx.params.items() if v is not None and v != ()}
    # the CLI's checks (cudask.cli.worker.check_flags), but for the optional libraries:
    # those are the image's, not this machine's
    check_input(
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in given.items() if k != "scheduler"},
        "cli",
        libraries=False,
    )
    return given


# ------------------------------------------------------------------ schemas and shape
def test_daskcluster_validates_against_the_operators_crd() -> None:
    schema = crd_schema("daskcluster")
    spec = _spec(
        env={"EXTRA": "1"},
        resources={"limits": {"ephemeral-storage": "100Gi"}},
        device_memory_limit="20GB",
        rmm_pool_size=0.5,
    )
    jsonschema.validate(spec, schema)
    bad = copy.deepcopy(spec)
    bad["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"] = ["nvidia.com/gpu"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    group = operator_objects(spec)["workergroup"]
    jsonschema.validate(group, crd_schema("daskworkergroup"))


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_operator_objects_validate_against_kubernetes(gpus: int) -> None:
    objects = operator_objects(_spec(nvidia_gpu=gpus, env={"EXTRA": "1"}))
    assert len(objects["workers"]) == 2
    for obj in [objects["scheduler"], objects["service"], *objects["workers"]]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    broken = copy.deepcopy(objects["workers"][0])
    broken["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def _paths(obj: Any, prefix: str = "") -> set[str]:
    """Every key path, not into what holds values of our choosing (resources, env)."""
    if isinstance(obj, dict) and prefix.rsplit(".", 1)[-1] not in ("resources", "env"):
        return {prefix} | {p for k, v in obj.items() for p in _paths(v, f"{prefix}.{k}")}
    if isinstance(obj, list):
        return {prefix} | {p for v in obj for p in _paths(v, prefix + "[]")}
    return {prefix}


def test_same_structure_as_the_operators_make_cluster_spec() -> None:
    ours = _spec(env={"EXTRA": "1"})
    theirs = make_cluster_spec(
        name="gpu-cluster",
        image=PLATFORM["image"],
        n_workers=2,
        resources={"limits": {"cpu": "1"}},
        env={"EXTRA": "1"},
    )
    assert _paths(ours) - _paths(theirs) <= {".metadata.namespace"}
    assert _paths(theirs) <= _paths(ours)
    assert ours["spec"]["scheduler"]["service"] == theirs["spec"]["scheduler"]["service"]


def test_worker_pods_ask_for_gpus_and_split_their_memory() -> None:
    spec = _spec()
    c = spec["spec"]["worker"]["spec"]["containers"][0]
    assert spec["spec"]["worker"]["replicas"] == 2
    assert c["resources"] == {
        "limits": {"cpu": "4", "memory": "12Gi", "nvidia.com/gpu": "2"},
        "requests": {"cpu": "4", "memory": "12Gi"},
    }
    assert "CUDA_VISIBLE_DEVICES" not in container_env(c)  # the device plugin's business
    deployment = operator_objects(spec)["workers"][0]
    values = _worker_values(container_argv(container(deployment)))
    # one worker per GPU of the pod, each with half of the pod's 12 GiB
    assert values["memory_limit"] == "6GiB"
    assert values["name"] == deployment["metadata"]["name"]  # $(DASK_WORKER_NAME), expanded
    assert values["dashboard"] is True and values["dashboard_address"] == "8788"
    env = container_env(container(deployment))
    assert (
        env["DASK_SCHEDULER_ADDRESS"]
        == "tcp://gpu-cluster-scheduler.dask-gpu.svc.cluster.local:8786"
    )


def test_worker_options_reach_the_worker_command() -> None:
    spec = _spec(
        device_memory_limit="20GB",
        rmm_pool_size=0.5,
        enable_cudf_spill=False,
        pre_import=["cupy", "numpy"],
        nthreads=2,
        memory_limit="5GiB",
        worker_resources={"GPU": 1},
        protocol="tcp",
        preload=["a.b", "c"],
    )
    c = spec["spec"]["worker"]["spec"]["containers"][0]
    values = _worker_values(container_argv(c))
    assert values["device_memory_limit"] == "20GB" and values["rmm_pool_size"] == "0.5"
    assert values["enable_cudf_spill"] is False and values["pre_import"] == "cupy,numpy"
    assert values["nthreads"] == "2" and values["memory_limit"] == "5GiB"  # as click reads it
    assert values["resources"] == "GPU=1" and values["preload"] == ("a.b", "c")


def test_scheduler_pod_has_no_gpu_and_serves_the_pod_api() -> None:
    from distributed.cli.dask_scheduler import main as dask_scheduler

    spec = _spec()
    c = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert c["resources"] == {
        "limits": {"cpu": "4", "memory": "12Gi"},
        "requests": {"cpu": "4", "memory": "12Gi"},
    }
    env = container_env(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    argv = container_argv(c)
    assert argv[:2] == ["dask", "scheduler"]
    # distributed's own parsing, which imports the preloads and checks their flags
    ctx = dask_scheduler.make_context("scheduler", argv[2:])
    assert ctx.params["preload"] == ("cudask.monitor", "cudask.deploy.operator_api")
    assert ctx.params["preload_argv"] == ("--gpus-per-pod", "2")
    assert ctx.params["host"] == "0.0.0.0"


def test_mig_resource_name() -> None:
    c = _spec(gpu_resource="nvidia.com/mig-1g.10gb", nvidia_gpu=3)["spec"]["worker"]["spec"][
        "containers"
    ][0]
    assert c["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "3"
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert _worker_values(container_argv(c))["memory_limit"] == "4GiB"  # 12 GiB / 3


# ----------------------------------------------------------------------------- Helm
def chart_worker_argv(values: dict[str, Any], pod_name: str) -> list[str]:
    """The worker container's command line as the dask Helm chart writes it
    (dask/helm-chart, dask/templates/dask-worker-deployment.yaml, 2026-06), with the
    downward API's POD_NAME expanded."""
    w = values["worker"]
    fullname = values["fullnameOverride"]
    url = w.get("custom_scheduler_url") or f"{fullname}-scheduler:8786"
    argv = [w["image"]["dask_worker"], url]
    limits = w["resources"].get("limits")
    if limits:
        argv += [
            "--nthreads",
            str(w.get("threads_per_worker") or limits["cpu"]),
            "--memory-limit",
            str(limits["memory"]),
        ]
    argv += ["--no-dashboard", "--dashboard-address", str(w.get("portDashboard", 8790))]
    argv += list(w["extraArgs"])
    return [a.replace("$(POD_NAME)", pod_name) for a in argv]


def chart_worker_deployment(values: dict[str, Any]) -> dict[str, Any]:
    """The chart's worker Deployment for these values (the parts it fills from them)."""
    w = values["worker"]
    labels = {"app": "dask", "component": "worker"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{values['fullnameOverride']}-worker", "labels": labels},
        "spec": {
            "replicas": w["replicas"],
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": f"{values['fullnameOverride']}-worker",
                            "image": f"{w['image']['repository']}:{w['image']['tag']}",
                            "args": chart_worker_argv(values, "$(POD_NAME)"),
                            "ports": [{"containerPort": 8790, "name": "dashboard"}],
                            "resources": w["resources"],
                            "env": w["env"],
                        }
                    ]
                },
            },
        },
    }


def test_helm_values_run_cudask_workers_with_their_memory_share() -> None:
    values = helm_values(check_pods(**{**PLATFORM, "namespace": None}, device_memory_limit=0.8))
    argv = chart_worker_argv(values, "gpu-cluster-worker-5d8f9c-abcde")
    given = _worker_values(argv)
    assert given["scheduler"] == "tcp://gpu-cluster-scheduler:8786"
    assert given["memory_limit"] == "6GiB"  # the last --memory-limit wins over the pod's 12Gi
    assert given["nthreads"] == "1" and given["device_memory_limit"] == "0.8"
    assert given["name"] == "gpu-cluster-worker-5d8f9c-abcde"
    assert values["worker"]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    scheduler_env = {e["name"]: e["value"] for e in values["scheduler"]["env"]}
    assert scheduler_env == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    assert values["scheduler"]["image"] == {
        "repository": "registry.example.com/cudask",
        "tag": "0.1.0",
    }
    kubernetes_validate.validate(chart_worker_deployment(values), K8S_VERSION, strict=True)


# --------------------------------------------------------------- committed examples
EXAMPLE = [
    "--name",
    "gpu-cluster",
    "--image",
    "registry.example.com/cudask:0.1.0",
    "--num-workers",
    "2",
    "--nvidia-gpu",
    "2",
    "--worker-cpu",
    "4",
    "--worker-memory",
    "12",
    "--scheduler-cpu",
    "4",
    "--scheduler-memory",
    "12",
]


@pytest.mark.parametrize(
    "command, extra, path",
    [
        ("manifest", ["--namespace", "dask-gpu"], "daskcluster.yaml"),
        ("helm-values", [], "helm-values.yaml"),
    ],
)
def test_committed_examples_are_current(command: str, extra: list[str], path: str) -> None:
    result = CliRunner().invoke(cli, ["kubernetes", command, *EXAMPLE, *extra])
    assert result.exit_code == 0, result.output
    assert (DOCS / path).read_text() == result.output, (
        f"docs/kubernetes/{path} is stale: regenerate it with `cudask kubernetes {command} "
        f"{' '.join(EXAMPLE + extra)} > docs/kubernetes/{path}`"
    )
    assert yaml.safe_load(result.output)


def test_manifest_is_what_the_class_creates() -> None:
    result = CliRunner().invoke(
        dask_cudask, ["kubernetes", "manifest", *EXAMPLE, "--namespace", "dask-gpu"]
    )
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == _spec()


def test_dask_cudask_kubernetes_runs_through_dask() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dask",
            "cudask",
            "kubernetes",
            "manifest",
            *EXAMPLE,
            "--namespace",
            "dask-gpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["kind"] == "DaskCluster"


# -------------------------------------------------------------------------- bad input
# (keywords, text naming the value, text saying what is accepted)
BAD = [
    ({"nvidia_gpu": 0}, "nvidia_gpu=0", "at least 1"),
    ({"nvidia_gpu": 1.5}, "nvidia_gpu=1.5", "whole number"),
    ({"nvidia_gpu": True}, "nvidia_gpu=True", "whole number"),
    ({"image": None}, "image is missing", "e.g. image="),
    ({"image": "my image"}, "image='my image'", "without spaces"),
    ({"namespace": "Dask_GPU"}, "namespace='Dask_GPU'", "lowercase letters"),
    ({"name": "My_Cluster"}, "name='My_Cluster'", "at most 53"),
    ({"worker_memory": 0}, "worker_memory=0", "GiB as a number"),
    ({"worker_memory": "lots"}, "worker_memory='lots'", "'12Gi'"),
    ({"scheduler_memory": -4}, "scheduler_memory=-4", "GiB as a number"),
    ({"worker_cpu": 0}, "worker_cpu=0", "CPU cores"),
    ({"scheduler_cpu": "fast"}, "scheduler_cpu='fast'", "'500m'"),
    ({"num_workers": -1}, "num_workers=-1", "at least 0"),
    ({"memory_limit": "10GB"}, "memory_limit='10GB'", "at most 6.00 GiB"),
    ({"memory_limit": 0.75}, "memory_limit=0.75", "at most 6.00 GiB"),
    ({"memory_limit": "banana"}, "memory_limit='banana'", '"40GB"'),
    ({"device_memory_limit": "banana"}, "device_memory_limit='banana'", '"40GB"'),
    ({"protocol": "carrier-pigeon"}, "protocol='carrier-pigeon'", "accepted: inproc, tcp"),
    ({"scheduler_file": "s.json"}, "scheduler_file='s.json'", "leave it out"),
    ({"dashboard_address": ":9000"}, "dashboard_address=':9000'", "leave it out"),
    (
        {"listen_address": "tcp://0.0.0.0:9000"},
        "listen_address='tcp://0.0.0.0:9000'",
        "leave it out",
    ),
    ({"worker_port": "9000"}, "worker_port='9000'", "9000:9001"),
    ({"worker_class": "not a path"}, "worker_class='not a path'", "dotted import path"),
    ({"threads_per_worker": 2}, "threads_per_worker", "nthreads"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "CUDA_VISIBLE_DEVICES", "leave it out"),
    ({"env": {"EXTRA": 1}}, "env['EXTRA']=1", "a dict of strings"),
    ({"env": "EXTRA=1"}, "env='EXTRA=1'", "a dict of strings"),
    ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, "'nvidia.com/gpu'", "nvidia_gpu="),
    ({"resources": {"limit": {}}}, "resources={'limit': {}}", "'limits'"),
    ({"gpu_resource": "gpu"}, "gpu_resource='gpu'", "'nvidia.com/gpu'"),
    ({"scheduler_service_type": "Ingress"}, "scheduler_service_type='Ingress'", "ClusterIP"),
    ({"scheduler_timeout": 0}, "scheduler_timeout=0", "seconds above 0"),
    ({"worker_command": "cudask worker"}, "worker_command='cudask worker'", "list of words"),
]


def _check_message(message: str, value: str, accepted: str) -> None:
    assert value in message, message
    assert accepted in message, message
    assert "\n" not in message.strip(), message


@pytest.fixture
def nothing_created(monkeypatch: pytest.MonkeyPatch) -> None:
    def created(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a KubeCluster was made before the bad input was caught")

    monkeypatch.setattr(KubeCluster, "__init__", created)


@pytest.mark.parametrize("kwargs, value, accepted", BAD)
def test_bad_input_before_anything_is_created(
    kwargs: dict[str, Any], value: str, accepted: str, nothing_created: None
) -> None:
    with pytest.raises(OptionError) as info:
        kube.KubeCUDACluster(**{**PLATFORM, **kwargs})
    _check_message(str(info.value), value, accepted)
    with pytest.raises(OptionError) as info:
        kube.DaskCudaCluster(**{**PLATFORM, **kwargs})
    _check_message(str(info.value), value, accepted)


CLI_BAD = [
    (["--nvidia-gpu", "0"], "'--nvidia-gpu'", "--nvidia-gpu 0", "at least 1"),
    (["--worker-memory", "lots"], "'--worker-memory'", "--worker-memory lots", "'12Gi'"),
    (["--memory-limit", "10GB"], "'--memory-limit'", "--memory-limit 10GB", "at most 6.00 GiB"),
    (
        ["--device-memory-limit", "banana"],
        "'--device-memory-limit'",
        "--device-memory-limit banana",
        '"40GB"',
    ),
    (["--env", "CUDA_VISIBLE_DEVICES=0"], "'--env'", "CUDA_VISIBLE_DEVICES", "leave it out"),
    (["--env", "NOEQUALS"], "'--env'", "'NOEQUALS'", "NAME=VALUE"),
    (
        ["--limit", "nvidia.com/gpu=4"],
        "'--limit/--request'",
        "'nvidia.com/gpu'",
        "--nvidia-gpu gives",
    ),
    (["--namespace", "Dask_GPU"], "'--namespace'", "--namespace Dask_GPU", "lowercase"),
    (["--enable-rdmacm"], "", "--enable-rdmacm", "needs --enable-infiniband"),
    (
        ["--listen-address", "tcp://0.0.0.0:9000"],
        "'--listen-address'",
        "--listen-address tcp://0.0.0.0:9000",
        "give --nvidia-gpu 1",
    ),
]


@pytest.mark.parametrize("args, flag, value, accepted", CLI_BAD)
def test_cli_bad_input_is_a_usage_error(
    args: list[str], flag: str, value: str, accepted: str
) -> None:
    result = CliRunner().invoke(
        cli, ["kubernetes", "manifest", *EXAMPLE, "--namespace", "dask-gpu", *args]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "Usage:" in result.output
    error = " ".join(result.output.split("Error: ", 1)[1].split())
    if flag:
        assert f"Invalid value for {flag}" in error, error
    _check_message(error, value, accepted)
    assert not re.search(r"(?<![\w-])[a-z]+(_[a-z]+)*=['\d]", error), error  # flags, not keywords


def test_cli_config_value_is_not_called_a_flag() -> None:
    """A bad value of the local config names its key, not a flag nobody gave."""
    with dask.config.set({"cudask.worker.device-memory-limit": "banana"}):
        result = CliRunner().invoke(cli, ["kubernetes", "manifest", *EXAMPLE])
    assert result.exit_code == 2 and "Usage:" not in result.output, result.output
    assert "config key cudask.worker.device-memory-limit: device_memory_limit='banana'" in " ".join(
        result.output.split()
    )


def test_cli_missing_image_speaks_flags() -> None:
    args = [*EXAMPLE]
    i = args.index("--image")
    del args[i : i + 2]
    result = CliRunner().invoke(cli, ["kubernetes", "manifest", *args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    error = " ".join(result.output.split("Error: ", 1)[1].split())
    assert error.startswith("--image is missing") and "e.g. --image registry." in error, error


def test_manifest_without_namespace_names_none() -> None:
    """kubectl puts a resource without a namespace in the current context's (or -n's),
    as dask-kubernetes' KubeCluster does when given none."""
    result = CliRunner().invoke(
        cli,
        [
            "kubernetes",
            "manifest",
            "--name",
            "gpu",
            "--num-workers",
            "2",
            "--nvidia-gpu",
            "2",
            "--image",
            "img:1",
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.output)
    assert "namespace" not in manifest["metadata"] and manifest["metadata"]["name"] == "gpu"
    help_text = CliRunner().invoke(cli, ["kubernetes", "manifest", "--help"]).output
    assert "required" not in " ".join(
        help_text.split("--namespace", 1)[1].split("--", 1)[0].split()
    )
    assert check_pods(**{**PLATFORM, "namespace": None}).namespace is None


def test_cli_leaves_out_what_the_pods_decide() -> None:
    help_text = (
        CliRunner().invoke(cli, ["kubernetes", "manifest", "--help"], terminal_width=200).output
    )
    assert "--device-memory-limit" in help_text and "--rmm-pool-size" in help_text
    for flag in ("--scheduler-file", "--dashboard-address"):
        assert flag not in help_text


def test_the_class_and_the_checks_declare_the_same_pod_parameters() -> None:
    """KubeCUDACluster spells out check_pods' parameters for its users: same names, same
    defaults, so the two declarations cannot drift."""
    import inspect

    checks = inspect.signature(check_pods).parameters
    cls = inspect.signature(kube.KubeCUDACluster.__init__).parameters
    shared = [n for n in checks if n in cls and checks[n].kind is inspect.Parameter.KEYWORD_ONLY]
    assert len(shared) >= 15
    for name in shared:
        assert cls[name].default == checks[name].default, name
    assert [n for n in checks if n not in cls] == ["worker_resources"]
