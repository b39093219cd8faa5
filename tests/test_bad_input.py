"""Bad input is caught before any GPU is looked for (issue 16, item 3).

Each row is one bad value given to LocalCUDACluster, CUDAWorker, `cudask worker`
or a `cudask.*` config key. `discover()` is replaced by a function that fails the
test, so every row proves its check runs before discovery (the machine these run
on may have no GPU at all: the message must then not be "no NVIDIA GPU found").
Each message must name the bad value and what is accepted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import dask.config
import pytest
from click.testing import CliRunner

from cudask import LocalCUDACluster
from cudask.cli.main import cli
from cudask.deploy import local, node
from cudask.deploy.node import CUDAWorker
from cudask.errors import OptionError

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
    ({"jit_unspill": "maybe"}, "jit_unspill='maybe'", "accepted: True or False"),
    ({"rmm_async": "sometimes"}, "rmm_async='sometimes'", "accepted: True or False"),
    ({"threads_per_worker": 0}, "nthreads=0", "at least 1"),
    ({"threads_per_worker": "four"}, "nthreads='four'", "whole number"),
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
    ({"contact_address": "tcp://node1:9000"}, "contact_address='tcp://node1:9000'",
     "--listen-address"),
    ({"protocol": "carrier-pigeon"}, "protocol='carrier-pigeon'", "accepted: inproc, tcp"),
    ({"env:CUDA_VISIBLE_DEVICES": "0,,x"}, "CUDA_VISIBLE_DEVICES='0,,x'", "e.g. '0,1'"),
    ({"env:CUDA_VISIBLE_DEVICES": "GPU-a,GPU-a"}, "'GPU-a'", "each once"),
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
    (["--expected-gpus", "two"], "'--expected-gpus': 'two'", "not a valid integer"),
    (["--rmm-async", "--rmm-managed-memory"], "rmm_async=True", "choose one"),
    (["--enable-jit-unspill", "--enable-cudf-spill"], "jit_unspill=True", "choose one"),
    (["--set-rmm-allocator-for-libs", "jax"], "'jax'", "accepted: cupy, torch"),
    (["--cudf-spill-stats", "-1"], "cudf_spill_stats=-1", "at least 0"),
    (["--worker-class", "no.such.Class"], "worker_class='no.such.Class'",
     "'distributed.Worker'"),
    (["--multiprocessing-method", "thread"], "'thread'", "'spawn'"),
    (["env:CUDA_VISIBLE_DEVICES", "0,,x"], "CUDA_VISIBLE_DEVICES='0,,x'", "e.g. '0,1'"),
]

CONFIG = [
    ({"cudask.worker.device-memory-limit": "banana"}, "device_memory_limit='banana'", '"40GB"'),
    ({"cudask.worker.rmm-async": "banana"}, "rmm_async='banana'", "True or False"),
    ({"cudask.worker.threads-per-worker": -1}, "nthreads=-1", "at least 1"),
    ({"cudask.worker.protocol": "tcpx"}, "protocol='tcpx'", "accepted: inproc, tcp"),
    ({"cudask.worker.memory-limit": "lots"}, "memory_limit='lots'", '"40GB"'),
    ({"cudask.memory.spill-target": 2}, "cudask.memory.spill-target=2", "e.g. 0.9"),
    ({"cudask.comm.device-ipc": "often"}, "cudask.comm.device-ipc='often'", "true or false"),
    ({"cudask.comm.device-ipc-min-size": "banana"}, "cudask.comm.device-ipc-min-size='banana'",
     "'1MiB'"),
    ({"cudask.memory.spill-on-demand": "often"}, "cudask.memory.spill-on-demand='often'",
     "true or false"),
    ({"cudask.memory.pinned-pool-size": "lots"}, "cudask.memory.pinned-pool-size='lots'",
     '"40GB"'),
    ({"cudask.memory.pinned-slab-size": -1}, "cudask.memory.pinned-slab-size=-1", "accepted"),
    ({"cudask.memory.pinned-release-after": "soon"},
     "cudask.memory.pinned-release-after='soon'", "'60s'"),
    ({"cudask.memory.pinned-method": "magic"}, "cudask.memory.pinned-method='magic'",
     "accepted: "),
    ({"cudask.memory.pinned-available-fraction": 0},
     "cudask.memory.pinned-available-fraction=0", "e.g. 0.5"),
    ({"cudask.memory.populate-threads": 0}, "cudask.memory.populate-threads=0", "e.g. 8"),
    ({"cudask.memory.background-spill": "sometimes"},
     "cudask.memory.background-spill='sometimes'", "true or false"),
    ({"cudask.memory.pinned-headroom": "banana"}, "cudask.memory.pinned-headroom='banana'",
     '"40GB"'),
    ({"cudask.memory.pinned-preallocate": "banana"},
     "cudask.memory.pinned-preallocate='banana'", '"40GB"'),
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


@pytest.mark.parametrize("kwargs, value, accepted", WORKER)
def test_cuda_worker(kwargs: dict[str, Any], value: str, accepted: str,
                     monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs = dict(kwargs)
    for key in [k for k in kwargs if k.startswith("env:")]:
        monkeypatch.setenv(key[4:], kwargs.pop(key))
    with pytest.raises(OptionError) as info:
        CUDAWorker(SCHEDULER, **kwargs)
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
    assert "Usage:" in result.output
    error = result.output.split("Error: ", 1)[1]
    # click may wrap "Invalid value for '--flag': " around the message
    _check_message(" ".join(error.split()), value, accepted)


@pytest.mark.parametrize("settings, value, accepted", CONFIG)
def test_config_key(settings: dict[str, Any], value: str, accepted: str) -> None:
    with dask.config.set(settings), pytest.raises(OptionError) as info:
        LocalCUDACluster()
    _check_message(str(info.value), value, accepted)
    with dask.config.set(settings):
        result = CliRunner().invoke(cli, ["worker", SCHEDULER])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert value in " ".join(result.output.split())


def test_cli_flag_names_the_flag() -> None:
    result = CliRunner().invoke(cli, ["worker", SCHEDULER, "--device-memory-limit", "banana"])
    assert "Invalid value for '--device-memory-limit'" in result.output


def test_table_is_large_enough() -> None:
    assert len(CLUSTER) + len(WORKER) + len(CLI) + len(CONFIG) >= 50


def test_subprocess_without_gpu_lookup() -> None:
    """The real command, in a fresh process (no fixture): a bad size is a usage error,
    exit 2, one message and no traceback, whether or not this machine has a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run(
        [sys.executable, "-m", "cudask.cli", "worker", SCHEDULER, "--device-memory-limit",
         "banana"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "Usage:" in out.stderr
    assert "no NVIDIA GPU found" not in out.stderr
    _check_message(" ".join(out.stderr.split("Error: ", 1)[1].split()),
                   "device_memory_limit='banana'", '"40GB"')
