"""Bad input is caught before any GPU is looked for.

Each row is one bad value given to LocalCUDACluster, CUDAWorker, `cudask worker`,
a `cudask.*` config key or an environment variable. `discover()` is replaced by a
function that fails the test, so every row proves its check runs before discovery
(the machine these run on may have no GPU at all: the message must then not be
"no NVIDIA GPU found"). Each message must name the bad value, where it came from
(a keyword, a flag, an environment variable or a config key) and what is accepted,
on one line; the CLI exits with status 2, with click's usage block only for flags.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask.config
import pytest
from click.testing import CliRunner

from cudask import LocalCUDACluster
from cudask import config as cudask_config
from cudask.cli.main import cli
from cudask.deploy import local, node
from cudask.deploy.node import CUDAWorker
from cudask.errors import MissingDependencyError, OptionError

SCHEDULER = "tcp://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    def discover(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GPUs were looked for before the bad input was caught")

    monkeypatch.setattr(local, "discover", discover)
    monkeypatch.setattr(node, "discover", discover)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# (keywords, text naming the value, text saying what is accepted)
CLUSTER = [
    ({"device_memory_limit": "banana"}, "device_memory_limit='banana'", '"40GB"'),
    ({"device_memory_limit": -1}, "device_memory_limit=-1", "accepted"),
    ({"device_memory_limit": 1.5}, "device_memory_limit=1.5", "(0, 1]"),
    ({"device_memory_limit": "-5GB"}, "device_memory_limit='-5GB'", "accepted"),
    ({"device_memory_limit": True}, "device_memory_limit=True", "accepted"),
    ({"memory_limit": "banana"}, "memory_limit='banana'", "accepted"),
    ({"memory_limit": -0.5}, "memory_limit=-0.5 is negative", "accepted"),
    ({"memory_limit": "default"}, "memory_limit='default'", "'auto'"),
    ({"rmm_pool_size": "lots"}, "rmm_pool_size='lots'", '"40GB"'),
    ({"rmm_pool_size": 2.0}, "rmm_pool_size=2.0", "(0, 1]"),
    ({"rmm_maximum_pool_size": "x GB"}, "rmm_maximum_pool_size='x GB'", "accepted"),
    ({"rmm_release_threshold": -3}, "rmm_release_threshold=-3", "accepted"),
    ({"protocol": "tcpx"}, "protocol='tcpx'", "accepted: inproc, tcp"),
    ({"protocol": "udp"}, "protocol='udp'", "e.g. protocol='tcp'"),
    ({"protocol": 5}, "protocol=5", "accepted: a string"),
    ({"rmm_async": True, "rmm_managed_memory": True}, "rmm_async=True", "choose one"),
    ({"jit_unspill": True, "enable_cudf_spill": True}, "jit_unspill=True", "choose one"),
    ({"jit_unspill": "maybe"}, "jit_unspill='maybe'", "accepted: true or false (also"),
    ({"jit_unspill": "maybe"}, "jit_unspill='maybe'", "yes/no, on/off and 1/0"),
    ({"rmm_async": "sometimes"}, "rmm_async='sometimes'", "accepted: true or false"),
    ({"threads_per_worker": 0}, "threads_per_worker=0", "at least 1"),
    ({"threads_per_worker": "four"}, "threads_per_worker='four'", "whole number"),
    ({"n_workers": 0}, "n_workers=0", "at least 1"),
    ({"n_workers": -2}, "n_workers=-2", "at least 1"),
    ({"n_workers": "two"}, "n_workers='two'", "e.g. n_workers=2"),
    ({"CUDA_VISIBLE_DEVICES": "0,,x"}, "CUDA_VISIBLE_DEVICES='0,,x'", "e.g. '0,1'"),
    ({"CUDA_VISIBLE_DEVICES": "x"}, "'x'", "e.g. '0,1'"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "'-1'", "GPU indices"),
    ({"CUDA_VISIBLE_DEVICES": "0,0"}, "'0,0'", "each once"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "CUDA_VISIBLE_DEVICES=''", "e.g. '0,1'"),
    ({"nonsense_keyword": 1}, "nonsense_keyword", "accepted: "),
    ({"rmm_allocator_external_lib_list": "jax"}, "'jax'", "accepted: cupy, torch"),
    ({"cudf_spill_stats": -1}, "cudf_spill_stats=-1", "at least 0"),
    ({"enable_rdmacm": True}, "enable_rdmacm=True", "needs enable_infiniband=True"),
    ({"enable_infiniband": True, "protocol": "tcp"}, "protocol='tcp'", "needs protocol='ucx'"),
    ({"local_directory": 5}, "local_directory=5", "e.g. local_directory="),
    # LocalCluster's own keywords, and the network and files of this machine
    ({"dashboard_address": 12.5}, "dashboard_address=12.5", "':8787'"),
    ({"dashboard_address": "banana"}, "dashboard_address='banana'", "does not resolve"),
    ({"worker_dashboard_address": ":99999"}, "worker_dashboard_address=':99999'", "out of range"),
    ({"scheduler_port": -5}, "scheduler_port=-5", "from 0 (any free port) to 65535"),
    ({"scheduler_port": "eighty"}, "scheduler_port='eighty'", "a whole number"),
    ({"scheduler_port": 70000}, "scheduler_port=70000", "to 65535"),
    ({"silence_logs": "loud"}, "silence_logs='loud'", "'warning'"),
    ({"interface": "nosuchif0"}, "interface='nosuchif0'", "accepted: one of"),
    ({"host": "999.1.1.1"}, "host='999.1.1.1'", "a name or IP address of this machine"),
    ({"protocol": "tls"}, "protocol='tls' needs TLS certificates", "security=True"),
    ({"host": "tls://127.0.0.1"}, "host='tls://127.0.0.1' needs TLS certificates", "security=True"),
    ({"local_directory": "/proc/nope"}, "local_directory='/proc/nope'", "a writable directory"),
    (
        {"local_directory": "/etc/hostname"},
        "local_directory='/etc/hostname'",
        "a writable directory",
    ),
    ({"rmm_log_directory": "/proc/nope"}, "rmm_log_directory='/proc/nope'", "a writable directory"),
    ({"cudf_spill_stats": 5}, "cudf_spill_stats=5", "from 0 to 2"),
    (
        {"pre_import": "no_such_module_xyz"},
        "pre_import='no_such_module_xyz'",
        "a module importable",
    ),
    ({"pre_import": "no_such_package_xyz.sub"}, "'no_such_package_xyz.sub'", "a module importable"),
    ({"rmm_async": "maybe"}, "rmm_async='maybe'", "yes/no"),
    # a newcomer's mistakes: counts as text, off and empty values, numbers that are no size
    (
        {"workers_per_gpu": "2"},
        "workers_per_gpu='2' is not an integer but a string",
        "e.g. workers_per_gpu=1",
    ),
    (
        {"threads_per_worker": 1.0},
        "threads_per_worker=1.0 is not an integer",
        "e.g. threads_per_worker=1",
    ),
    (
        {"device_memory_limit": float("nan")},
        "device_memory_limit=nan is not a number of bytes",
        '"40GB"',
    ),
    (
        {"device_memory_limit": 4e9},
        "device_memory_limit=4000000000.0",
        'e.g. 4000000000 or "3.73 GiB"',
    ),
    ({"memory_limit": 1.5}, "memory_limit=1.5: a fraction must lie in (0, 1]", '"40GB"'),
    ({"memory_limit": 10**30}, "more than this machine's", "accepted: at most"),
    ({"device_memory_limit": ""}, "device_memory_limit='' is empty", "leave it out"),
    ({"local_directory": ""}, "local_directory='' is empty", "e.g. local_directory='/tmp/dask'"),
    ({"rmm_log_directory": " "}, "rmm_log_directory=' ' is empty", "accepted: a path"),
    (
        {"pre_import": "numpy,,json"},
        "pre_import='numpy,,json' has an empty entry",
        "e.g. pre_import='numpy,json'",
    ),
    ({"pre_import": ["numpy", ""]}, "has an empty entry", "or a list of names"),
    ({"rmm_allocator_external_lib_list": "cupy,"}, "has an empty entry", "'cupy,torch'"),
    (
        {"rmm_pool_size": "2GB", "rmm_maximum_pool_size": "1GB"},
        "rmm_maximum_pool_size='1GB' is smaller than rmm_pool_size='2GB'",
        "accepted: a maximum",
    ),
    (
        {"rmm_pool_size": 0.8, "rmm_maximum_pool_size": 0.5},
        "rmm_maximum_pool_size=0.5 is smaller than rmm_pool_size=0.8",
        "accepted: a maximum",
    ),
    (
        {"rmm_pool_size": "0", "rmm_maximum_pool_size": "1GB"},
        "rmm_maximum_pool_size='1GB' needs",
        "rmm_pool_size='20GB'",
    ),
    (
        {"rmm_release_threshold": "1GB"},
        "rmm_release_threshold='1GB' needs rmm_async=True",
        "async allocator",
    ),
    ({"security": "banana"}, "security='banana' is not accepted", "a distributed.Security, True"),
    ({"death_timeout": "never"}, "death_timeout='never' is not a duration", "'60s'"),
    ({"lifetime": "soon"}, "lifetime='soon' is not a duration", "e.g. lifetime='1 hour'"),
    ({"heartbeat_interval": -1}, "heartbeat_interval=-1 is negative", "0 or more"),
    ({"nthreads": 2}, "nthreads=2", "e.g. threads_per_worker=2"),
    ({"scheduler_kwargs": "x"}, "scheduler_kwargs='x' is not a dict", "e.g. scheduler_kwargs={}"),
    ({"resources": "GPU=-1"}, "'GPU' has the amount -1.0", "amounts of 0 or more"),
    (
        {"worker_class": "distributed"},
        "worker_class='distributed' is a module",
        "e.g. worker_class='distributed.Worker'",
    ),
    (
        {"worker_class": "json.JSONDecoder"},
        "worker_class='json.JSONDecoder' is another class",
        "distributed.Nanny, or its import path",
    ),
    ({"protocol": ""}, "protocol='' is empty", "e.g. protocol='tcp'"),
]

WORKER = [
    ({"device_memory_limit": "banana"}, "device_memory_limit='banana'", '"40GB"'),
    ({"worker_port": "abc"}, "worker_port='abc'", "9000:9003"),
    ({"worker_port": "9003:9000"}, "worker_port='9003:9000'", "ends before it starts"),
    ({"resources": "GPU"}, "'GPU'", "example: 'GPU=1 MEM=10e9'"),
    ({"resources": 5}, "resources=5", "'GPU=1 MEM=10e9'"),
    ({"death_timeout": "soon"}, "death_timeout='soon'", "'60s'"),
    ({"expected_gpus": 0}, "expected_gpus=0 must be at least 1", "e.g. expected_gpus=1"),
    ({"worker_class": "no.such.Class"}, "worker_class='no.such.Class'", "'distributed.Worker'"),
    ({"multiprocessing_method": "thread"}, "multiprocessing_method='thread'", "spawn, fork"),
    ({"nthreads": 0}, "nthreads=0", "at least 1"),
    ({"bogus": 1}, "bogus", "accepted: "),
    (
        {"contact_address": "tcp://node1:9000"},
        "contact_address='tcp://node1:9000'",
        "--listen-address",
    ),
    ({"protocol": "carrier-pigeon"}, "protocol='carrier-pigeon'", "accepted: inproc, tcp"),
    ({"env:CUDA_VISIBLE_DEVICES": "0,,x"}, "CUDA_VISIBLE_DEVICES='0,,x'", "e.g. '0,1'"),
    ({"env:CUDA_VISIBLE_DEVICES": "GPU-a,GPU-a"}, "'GPU-a'", "each once"),
    # the scheduler's address, parsed as distributed parses it
    ({"scheduler": "not-an-address"}, "scheduler='not-an-address'", "tcp://10.0.0.1:8786"),
    ({"scheduler": "foo://127.0.0.1:8786"}, "unknown scheme 'foo'", "tcp://10.0.0.1:8786"),
    ({"scheduler": "tcp://10.0.0.1:70000"}, "port 70000 is out of range", "tcp://10.0.0.1"),
    ({"scheduler": "tcp://:8786"}, "names no host", "tcp://10.0.0.1:8786"),
    ({"scheduler": "-oops"}, "scheduler='-oops' looks like a flag", "tcp://10.0.0.1:8786"),
    (
        {"scheduler": None, "env:DASK_SCHEDULER_ADDRESS": "banana"},
        "environment variable DASK_SCHEDULER_ADDRESS: scheduler='banana'",
        "tcp://10.0.0.1:8786",
    ),
    (
        {"scheduler_file": "/tmp/scheduler.json"},
        f"address ({SCHEDULER}) or scheduler_file",
        "not both",
    ),
    (
        {"scheduler": "tls://127.0.0.1:1"},
        "scheduler='tls://127.0.0.1:1' needs TLS",
        "--tls-ca-file, --tls-cert and --tls-key",
    ),
    # this node's addresses, ports and interfaces
    ({"listen_address": "banana"}, "listen_address='banana'", "of this machine"),
    ({"listen_address": "foo://0.0.0.0:9000"}, "unknown scheme 'foo'", "tcp://0.0.0.0:9000"),
    (
        {"contact_address": "tcp://node1:99999", "listen_address": "tcp://127.0.0.1:9000"},
        "contact_address='tcp://node1:99999'",
        "out of range",
    ),
    ({"dashboard_address": "banana"}, "dashboard_address='banana'", "':8787'"),
    ({"host": "999.1.1.1"}, "host='999.1.1.1'", "of this machine"),
    ({"interface": "nosuchif0"}, "interface='nosuchif0'", "accepted: one of"),
    ({"worker_port": "70000"}, "worker_port='70000'", "from 1 to 65535"),
    ({"worker_port": "9000:70000"}, "worker_port='9000:70000'", "from 1 to 65535"),
    ({"name": ""}, "name=''", "e.g. name='node1'"),
    ({"name": "  "}, "name='  '", "e.g. name='node1'"),
    # modules, files and TLS
    ({"preload": ["no_such_module_xyz"]}, "preload='no_such_module_xyz'", "a .py file"),
    ({"preload": ["/no/such/setup.py"]}, "preload='/no/such/setup.py': no such file", "a .py file"),
    ({"pid_file": "/proc/nope/x"}, "pid_file='/proc/nope/x'", "an existing writable directory"),
    ({"pid_file": "/tmp"}, "pid_file='/tmp' is a directory", "an existing writable directory"),
    ({"local_directory": "/proc/nope"}, "local_directory='/proc/nope'", "a writable directory"),
    ({"protocol": "tls"}, "protocol='tls' needs TLS certificates", "--tls-ca-file"),
    (
        {"tls_ca_file": "/no/ca.pem", "tls_cert": "/no/c.pem", "tls_key": "/no/k.pem"},
        "tls_ca_file='/no/ca.pem': no such file",
        "a readable PEM file",
    ),
    ({"cudf_spill_stats": 5}, "cudf_spill_stats=5", "from 0 to 2"),
    # messages that used to mislead
    ({"death_timeout": -5}, "death_timeout=-5 is negative", "seconds (0 or more)"),
    ({"death_timeout": "-5s"}, "death_timeout='-5s' is negative", "seconds (0 or more)"),
    ({"nthreads": 2.5}, "nthreads=2.5 is not an integer", "a whole number of at least 1"),
    (
        {"workers_per_gpu": "2"},
        "workers_per_gpu='2' is not an integer but a string",
        "a whole number",
    ),
    (
        {"scheduler": None, "scheduler_file": "/tmp"},
        "scheduler_file='/tmp' is a directory",
        "the JSON file a scheduler wrote",
    ),
    ({"security": "banana"}, "security='banana' is not accepted", "a distributed.Security or None"),
    ({"name": [1]}, "name=[1] is not a string or an int", "e.g. name='node1'"),
    ({"name": 3.5}, "name=3.5 is not a string or an int", "e.g. name='node1'"),
    ({"resources": {"GPU": "one"}}, "'GPU' has the amount 'one'", "e.g. {'GPU': 1}"),
    ({"worker_port": 9000.0}, "worker_port=9000.0 is not accepted", "9000:9003"),
    ({"worker_port": True}, "worker_port=True is not accepted", "9000:9003"),
    ({"preload": [5]}, "preload=[5]: every entry must be a string", "['cudask.monitor']"),
    ({"pid_file": ""}, "pid_file='' is empty", "leave it out"),
    ({"memory_limit": "1e40"}, "more than this machine's", "'auto'"),
    (
        {"env:DASK_TEMPORARY_DIRECTORY": "/proc/nope"},
        "environment variable DASK_TEMPORARY_DIRECTORY: temporary-directory='/proc/nope'",
        "or give local_directory",
    ),
]

CLI = [
    (["--device-memory-limit", "banana"], "device_memory_limit='banana'", '"40GB"'),
    (["--memory-limit", "-1"], "memory_limit='-1' is negative", '"40GB"'),
    (["--rmm-pool-size", "1.5"], "rmm_pool_size='1.5'", "(0, 1]"),
    (["--protocol", "carrier-pigeon"], "protocol='carrier-pigeon'", "accepted: inproc, tcp"),
    (["--nthreads", "0"], "nthreads=0", "at least 1"),
    (["--worker-port", "9000-9003"], "worker_port='9000-9003'", "9000:9003"),
    (["--resources", "GPU"], "'GPU'", "'GPU=1 MEM=10e9'"),
    (["--death-timeout", "soon"], "death_timeout='soon'", "'60s'"),
    (["--expected-gpus", "two"], "expected_gpus='two' is not an integer", "at least 1"),
    (["--rmm-async", "--rmm-managed-memory"], "rmm_async=True", "choose one"),
    (["--enable-jit-unspill", "--enable-cudf-spill"], "jit_unspill=True", "choose one"),
    (["--set-rmm-allocator-for-libs", "jax"], "'jax'", "accepted: cupy, torch"),
    (["--cudf-spill-stats", "-1"], "cudf_spill_stats=-1", "at least 0"),
    (["--worker-class", "no.such.Class"], "worker_class='no.such.Class'", "'distributed.Worker'"),
    (["--multiprocessing-method", "thread"], "'thread'", "'spawn'"),
    (["env:CUDA_VISIBLE_DEVICES", "0,,x"], "CUDA_VISIBLE_DEVICES='0,,x'", "e.g. '0,1'"),
    (["--listen-address", "banana"], "listen_address='banana'", "of this machine"),
    (["--dashboard-address", "banana"], "dashboard_address='banana'", "':8787'"),
    (["--host", "999.1.1.1"], "host='999.1.1.1'", "of this machine"),
    (["--interface", "nosuchif0"], "interface='nosuchif0'", "accepted: one of"),
    (["--worker-port", "70000"], "worker_port='70000'", "from 1 to 65535"),
    (["--name", ""], "name=''", "e.g. name='node1'"),
    (["--preload", "no_such_module_xyz"], "preload='no_such_module_xyz'", "a .py file"),
    (
        ["--pre-import", "no_such_module_xyz"],
        "pre_import='no_such_module_xyz'",
        "a module importable",
    ),
    (["--cudf-spill-stats", "5"], "cudf_spill_stats=5", "from 0 to 2"),
    (["--pid-file", "/proc/nope/x"], "pid_file='/proc/nope/x'", "an existing writable"),
    (["--local-directory", "/proc/nope"], "local_directory='/proc/nope'", "a writable directory"),
    (
        ["--rmm-log-directory", "/proc/nope"],
        "rmm_log_directory='/proc/nope'",
        "a writable directory",
    ),
    (["--protocol", "tls"], "protocol='tls' needs TLS certificates", "--tls-ca-file"),
    (
        ["--tls-ca-file", "/no/ca.pem", "--tls-cert", "/no/c.pem", "--tls-key", "/no/k.pem"],
        "tls_ca_file='/no/ca.pem': no such file",
        "a readable PEM file",
    ),
    (["--death-timeout", "-5"], "death_timeout='-5' is negative", "seconds (0 or more)"),
    (["--enable-jit-unspill", "--enable-cudf-spill"], "jit_unspill=True", "choose one"),
    (
        ["--scheduler-file", "/tmp/scheduler.json"],
        f"address ({SCHEDULER}) or scheduler_file",
        "not both",
    ),
    (["--nthreads", "2.5"], "nthreads='2.5' is not an integer", "a whole number of at least 1"),
    (["--workers-per-gpu", "0"], "workers_per_gpu=0 must be at least 1", "a whole number"),
    (["--cudf-spill-stats", "1.0"], "cudf_spill_stats='1.0' is not an integer", "from 0 to 2"),
    (["--device-memory-limit", ""], "device_memory_limit='' is empty", "leave it out"),
    (
        ["--device-memory-limit", "nan"],
        "device_memory_limit='nan' is not a number of bytes",
        '"40GB"',
    ),
    (["--memory-limit", "1.5"], "memory_limit='1.5': a fraction must lie in (0, 1]", '"40GB"'),
    (["--local-directory", ""], "local_directory='' is empty", "accepted: a path"),
    (
        ["--pre-import", "numpy,,json"],
        "pre_import='numpy,,json' has an empty entry",
        "e.g. pre_import='numpy,json'",
    ),
    (["--preload", ""], "preload=[''] has an empty entry", "['cudask.monitor']"),
    (
        ["--rmm-pool-size", "2GB", "--rmm-maximum-pool-size", "1GB"],
        "rmm_maximum_pool_size='1GB' is smaller than rmm_pool_size='2GB'",
        "accepted: a maximum",
    ),
    (["--worker-port", "-1"], "worker_port='-1' is not accepted", "9000:9003"),
    (["--death-timeout", "never"], "death_timeout='never' is not a duration", "'60s'"),
    (
        ["--worker-class", "distributed"],
        "worker_class='distributed' is a module",
        "e.g. worker_class='distributed.Worker'",
    ),
    (["--resources", "GPU=-1"], "'GPU' has the amount -1.0", "amounts of 0 or more"),
]

# (arguments of `cudask worker` in place of the scheduler's address, text naming the
# value, text saying what is accepted): bad addresses, usage errors that name SCHEDULER
CLI_SCHEDULER = [
    (["not-an-address"], "scheduler='not-an-address'", "tcp://10.0.0.1:8786"),
    (["foo://127.0.0.1:8786"], "unknown scheme 'foo'", "tcp://10.0.0.1:8786"),
    (["tls://127.0.0.1:1"], "scheduler='tls://127.0.0.1:1' needs TLS", "--tls-ca-file"),
]

# (environment, arguments after the scheduler, text naming the variable and value, text
# saying what is accepted): values from the environment, which are not misused flags
ENV = [
    (
        {"DASK_SCHEDULER_ADDRESS": "banana"},
        None,
        "environment variable DASK_SCHEDULER_ADDRESS: scheduler='banana'",
        "tcp://10.0.0.1:8786",
    ),
    (
        {"DASK_CUDASK__WORKER__RMM_POOLSIZE": "1GB"},
        [],
        (
            "environment variable DASK_CUDASK__WORKER__RMM_POOLSIZE: unknown config key "
            "cudask.worker.rmm-poolsize"
        ),
        "did you mean cudask.worker.rmm-pool-size?",
    ),
    (
        {"DASK_CUDASK__WROKER__RMM_POOL_SIZE": "1GB"},
        [],
        "environment variable DASK_CUDASK__WROKER__RMM_POOL_SIZE",
        "cudask.worker.rmm-pool-size",
    ),
    (
        {"DASK_CUDASK__MEMORY__PINNED_SLAB_SIZE": "auto"},
        [],
        (
            "environment variable DASK_CUDASK__MEMORY__PINNED_SLAB_SIZE: "
            "cudask.memory.pinned-slab-size is no longer a setting"
        ),
        "remove it",
    ),
    (
        {"DASK_CUDASK__WORKER__DEVICE_MEMORY_LIMIT": "banana"},
        [],
        (
            "environment variable DASK_CUDASK__WORKER__DEVICE_MEMORY_LIMIT: "
            "device_memory_limit='banana'"
        ),
        '"40GB"',
    ),
    (
        {"DASK_CUDASK__WORKER__JIT_UNSPILL": "maybe"},
        [],
        "environment variable DASK_CUDASK__WORKER__JIT_UNSPILL: jit_unspill='maybe'",
        "yes/no, on/off",
    ),
    (
        {"DASK_CUDASK__WORKER__INTERFACE": "nosuchif0"},
        [],
        "environment variable DASK_CUDASK__WORKER__INTERFACE: interface='nosuchif0'",
        "accepted: one of",
    ),
    (
        {"DASK_CUDASK__WORKER__LOCAL_DIRECTORY": "/proc/nope"},
        [],
        "environment variable DASK_CUDASK__WORKER__LOCAL_DIRECTORY: local_directory='/proc/nope'",
        "a writable directory",
    ),
    (
        {"DASK_CUDASK__WORKER__CUDF_SPILL_STATS": "5"},
        [],
        "environment variable DASK_CUDASK__WORKER__CUDF_SPILL_STATS: cudf_spill_stats=5",
        "from 0 to 2",
    ),
    (
        {"DASK_CUDASK__WORKER__RMM_ASYNC": "true"},
        ["--rmm-managed-memory"],
        "rmm_async from environment variable DASK_CUDASK__WORKER__RMM_ASYNC",
        "choose one",
    ),
    (
        {"DASK_CUDASK__MEMORY__SPILL_TARGET": "2"},
        [],
        "environment variable DASK_CUDASK__MEMORY__SPILL_TARGET: cudask.memory.spill-target=2",
        "e.g. 0.9",
    ),
    (
        {"DASK_CUDASK__COMM__DEVICE_IPC": "often"},
        [],
        "environment variable DASK_CUDASK__COMM__DEVICE_IPC: cudask.comm.device-ipc='often'",
        "true or false",
    ),
    # a section given a value, the variable named for what the libraries check finds
    (
        {"DASK_CUDASK__MEMORY": "fast"},
        [],
        "environment variable DASK_CUDASK__MEMORY: cudask.memory is a section of keys",
        "accepted: the keys of cudask.yaml",
    ),
    (
        {"DASK_CUDASK": "off"},
        [],
        "environment variable DASK_CUDASK: cudask is a section",
        "not a value",
    ),
    (
        {"DASK_CUDASK__WORKER__PRE_IMPORT": "no_such_module_xyz"},
        [],
        "environment variable DASK_CUDASK__WORKER__PRE_IMPORT: pre_import='no_such_module_xyz'",
        "a module importable",
    ),
    (
        {"DASK_CUDASK__WORKER__PRE_IMPORT": "numpy,,json"},
        [],
        (
            "environment variable DASK_CUDASK__WORKER__PRE_IMPORT: pre_import='numpy,,json' has an "
            "empty entry"
        ),
        "e.g. pre_import='numpy,json'",
    ),
    (
        {"DASK_CUDASK__WORKER__WORKERS_PER_GPU": "0"},
        [],
        "environment variable DASK_CUDASK__WORKER__WORKERS_PER_GPU: workers_per_gpu=0",
        "at least 1",
    ),
    # distributed's own settings, which cudask's workers read
    (
        {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "1.5"},
        [],
        (
            "environment variable DASK_DISTRIBUTED__WORKER__MEMORY__TARGET: "
            "distributed.worker.memory.target=1.5 is not accepted"
        ),
        "accepted: a number above 0 and at most 1 or false",
    ),
    (
        {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "soon"},
        [],
        (
            "environment variable DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT: "
            "distributed.comm.timeouts.connect='soon'"
        ),
        "a duration such as '30s'",
    ),
    (
        {"DASK_DISTRIBUTED__WORKER__MEMORY__SPIL": "0.7"},
        [],
        (
            "environment variable DASK_DISTRIBUTED__WORKER__MEMORY__SPIL: unknown config key "
            "distributed.worker.memory.spil"
        ),
        "did you mean distributed.worker.memory.spill?",
    ),
    (
        {"DASK_DISTRIBUTED__WORKER__DAEMON": "maybe"},
        [],
        "distributed.worker.daemon='maybe' is not accepted",
        "accepted: true or false",
    ),
    (
        {"DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD": "threads"},
        [],
        "distributed.worker.multiprocessing-method='threads'",
        "one of spawn, fork, forkserver",
    ),
    (
        {"DASK_DISTRIBUTED": "fast"},
        [],
        "environment variable DASK_DISTRIBUTED: distributed is a section of keys",
        "accepted: a mapping of its keys",
    ),
    (
        {"DASK_TEMPORARY_DIRECTORY": "/proc/nope"},
        [],
        "environment variable DASK_TEMPORARY_DIRECTORY: temporary-directory='/proc/nope'",
        "a writable directory",
    ),
]

CONFIG = [
    ({"cudask.worker.device-memory-limit": "banana"}, "device_memory_limit='banana'", '"40GB"'),
    ({"cudask.worker.rmm-async": "banana"}, "rmm_async='banana'", "true or false"),
    (
        {"cudask.worker.threads-per-worker": -1},
        "config key cudask.worker.threads-per-worker: ",
        "=-1 must be at least 1",
    ),
    ({"cudask.worker.protocol": "tcpx"}, "protocol='tcpx'", "accepted: inproc, tcp"),
    ({"cudask.worker.memory-limit": "lots"}, "memory_limit='lots'", '"40GB"'),
    ({"cudask.memory.spill-target": 2}, "cudask.memory.spill-target=2", "e.g. 0.9"),
    ({"cudask.comm.device-ipc": "often"}, "cudask.comm.device-ipc='often'", "true or false"),
    (
        {"cudask.comm.device-ipc-min-size": "banana"},
        "cudask.comm.device-ipc-min-size='banana'",
        "'1MiB'",
    ),
    ({"cudask.comm.device-ipc-lease": "soon"}, "cudask.comm.device-ipc-lease='soon'", "'20s'"),
    ({"cudask.comm.device-ipc-lease": 1}, "cudask.comm.device-ipc-lease=1", "8 to 600 seconds"),
    ({"cudask.comm.device-ipc-lease": [1]}, "cudask.comm.device-ipc-lease=[1]", "'20s'"),
    ({"cudask.comm.device-ipc-staging": "lots"}, "cudask.comm.device-ipc-staging='lots'", "'1GiB'"),
    ({"cudask.comm.map-ahead": "soon"}, "cudask.comm.map-ahead='soon'", "true or false"),
    (
        {"cudask.memory.spill-on-demand": "often"},
        "cudask.memory.spill-on-demand='often'",
        "true or false",
    ),
    (
        {"cudask.memory.spill-at-limit": "often"},
        ("cudask.memory.spill-at-limit is no longer a setting"),
        "(always on with spill-on-demand); remove it",
    ),
    ({"cudask.memory.pinned-pool-size": "lots"}, "cudask.memory.pinned-pool-size='lots'", '"40GB"'),
    (
        {"cudask.memory.pinned-slab-size": -1},
        ("cudask.memory.pinned-slab-size is no longer a setting"),
        "(fixed at 256 MiB: cudask.memory.host.pool.SLAB_SIZE); remove it",
    ),
    (
        {"cudask.memory.pinned-release-after": "soon"},
        "cudask.memory.pinned-release-after='soon'",
        "'60s'",
    ),
    (
        {"cudask.memory.pinned-method": "magic"},
        ("cudask.memory.pinned-method is no longer a setting"),
        "remove it",
    ),
    (
        {"cudask.memory.pinned-available-fraction": 0},
        "cudask.memory.pinned-available-fraction is no longer a setting",
        "remove it",
    ),
    (
        {"cudask.memory.populate-threads": 0},
        ("cudask.memory.populate-threads is no longer a setting"),
        "remove it",
    ),
    (
        {"cudask.memory.background-spill": "sometimes"},
        "cudask.memory.background-spill is no longer a setting",
        "remove it",
    ),
    (
        {"cudask.memory.pinned-headroom": "banana"},
        ("cudask.memory.pinned-headroom is no longer a setting"),
        "remove it",
    ),
    (
        {"cudask.memory.pinned-duty-cycle": 0.5},
        ("cudask.memory.pinned-duty-cycle is no longer a setting"),
        "remove it",
    ),
    (
        {"cudask.memory.pinned-headroom-from": 0.5},
        ("cudask.memory.pinned-headroom-from is no longer a setting"),
        "remove it",
    ),
    (
        {"cudask.memory.pinned-preallocate": "banana"},
        "cudask.memory.pinned-preallocate='banana'",
        '"40GB"',
    ),
    (
        {"cudask.memory.keep-host-copies": "maybe"},
        "cudask.memory.keep-host-copies='maybe'",
        "true or false",
    ),
    (
        {"cudask.worker.rmm-poolsize": "1GB"},
        "unknown config key cudask.worker.rmm-poolsize",
        "did you mean cudask.worker.rmm-pool-size?",
    ),
    (
        {"cudask.memory.spill-targte": 0.5},
        "unknown config key cudask.memory.spill-targte",
        "did you mean cudask.memory.spill-target?",
    ),
    ({"cudask.worker": "fast"}, "cudask.worker is a section of keys", "accepted: the keys"),
    (
        {"cudask.worker.cudf-spill-stats": 3},
        ("config key cudask.worker.cudf-spill-stats: cudf_spill_stats=3"),
        "from 0 to 2",
    ),
    ({"cudask.worker.jit-unspill": "maybe"}, "jit_unspill='maybe'", "yes/no"),
    (
        {"cudask.worker.pre-import": "numpy,,json"},
        "pre_import='numpy,,json' has an empty entry",
        "e.g. pre_import='numpy,json'",
    ),
    ({"cudask.worker.local-directory": ""}, "local_directory='' is empty", "leave it out"),
    (
        {"distributed.worker.memory.target": 1.5},
        "distributed.worker.memory.target=1.5 is not accepted",
        "a number above 0 and at most 1 or false",
    ),
    (
        {"distributed.comm.compression": "zipzap"},
        "distributed.comm.compression='zipzap'",
        "one of null, false, auto, zlib",
    ),
    (
        {"distributed.worker.connections.outgoing": "many"},
        "distributed.worker.connections.outgoing='many'",
        "a whole number",
    ),
    (
        {"distributed.comm.retry.count": -1},
        "distributed.comm.retry.count=-1",
        "a whole number of at least 0",
    ),
    (
        {"distributed.workre.memory.target": 0.6},
        "unknown config key distributed.workre",
        "did you mean distributed.worker.memory.target?",
    ),
    (
        {"temporary-directory": "/proc/nope"},
        "temporary-directory='/proc/nope'",
        "a writable directory",
    ),
]


def _check_message(message: str, value: str, accepted: str) -> None:
    assert "no NVIDIA GPU found" not in message
    assert value in message, message
    assert accepted in message, message
    assert "\n" not in message.strip(), message


@pytest.mark.parametrize("kwargs, value, accepted", CLUSTER)
def test_local_cuda_cluster(kwargs: dict[str, Any], value: str, accepted: str) -> None:
    with pytest.raises(OptionError) as info:
        LocalCUDACluster(**kwargs)
    _check_message(str(info.value), value, accepted)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], None]]:
    """Set environment variables and read them into dask.config, as at a process's
    start; both are restored afterwards."""

    def set_environment(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        dask.config.refresh()

    yield set_environment
    monkeypatch.undo()
    dask.config.refresh()


@pytest.mark.parametrize("kwargs, value, accepted", WORKER)
def test_cuda_worker(
    kwargs: dict[str, Any], value: str, accepted: str, environment: Callable[[dict[str, str]], None]
) -> None:
    kwargs = dict(kwargs)
    environment({key[4:]: kwargs.pop(key) for key in [k for k in kwargs if k.startswith("env:")]})
    scheduler = kwargs.pop("scheduler", SCHEDULER)
    with pytest.raises(OptionError) as info:
        CUDAWorker(scheduler, **kwargs)
    _check_message(str(info.value), value, accepted)


@pytest.mark.parametrize("args, value, accepted", CLI)
def test_cli_flag(args: list[str], value: str, accepted: str) -> None:
    env = {}
    if args[0].startswith("env:"):
        env, args = {args[0][4:]: args[1]}, args[2:]
    result = CliRunner().invoke(cli, ["worker", SCHEDULER, *args], env=env)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # click's exit, not an escaped error
    if env:  # a value from the environment names its variable, without the usage block
        assert f"environment variable {next(iter(env))}" in result.output
    else:
        assert "Usage:" in result.output
    error = result.output.split("Error: ", 1)[1]
    # click may wrap "Invalid value for '--flag': " around the message
    _check_message(" ".join(error.split()), value, accepted)


@pytest.mark.parametrize("args, value, accepted", CLI_SCHEDULER)
def test_cli_scheduler_address(args: list[str], value: str, accepted: str) -> None:
    result = CliRunner().invoke(cli, ["worker", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    error = " ".join(result.output.split("Error: ", 1)[1].split())
    assert "Invalid value for 'SCHEDULER'" in error, error
    _check_message(error, value, accepted)


def _config_error(result: Any) -> str:
    """The one line of a CLI error about a config value or environment variable:
    exit 2, no traceback, no usage block (no flag was misused)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert "Usage:" not in result.output and "--help" not in result.output, result.output
    assert result.output.startswith("Error: "), result.output
    return result.output[len("Error: ") :]


@pytest.mark.parametrize("env, args, value, accepted", ENV)
def test_environment_variable(
    env: dict[str, str],
    args: list[str] | None,
    value: str,
    accepted: str,
    environment: Callable[[dict[str, str]], None],
) -> None:
    environment(env)
    command = ["worker"] if args is None else ["worker", SCHEDULER, *args]
    _check_message(_config_error(CliRunner().invoke(cli, command)), value, accepted)
    if args is None:
        with pytest.raises(OptionError) as info:
            CUDAWorker()
        _check_message(str(info.value), value, accepted)
    elif not args:
        with pytest.raises(OptionError) as info:
            LocalCUDACluster()
        _check_message(str(info.value), value, accepted)


@pytest.mark.parametrize("settings, value, accepted", CONFIG)
def test_config_key(settings: dict[str, Any], value: str, accepted: str) -> None:
    with dask.config.set(settings), pytest.raises(OptionError) as info:
        LocalCUDACluster()
    _check_message(str(info.value), value, accepted)
    with dask.config.set(settings):
        result = CliRunner().invoke(cli, ["worker", SCHEDULER])
    _check_message(_config_error(result), value, accepted)


def test_ucx_transport_alone_names_it() -> None:
    """--enable-nvlink without UCX installed names the flag the user gave, not a
    protocol='ucx' they never asked for."""
    if importlib.util.find_spec("distributed_ucxx") is not None:
        pytest.skip("distributed-ucxx is installed here")
    with pytest.raises(MissingDependencyError) as info:
        LocalCUDACluster(enable_nvlink=True)
    message = str(info.value)
    assert (
        message.startswith("enable_nvlink=True (a UCX transport") and "distributed_ucxx" in message
    )
    assert "no NVIDIA GPU found" not in message
    result = CliRunner().invoke(cli, ["worker", SCHEDULER, "--enable-nvlink"])
    assert "enable_nvlink=True (a UCX transport" in result.output, result.output


def test_cli_flag_names_the_flag() -> None:
    result = CliRunner().invoke(cli, ["worker", SCHEDULER, "--device-memory-limit", "banana"])
    assert "Invalid value for '--device-memory-limit'" in result.output


def test_table_is_large_enough() -> None:
    rows = len(CLUSTER) + len(WORKER) + len(CLI) + len(CLI_SCHEDULER) + len(ENV) + len(CONFIG)
    assert rows >= 240, rows


def test_subprocess_without_gpu_lookup() -> None:
    """The real command, in a fresh process (no fixture): a bad size is a usage error,
    exit 2, one message and no traceback, whether or not this machine has a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudask.cli",
            "worker",
            SCHEDULER,
            "--device-memory-limit",
            "banana",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "Usage:" in out.stderr
    assert "no NVIDIA GPU found" not in out.stderr
    _check_message(
        " ".join(out.stderr.split("Error: ", 1)[1].split()),
        "device_memory_limit='banana'",
        '"40GB"',
    )


def _fresh_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("DASK_")
    }
    return subprocess.run(
        [sys.executable, "-m", "cudask.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=120,
        check=False,
    )


def test_subprocess_config_key_typo_in_the_environment() -> None:
    """A typo in a key is an error before discovery, naming the variable and the key
    meant: it once started workers with no RMM pool and no word."""
    out = _fresh_cli(["worker", SCHEDULER], {"DASK_CUDASK__WORKER__RMM_POOLSIZE": "1GB"})
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "Usage:" not in out.stderr, out.stderr
    assert "no NVIDIA GPU found" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        (
            "Error: environment variable DASK_CUDASK__WORKER__RMM_POOLSIZE: unknown config key "
            "cudask.worker.rmm-poolsize; did you mean cudask.worker.rmm-pool-size? (accepted: "
            f"the keys of cudask.yaml ({cudask_config.DEFAULTS_FILE}))"
        )
    ], out.stderr


def test_subprocess_config_file_names_the_file(tmp_path: Path) -> None:
    """A bad value or key in a dask config file names the file and the key."""
    path = tmp_path / "gpu.yaml"
    path.write_text("cudask:\n  worker:\n    device-memory-limit: banana\n")
    out = _fresh_cli(["worker", SCHEDULER], {"DASK_CONFIG": str(tmp_path)})
    assert out.returncode == 2 and "Usage:" not in out.stderr, out.stderr
    assert "no NVIDIA GPU found" not in out.stderr
    _check_message(
        " ".join(out.stderr.split()),
        f"config file {path} (key cudask.worker.device-memory-limit): device_memory_limit='banana'",
        '"40GB"',
    )
    path.write_text("cudask:\n  memory:\n    spill_targt: 0.5\n")
    out = _fresh_cli(["worker", SCHEDULER], {"DASK_CONFIG": str(tmp_path)})
    assert out.returncode == 2 and "Usage:" not in out.stderr, out.stderr
    _check_message(
        " ".join(out.stderr.split()),
        f"config file {path} (key cudask.memory.spill_targt): unknown config key",
        "did you mean cudask.memory.spill-target?",
    )


BAD_YAML = {
    "not YAML": ("cudask:\n  worker: [\n  - x: :\n", "not YAML (line 3, column 3: "),
    "a list at the top": ("- a\n- b\n", "must have a dict as the top level object"),
    "not UTF-8": (b"cudask:\n  worker:\n    name: \xff\n", "not UTF-8 text"),
}


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["worker", SCHEDULER],
        ["options"],
        ["bench", "--help"],
        ["kubernetes", "manifest", "--image", "x"],
    ],
)
@pytest.mark.parametrize("problem", sorted(BAD_YAML))
def test_subprocess_unreadable_config_file(tmp_path: Path, args: list[str], problem: str) -> None:
    """A dask config file that cannot be read is one line naming it and where it breaks,
    exit 2, for every command and --help (dask raises on it when imported)."""
    text, reason = BAD_YAML[problem]
    path = tmp_path / "broken.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = _fresh_cli(args, {"DASK_CONFIG": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert out.stderr.startswith(f"Error: the dask config file {path} cannot be read: "), out.stderr
    _check_message(out.stderr, reason, "Fix the file, or move it out of the folders dask reads")


def test_subprocess_setting_distributed_reads_when_imported() -> None:
    """A bad value of a key distributed reads when it is imported (which would end in a
    KeyError there) is said first, naming the variable."""
    out = _fresh_cli(["worker", SCHEDULER], {"DASK_DISTRIBUTED__ADMIN__TICK__LIMIT": "x"})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    _check_message(
        out.stderr,
        "environment variable DASK_DISTRIBUTED__ADMIN__TICK__LIMIT: "
        "distributed.admin.tick.limit='x'",
        "a duration such as '30s'",
    )


@pytest.mark.parametrize(
    "content, value, accepted",
    [
        (None, "is a directory", "the JSON file a scheduler wrote"),
        ("{address: tcp://x:1", "is not JSON", '{"address": "tcp://10.0.0.1:8786", ...}'),
        ('{"id": "Scheduler-1"}', 'has no "address"', "the JSON file a scheduler wrote"),
        (
            '{"address": "banana"}',
            "holds the address 'banana', which is not one",
            "tcp://10.0.0.1:8786",
        ),
    ],
)
def test_scheduler_file_that_is_no_scheduler_file(
    tmp_path: Path, content: str | None, value: str, accepted: str
) -> None:
    """A scheduler file that exists is read before anything starts (one that does not
    exist yet is waited for, as distributed's workers wait)."""
    path = tmp_path / "scheduler.json"
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(OptionError) as info:
        CUDAWorker(scheduler_file=str(path))
    _check_message(str(info.value), f"scheduler_file={str(path)!r} {value}", accepted)
    result = CliRunner().invoke(cli, ["worker", "--scheduler-file", str(path)])
    assert result.exit_code == 2 and "Invalid value for '--scheduler-file'" in result.output
    _check_message(" ".join(result.output.split("Error: ", 1)[1].split()), value, accepted)


def test_tls_files_that_are_not_pem(tmp_path: Path, tls_files: tuple[str, str]) -> None:
    """TLS files that exist but hold no PEM of their kind, or a key that is not the
    certificate's, are refused before any GPU is looked for."""
    cert, key = tls_files
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cases = [
        ((str(junk), cert, key), "tls_ca_file=", "holds no PEM certificate"),
        ((cert, cert, str(junk)), "tls_key=", "holds no PEM private key"),
        ((cert, key, key), "tls_cert=", "holds no PEM certificate"),
    ]
    other = tmp_path / "other-key.pem"
    openssl = subprocess.run(
        ["openssl", "genrsa", "-out", str(other), "2048"], capture_output=True, check=False
    )
    if openssl.returncode == 0:
        cases.append(
            (
                (cert, cert, str(other)),
                "are not a certificate and its key",
                "the key it was made with",
            )
        )
    for (ca, c, k), value, accepted in cases:
        with pytest.raises(OptionError) as info:
            CUDAWorker(SCHEDULER, tls_ca_file=ca, tls_cert=c, tls_key=k)
        _check_message(str(info.value), value, accepted)
        result = CliRunner().invoke(
            cli, ["worker", SCHEDULER, "--tls-ca-file", ca, "--tls-cert", c, "--tls-key", k]
        )
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        _check_message(" ".join(result.output.split("Error: ", 1)[1].split()), value, accepted)


ACCEPTED_CLUSTER = [
    {"memory_limit": "10 GB"},
    {"device_memory_limit": "10GiB"},
    {"protocol": "tcp://"},
    {"rmm_pool_size": 0},
    {"rmm_pool_size": "0"},
    {"device_memory_limit": 0.0},
    {"memory_limit": 4e9},
    {"protocol": "tls", "security": True},
]
ACCEPTED_CLI = [
    ["--worker-port", "0"],
    ["--rmm-pool-size", "0"],
    ["--memory-limit", "10 GB"],
    ["--device-memory-limit", "10GiB"],
    ["--protocol", "tcp://"],
    ["--listen-address", "tcp://127.0.0.1"],
    ["--death-timeout", "0"],
]
ACCEPTED_ENV = [
    {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "60"},
    {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False"},
    {"DASK_DISTRIBUTED__COMM__UCX__INFINIBAND": "True"},
    {"DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "debug"},
    {"DASK_DISTRIBUTED__NANNY__ENVIRON__OMP_NUM_THREADS": "1"},
    {"DASK_DISTRIBUTED__WORKER__MEMORY__MAX_SPILL": "10GB"},
    {"DASK_CUDASK__WORKER__RMM_POOL_SIZE": "0"},
]


def _looked_for_gpus(call: Callable[[], object]) -> None:
    with pytest.raises(AssertionError, match="GPUs were looked for"):
        call()


@pytest.mark.parametrize("kwargs", ACCEPTED_CLUSTER)
def test_accepted_keywords_stay_accepted(kwargs: dict[str, Any]) -> None:
    """Values that work stay accepted: these pass every check and reach discovery."""
    _looked_for_gpus(lambda: LocalCUDACluster(**kwargs))


@pytest.mark.parametrize("args", ACCEPTED_CLI)
def test_accepted_flags_stay_accepted(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["worker", SCHEDULER, *args])
    assert isinstance(result.exception, AssertionError), result.output
    assert "GPUs were looked for" in str(result.exception)


@pytest.mark.parametrize("env", ACCEPTED_ENV)
def test_accepted_settings_stay_accepted(
    env: dict[str, str], environment: Callable[[dict[str, str]], None]
) -> None:
    environment(env)
    _looked_for_gpus(lambda: CUDAWorker(SCHEDULER))
    _looked_for_gpus(lambda: CUDAWorker(SCHEDULER, worker_port=0))


@pytest.mark.parametrize(
    "args, value, accepted",
    [
        (["demo", "--size", "0"], "--size 0.0 is not accepted", "a number above 0"),
        (["demo", "--chunk", "0"], "--chunk 0 is no size", "'256MiB'"),
        (["demo", "--device-memory-limit", "banana"], "--device-memory-limit='banana'", '"40GB"'),
        (["bench", "spill", "--chunk-size", "0"], "--chunk-size='0' is no size", "'256MiB'"),
        (["bench", "spill", "--total", "none"], "--total='none' is no size", "'16GiB'"),
        (
            ["bench", "spill", "--device-memory-limit", "banana"],
            "--device-memory-limit='banana'",
            '"40GB"',
        ),
        (["bench", "cupy", "--operation", "nope"], "--operation='nope'", "transpose_sum, dot"),
        (
            ["kubernetes", "manifest", "--image", "x", "--num-workers", "-1"],
            "--num-workers -1 is not accepted",
            "at least 0",
        ),
        (
            ["kubernetes", "manifest", "--image", "x", "--idle-timeout", "-5"],
            "--idle-timeout -5 is not accepted",
            "at least 0",
        ),
    ],
)
def test_other_commands_bad_values_exit_2(args: list[str], value: str, accepted: str) -> None:
    """`cudask demo`, `cudask bench` and `cudask kubernetes` say a bad value as `cudask
    worker` does: one line, exit status 2, before CuPy or a GPU is looked for."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    _check_message(" ".join(result.output.split("Error: ", 1)[1].split()), value, accepted)
