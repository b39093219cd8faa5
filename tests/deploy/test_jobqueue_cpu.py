"""dask-jobqueue clusters of cudask workers, without a GPU (issue 15, item 3).

Covers: the SLURM and PBS job scripts that `cudask.deploy.jobqueue.job_kwargs` makes
dask-jobqueue write, parsed (directives into options, the command into argv, the
argv through `cudask worker`'s own parser); worker options surviving the trip to
flags and back; bad input refused with the CLI's messages before any job is
submitted; and the command of jobqueue's LocalCluster run for real, up to the point
where it looks for a GPU. The run with a GPU is in test_jobqueue_gpu.py.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from dask.utils import parse_bytes, parse_timedelta

from cudask.cli.main import cli
from cudask.cli.worker import worker
from cudask.deploy.checks import check_input
from cudask.deploy.jobqueue import WORKER_COMMAND, job_kwargs, worker_flags
from cudask.errors import OptionError
from cudask.options import BY_NAME, WorkerOptions
from cudask.sizes import parse_size
from cudask.testing import real_gpu_count
from cudask.worker.spec import parse_resources

pytest.importorskip("dask_jobqueue", reason="dask-jobqueue is not installed")

from dask_jobqueue import PBSCluster, SLURMCluster
from dask_jobqueue.local import LocalCluster

SCHEDULER_OPTIONS = {"dashboard_address": ":0"}


# ---- reading a job script


def _script(text: str, prefix: str) -> tuple[list[list[str]], list[str]]:
    """(each `prefix` directive as its words, the worker command as argv)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    directives = [shlex.split(line[len(prefix) :]) for line in lines if line.startswith(prefix)]
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == 1, text  # no prologue: the worker command alone
    return directives, shlex.split(commands[0])


def _sbatch(directives: list[list[str]]) -> dict[str, str]:
    """#SBATCH directives as {option: value}: '--gres=gpu:2' and '-n 1' alike."""
    out: dict[str, str] = {}
    for words in directives:
        if len(words) == 1 and "=" in words[0]:
            key, value = words[0].split("=", 1)
        else:
            key, value = words[0], " ".join(words[1:])
        assert key not in out, f"{key} given twice"
        out[key] = value
    return out


def _pbs_select(directives: list[list[str]]) -> dict[str, str]:
    """The chunk of `#PBS -l select=...` as {resource: amount}."""
    (select,) = [w[1] for w in directives if w[0] == "-l" and w[1].startswith("select=")]
    return dict(item.split("=", 1) for item in select.split(":"))


def _worker_argv(argv: list[str]) -> tuple[str, WorkerOptions]:
    """The scheduler and the options `python -m cudask.cli worker ...` runs with, read
    by the command's own click parser and checked as it checks them."""
    assert argv[:4] == [sys.executable, "-m", *WORKER_COMMAND.split()], argv
    ctx = worker.make_context("worker", argv[4:])
    params = dict(ctx.params)
    scheduler = params.pop("scheduler")
    given = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in params.items()
        if v is not None and v != ()
    }
    return scheduler, check_input(given, "cli", libraries=False)


@pytest.fixture
def close() -> Iterator[list[Any]]:
    clusters: list[Any] = []
    yield clusters
    for c in clusters:
        c.close()


# ---- the job scripts


def test_slurm_job_script(close: list[Any]) -> None:
    cluster = SLURMCluster(
        queue="gpu",
        account="proj",
        walltime="01:00:00",
        scheduler_options=SCHEDULER_OPTIONS,
        **job_kwargs(
            "slurm",
            gpus_per_job=2,
            cores=16,
            memory="64GB",
            device_memory_limit="30GB",
            jit_unspill=True,
            pre_import="json",
            rmm_pool_size="20GB",
            local_directory="/scratch/dask",
            job_extra_directives=["--exclusive"],
        ),
    )
    close.append(cluster)
    directives, argv = _script(cluster.job_script(), "#SBATCH")
    sbatch = _sbatch(directives)
    assert sbatch["--gres"] == "gpu:2"
    assert sbatch["--cpus-per-task"] == "16" and sbatch["-n"] == "1"
    assert sbatch["-p"] == "gpu" and sbatch["-A"] == "proj" and sbatch["-t"] == "01:00:00"
    assert "--exclusive" in sbatch
    scheduler, o = _worker_argv(argv)
    assert scheduler == cluster.scheduler_address
    # one worker per GPU: jobqueue's share of the job for each of its 2 processes
    assert o.nthreads == 8 and parse_bytes(o.memory_limit) == pytest.approx(32e9, rel=0.01)
    assert o.name == "dummy-name" and o.local_directory == "/scratch/dask"
    assert o.device_memory_limit == "30GB" and o.jit_unspill is True
    assert o.pre_import == ["json"] and o.rmm_pool_size == "20GB"
    # its names are NAME-0, NAME-1: those jobqueue expects of a job of 2 processes
    assert cluster._dummy_job.worker_processes == 2


def test_pbs_job_script(close: list[Any]) -> None:
    cluster = PBSCluster(
        queue="gpuq",
        walltime="02:00:00",
        scheduler_options=SCHEDULER_OPTIONS,
        **job_kwargs(
            "pbs",
            gpus_per_job=4,
            cores=32,
            memory="256GB",
            device_memory_limit=0.8,
            enable_cudf_spill=False,
            protocol="tcp",
        ),
    )
    close.append(cluster)
    directives, argv = _script(cluster.job_script(), "#PBS")
    assert _pbs_select(directives) == {"select": "1", "ncpus": "32", "ngpus": "4", "mem": "239gb"}
    assert ["-q", "gpuq"] in directives and ["-l", "walltime=02:00:00"] in directives
    _, o = _worker_argv(argv)
    assert o.nthreads == 8 and parse_bytes(o.memory_limit) == pytest.approx(64e9, rel=0.01)
    assert o.device_memory_limit == "0.8" and o.enable_cudf_spill is False
    assert o.protocol == "tcp"


def test_one_gpu_jobs_have_one_process(close: list[Any]) -> None:
    kwargs = job_kwargs("slurm", cores=8, memory="32GB")
    assert kwargs["processes"] == 1 and kwargs["worker_extra_args"] == []
    cluster = SLURMCluster(scheduler_options=SCHEDULER_OPTIONS, **kwargs)
    close.append(cluster)
    directives, argv = _script(cluster.job_script(), "#SBATCH")
    assert _sbatch(directives)["--gres"] == "gpu:1"
    assert _worker_argv(argv)[1].nthreads == 8


# ---- worker options: to flags and back

ROUND_TRIP = [
    {"device_memory_limit": "40GB", "memory_limit": None},
    {"device_memory_limit": None, "rmm_pool_size": 0.5, "rmm_maximum_pool_size": "70GB"},
    {"rmm_async": True, "rmm_release_threshold": "10GB", "log_spilling": True},
    {"jit_unspill": False, "enable_nvlink": True, "enable_infiniband": True, "enable_rdmacm": True},
    {
        "pre_import": ["json", "numpy"],
        "preload": ["a.py", "b"],
        "rmm_allocator_external_lib_list": "cupy,torch",
    },
    {
        "resources": "GPU=1 MEM=10e9",
        "death_timeout": 30,
        "dashboard": False,
        "dashboard_address": ":8788",
    },
    {
        "resources": {"GPU": 2},
        "worker_port": "9000:9003",
        "host": "10.0.0.1",
        "multiprocessing_method": "forkserver",
        "cudf_spill_stats": 2,
    },
    {
        "worker_class": "cudask.testing.workers.TaggedWorker",
        "nanny": False,
        "rmm_managed_memory": True,
        "rmm_track_allocations": True,
    },
]


@pytest.mark.parametrize("options", ROUND_TRIP)
def test_options_survive_the_command_line(options: dict[str, Any]) -> None:
    flags = worker_flags(options)
    argv = [
        sys.executable,
        "-m",
        *WORKER_COMMAND.split(),
        "tcp://10.0.0.1:8786",
        *shlex.split(" ".join(flags)),
    ]
    _, parsed = _worker_argv(argv)
    expected = check_input(options, "cli", libraries=False)
    for name in options:
        assert _meaning(name, parsed[name]) == _meaning(name, expected[name]), (name, flags)


def _meaning(name: str, value: Any) -> Any:
    """What a value comes to: sizes in bytes of an 80 GiB device (the CLI hands them
    over as text: "0.5", "0"), resources as a dict, durations in seconds."""
    if BY_NAME[name].kind == "size":
        return parse_size(value, total=80 << 30, name=name)
    if name == "resources":
        return parse_resources(value)
    if name == "death_timeout":
        return parse_timedelta(value, default="seconds")
    return value


def test_flags_are_shell_words() -> None:
    flags = worker_flags({"local_directory": "/scratch/my dir", "resources": "GPU=1 MEM=10e9"})
    assert shlex.split(" ".join(flags)) == [
        "--local-directory",
        "/scratch/my dir",
        "--resources",
        "GPU=1.0,MEM=10000000000.0",
    ]


def test_libraries_are_the_workers_business() -> None:
    # rmm, UCX, cuDF may be on the GPU nodes only: not checked where jobs are submitted
    kwargs = job_kwargs(
        "slurm",
        cores=8,
        memory="32GB",
        rmm_pool_size="10GB",
        protocol="ucx",
        enable_cudf_spill=True,
        pre_import="not_here_module",
    )
    assert "--rmm-pool-size" in kwargs["worker_extra_args"] and kwargs["protocol"] == "ucx"


# ---- bad input: refused before any job is submitted


def _cli_message(args: list[str]) -> str:
    result = CliRunner().invoke(cli, ["worker", "tcp://127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    error = " ".join(result.output.split("Error: ", 1)[1].split())
    return error.split("': ", 1)[1] if error.startswith("Invalid value for '") else error


# (worker options, the same mistake as `cudask worker` flags)
BAD_OPTIONS = [
    ({"device_memory_limit": "banana"}, ["--device-memory-limit", "banana"]),
    ({"rmm_pool_size": "1.5"}, ["--rmm-pool-size", "1.5"]),
    ({"protocol": "carrier-pigeon"}, ["--protocol", "carrier-pigeon"]),
    ({"worker_port": "9000-9003"}, ["--worker-port", "9000-9003"]),
    ({"resources": "GPU"}, ["--resources", "GPU"]),
    ({"death_timeout": "soon"}, ["--death-timeout", "soon"]),
    ({"rmm_async": True, "rmm_managed_memory": True}, ["--rmm-async", "--rmm-managed-memory"]),
    ({"worker_class": "no.such.Class"}, ["--worker-class", "no.such.Class"]),
    ({"enable_rdmacm": True}, ["--enable-rdmacm"]),
]


@pytest.mark.parametrize("options, flags", BAD_OPTIONS)
def test_bad_worker_options_say_what_the_cli_says(
    options: dict[str, Any], flags: list[str]
) -> None:
    with pytest.raises(OptionError) as info:
        job_kwargs("slurm", gpus_per_job=2, cores=16, memory="64GB", **options)
    assert " ".join(str(info.value).split()) == _cli_message(flags)


BAD_JOBS = [
    ({"queue_system": "lsf"}, "queue_system='lsf'", "accepted: slurm, pbs, local"),
    ({"gpus_per_job": 0}, "gpus_per_job=0", "at least 1"),
    ({"gpus_per_job": "2"}, "gpus_per_job='2'", "e.g. gpus_per_job=4"),
    ({"gpus_per_job": 4, "cores": 2}, "cores=2", "at least gpus_per_job=4"),
    ({"memory": "lots"}, "memory='lots'", "'64GB'"),
    ({"nthreads": 4}, "nthreads=4", "give cores="),
    ({"memory_limit": "10GB"}, "memory_limit='10GB'", "give memory="),
    ({"name": "x"}, "name='x'", "names each job's workers"),
    ({"scheduler_file": "s.json"}, "scheduler_file='s.json'", "scheduler's address"),
    ({"tls_cert": "c.pem"}, "tls_cert='c.pem'", "security="),
    ({"nanny": False, "gpus_per_job": 2}, "nanny=False", "gpus_per_job=1, not 2"),
    ({"bogus": 1}, "bogus", "accepted: "),
]


@pytest.mark.parametrize("change, value, accepted", BAD_JOBS)
def test_bad_jobs(change: dict[str, Any], value: str, accepted: str) -> None:
    kwargs: dict[str, Any] = {"queue_system": "slurm", "cores": 8, "memory": "32GB", **change}
    with pytest.raises(OptionError) as info:
        job_kwargs(**kwargs)
    message = str(info.value)
    assert value in message and accepted in message and "\n" not in message, message


# ---- jobqueue's LocalCluster runs the command (as far as a machine without GPU allows)


@pytest.mark.skipif(real_gpu_count() > 0, reason="a GPU is here: test_jobqueue_gpu.py runs it")
def test_local_job_command_runs_until_it_looks_for_a_gpu(close: list[Any]) -> None:
    cluster = LocalCluster(
        scheduler_options=SCHEDULER_OPTIONS,
        **job_kwargs("local", cores=2, memory="4GB", device_memory_limit="1GB", jit_unspill=True),
    )
    close.append(cluster)
    argv = cluster.job_script().split()  # as LocalJob runs it: no shell
    _worker_argv(argv)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    # every flag was accepted (a bad one exits 2); it stopped only for want of a GPU
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: no NVIDIA GPU found"), proc.stderr
