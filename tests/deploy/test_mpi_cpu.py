"""CUDAWorker as dask-mpi's worker class, without a GPU (issue 15, item 2).

Covers: the launchers' local-rank variables; which visible GPU the worker of a
local rank takes, and the error when a node runs more ranks than that allows;
CUDAWorker built with dask-mpi's keywords and `worker_options` on a fake machine,
inside a fake MPI (a stand-in for mpi4py.MPI: the boundary cudask reads); bad
worker_options giving the CLI's messages, before any GPU is looked for; and, where
mpirun and mpi4py are installed, the same through a real MPI job (a probe script
and the `dask-mpi` command). The GPU runs are in test_mpi_gpu.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask.config
import pytest
from click.testing import CliRunner

from cudask.cli.main import cli
from cudask.deploy import mpi, node
from cudask.devices import Device, discover, parse_visible_devices
from cudask.errors import DeviceError, OptionError
from cudask.testing import FakeBackend

PROBE = Path(__file__).with_name("mpi_probe.py")


def _devices(n: int) -> list[Device]:
    return parse_visible_devices(None, discover(FakeBackend.dgx(n, cores=8)))


# ---- the launchers' variables


@pytest.mark.parametrize(
    "environ, expected",
    [
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            mpi.LocalRank(2, 4, "OMPI_COMM_WORLD_LOCAL_RANK"),
        ),
        (
            {"MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
            mpi.LocalRank(1, 2, "MV2_COMM_WORLD_LOCAL_RANK"),
        ),
        ({"MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "8"}, mpi.LocalRank(3, 8, "MPI_LOCALRANKID")),
        ({"PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "1"}, mpi.LocalRank(0, 1, "PMI_LOCAL_RANK")),
        ({"PMI_LOCAL_RANK": "5"}, mpi.LocalRank(5, None, "PMI_LOCAL_RANK")),
        (
            {"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"},
            mpi.LocalRank(1, 4, "SLURM_LOCALID"),
        ),
        (
            {"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2),3"},  # uneven: unknown here
            mpi.LocalRank(1, None, "SLURM_LOCALID"),
        ),
        # an MPI started by srun sees both: the MPI's own variables win
        (
            {
                "SLURM_LOCALID": "0",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            mpi.LocalRank(3, 4, "OMPI_COMM_WORLD_LOCAL_RANK"),
        ),
        ({"PATH": "/usr/bin"}, None),
    ],
)
def test_local_rank_from_each_launcher(
    environ: dict[str, str], expected: mpi.LocalRank | None
) -> None:
    assert mpi.local_rank(environ) == expected


@pytest.mark.parametrize(
    "environ, text",
    [
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "x"},
            "OMPI_COMM_WORLD_LOCAL_RANK='x' is not a whole number",
        ),
        ({"MPI_LOCALRANKID": "-1"}, "MPI_LOCALRANKID='-1' is not a whole number"),
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            "OMPI_COMM_WORLD_LOCAL_RANK=4 is not below OMPI_COMM_WORLD_LOCAL_SIZE=4",
        ),
    ],
)
def test_garbled_launcher_variables(environ: dict[str, str], text: str) -> None:
    with pytest.raises(OptionError, match=text):
        mpi.local_rank(environ)


# ---- which GPU a rank takes


@pytest.mark.parametrize(
    "gpus, rank, size, expected",
    [
        (4, 0, 4, 0),
        (4, 3, 4, 3),
        (4, 2, None, 2),
        # dask-mpi's scheduler and client are local ranks 0 and 1 of the first node: ranks
        # past the last GPU take theirs
        (4, 4, 6, 0),
        (4, 5, 6, 1),
        (2, 2, 3, 0),
        (2, 3, 4, 1),
        (1, 1, 2, 0),
        (1, 2, 3, 0),
    ],
)
def test_local_rank_takes_its_gpu(gpus: int, rank: int, size: int | None, expected: int) -> None:
    devices = _devices(gpus)
    where = mpi.MPIRank(8, mpi.LocalRank(rank, size, "OMPI_COMM_WORLD_LOCAL_RANK"))
    if gpus > 1:
        assert mpi.rank_device(devices, mpi.LocalRank(rank, size, "x")) == expected
    assert mpi.devices_for_rank(devices, where, narrowed=False) == [expected]


@pytest.mark.parametrize(
    "gpus, rank, size, numbers",
    [
        (4, 6, None, ("local rank 6", "4 GPUs")),
        (4, 0, 7, ("7 MPI ranks", "4 GPUs", "at most 6")),
        (2, 4, 5, ("5 MPI ranks", "2 GPUs", "at most 4")),
        (1, 3, None, ("local rank 3", "1 GPUs")),
    ],
)
def test_more_ranks_than_gpus_is_an_error(
    gpus: int, rank: int, size: int | None, numbers: tuple[str, ...]
) -> None:
    where = mpi.MPIRank(16, mpi.LocalRank(rank, size, "OMPI_COMM_WORLD_LOCAL_RANK"))
    with pytest.raises(DeviceError) as info:
        mpi.devices_for_rank(_devices(gpus), where, narrowed=False)
    message = str(info.value)
    assert all(n in message for n in numbers), message
    assert "\n" not in message and "ppr:" in message


def test_every_gpu_outside_mpi_or_for_a_lone_rank() -> None:
    devices = _devices(4)
    assert mpi.devices_for_rank(devices, None, narrowed=False) == [0, 1, 2, 3]
    alone = mpi.MPIRank(4, mpi.LocalRank(0, 1, "OMPI_COMM_WORLD_LOCAL_RANK"))
    assert mpi.devices_for_rank(devices, alone, narrowed=False) == [0, 1, 2, 3]
    # the launcher named one GPU for this rank: that one, whatever the rank
    one = devices[2:3]
    seventh = mpi.MPIRank(8, mpi.LocalRank(7, 8, "OMPI_COMM_WORLD_LOCAL_RANK"))
    assert mpi.devices_for_rank(one, seventh, narrowed=True) == [0]


def test_no_local_rank_with_several_gpus_is_an_error() -> None:
    with pytest.raises(DeviceError, match="CUDA_VISIBLE_DEVICES to one GPU per rank"):
        mpi.devices_for_rank(_devices(2), mpi.MPIRank(3, None), narrowed=False)


# ---- CUDAWorker in a (fake) MPI job


class FakeMPI(types.ModuleType):
    """Stands where mpi4py.MPI would: an initialized MPI of `size` ranks."""

    def __init__(self, size: int, rank: int = 1) -> None:
        super().__init__("mpi4py.MPI")
        self.size, self.rank, self.aborted = size, rank, []
        self.COMM_WORLD = types.SimpleNamespace(
            Get_size=lambda: self.size, Get_rank=lambda: self.rank, Abort=self.aborted.append
        )

    def Is_initialized(self) -> bool:
        return True

    def Is_finalized(self) -> bool:
        return False


@pytest.fixture
def fake_mpi(monkeypatch: pytest.MonkeyPatch) -> FakeMPI:
    fake = FakeMPI(4)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", fake)
    return fake


@pytest.fixture(autouse=True)
def cuda_environment_restored() -> Iterator[None]:
    """A rank without a nanny writes its CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER)
    into os.environ."""
    names = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = discover(FakeBackend.dgx(4, cores=8))
    monkeypatch.setattr(node, "discover", lambda: machine)
    # distributed's own monitor (in every Nanny and Worker) would ask NVML for the GPU of
    # the fake CUDA_VISIBLE_DEVICES; on a host with real GPUs, one it does not have
    monkeypatch.setattr("distributed.diagnostics.nvml.device_get_count", lambda: 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for var, size_var in mpi.LAUNCHER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(size_var, raising=False)


def _as_dask_mpi_builds_it(rank: int, **worker_options: Any) -> node.CUDAWorker:
    """dask_mpi.initialize(worker_class="cudask.CUDAWorker", worker_options=...)."""
    opts = {
        "interface": None,
        "protocol": None,
        "nthreads": 1,
        "memory_limit": "auto",
        "local_directory": None,
        "name": rank,
        "device_memory_limit": None,
        **worker_options,
    }

    async def main() -> node.CUDAWorker:  # Nannies are made inside an event loop
        return node.CUDAWorker(**opts)

    with dask.config.set({"scheduler-address": "tcp://10.0.0.1:8786"}):
        return asyncio.run(main())


@pytest.mark.parametrize(
    "rank, gpu, visible",
    [(0, 0, "0,1,2,3"), (2, 2, "2,3,0,1"), (3, 3, "3,0,1,2"), (5, 1, "1,2,3,0")],
)
def test_each_rank_starts_one_worker_on_its_gpu(
    rank: int,
    gpu: int,
    visible: str,
    fake_mpi: FakeMPI,
    four_gpus: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", str(rank))
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "6")
    w = _as_dask_mpi_builds_it(rank, nthreads=2, log_spilling=True, nanny=True)
    assert [d.gpu.index for d in w.devices] == [gpu]
    assert len(w.visible) == 4
    (nanny,) = w.nannies
    assert nanny.name == rank and nanny.env["CUDA_VISIBLE_DEVICES"] == visible
    assert w.options.nthreads == 2 and w.options.log_spilling is True


def test_ranks_pick_from_the_visible_list(
    fake_mpi: FakeMPI, four_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # srun --gpus-per-node: CUDA_VISIBLE_DEVICES lists the node's GPUs for every rank
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2")
    (nanny,) = _as_dask_mpi_builds_it(1, nanny=True).nannies
    assert nanny.env["CUDA_VISIBLE_DEVICES"] == "1,3"


def test_one_gpu_per_rank_from_the_launcher(
    fake_mpi: FakeMPI, four_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mpirun ... bash -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK dask-mpi ...'
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    w = _as_dask_mpi_builds_it(3)
    assert [d.gpu.index for d in w.devices] == [3]


def test_a_rank_is_its_worker_unless_a_nanny_is_asked_for(
    fake_mpi: FakeMPI, four_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a nanny's spawned process would run the rank's (initialize) script again
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # srun --gpus-per-node=4
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    w = _as_dask_mpi_builds_it(2)
    assert type(w.nannies[0]).__name__ == "GPUWorker" and w.options.nanny is False
    # this process is the worker: its GPU first, before any CUDA call
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3,0,1"
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    assert type(_as_dask_mpi_builds_it(2, nanny=True).nannies[0]).__name__ == "Nanny"


def test_without_mpi_every_gpu_as_before(four_gpus: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # `dask cuda worker` under mpirun without mpi4py: the launcher's variables are set,
    # but this process is no MPI rank, so nothing changes
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    w = _as_dask_mpi_builds_it(1)
    assert len(w.nannies) == 4 and [n.name for n in w.nannies] == ["1-0", "1-1", "1-2", "1-3"]


def test_a_job_of_one_rank_is_not_placed(
    fake_mpi: FakeMPI, four_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_mpi.size = 1  # `python script.py` that imported mpi4py: MPI's singleton
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    assert len(_as_dask_mpi_builds_it(0).nannies) == 4


def test_too_many_ranks_end_the_job(
    fake_mpi: FakeMPI,
    four_gpus: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "6")
    with pytest.raises(DeviceError, match="local rank 6 has no GPU"):
        _as_dask_mpi_builds_it(6)
    assert fake_mpi.aborted == [1]  # MPI_Abort: dask-mpi's scheduler rank would wait forever
    err = capsys.readouterr().err
    assert err.startswith("Error: MPI local rank 6 has no GPU") and err.count("\n") == 1


# ---- bad worker_options: the CLI's messages, before any GPU is looked for

# (dask-mpi worker_options, the same mistake as `cudask worker` flags)
BAD = [
    ({"device_memory_limit": "banana"}, ["--device-memory-limit", "banana"]),
    ({"device_memory_limit": "1.5"}, ["--device-memory-limit", "1.5"]),
    ({"memory_limit": "-1"}, ["--memory-limit", "-1"]),
    ({"rmm_pool_size": "lots"}, ["--rmm-pool-size", "lots"]),
    ({"protocol": "carrier-pigeon"}, ["--protocol", "carrier-pigeon"]),
    ({"nthreads": 0}, ["--nthreads", "0"]),
    ({"worker_port": "9000-9003"}, ["--worker-port", "9000-9003"]),
    ({"resources": "GPU"}, ["--resources", "GPU"]),
    ({"death_timeout": "soon"}, ["--death-timeout", "soon"]),
    ({"rmm_async": True, "rmm_managed_memory": True}, ["--rmm-async", "--rmm-managed-memory"]),
    (
        {"jit_unspill": True, "enable_cudf_spill": True},
        ["--enable-jit-unspill", "--enable-cudf-spill"],
    ),
    ({"rmm_allocator_external_lib_list": "jax"}, ["--set-rmm-allocator-for-libs", "jax"]),
    ({"cudf_spill_stats": -1}, ["--cudf-spill-stats", "-1"]),
    ({"worker_class": "no.such.Class"}, ["--worker-class", "no.such.Class"]),
    ({"contact_address": "tcp://node1:9000"}, ["--contact-address", "tcp://node1:9000"]),
    ({"enable_rdmacm": True}, ["--enable-rdmacm"]),
]


def _cli_message(args: list[str]) -> str:
    result = CliRunner().invoke(cli, ["worker", "tcp://127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    error = " ".join(result.output.split("Error: ", 1)[1].split())
    if error.startswith("Invalid value for '"):  # click's prefix naming the flag
        error = error.split("': ", 1)[1]
    return error


@pytest.fixture
def no_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    def discover(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GPUs were looked for before the bad input was caught")

    monkeypatch.setattr(node, "discover", discover)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("worker_options, flags", BAD)
def test_bad_worker_options_say_what_the_cli_says(
    worker_options: dict[str, Any], flags: list[str], no_discovery: None
) -> None:
    with pytest.raises(OptionError) as info:
        _as_dask_mpi_builds_it(2, **worker_options)
    message = str(info.value)
    assert "\n" not in message
    assert " ".join(message.split()) == _cli_message(flags)


# mistakes the CLI cannot make (click refuses them first): the message names the value
# and what is accepted
ONLY_AS_KEYWORDS = [
    (
        {"multiprocessing_method": "thread"},
        "multiprocessing_method='thread'",
        "accepted: spawn, fork, forkserver",
    ),
    ({"jit_unspill": "maybe"}, "jit_unspill='maybe'", "accepted: true or false"),
    ({"nthreads": "four"}, "nthreads='four'", "whole number"),
    ({"local_directory": 5}, "local_directory=5", "e.g. local_directory="),
    ({"resources": 5}, "resources=5", "'GPU=1 MEM=10e9'"),
    ({"bogus": 1}, "bogus", "accepted: "),
]


@pytest.mark.parametrize("worker_options, value, accepted", ONLY_AS_KEYWORDS)
def test_bad_worker_options_without_a_flag_twin(
    worker_options: dict[str, Any], value: str, accepted: str, no_discovery: None
) -> None:
    with pytest.raises(OptionError) as info:
        _as_dask_mpi_builds_it(2, **worker_options)
    message = str(info.value)
    assert value in message and accepted in message and "\n" not in message, message


def test_flag_spelling_in_worker_options_gets_a_hint(no_discovery: None) -> None:
    with pytest.raises(OptionError) as info:
        _as_dask_mpi_builds_it(2, **{"device-memory-limit": "1GB"})
    assert "did you mean 'device-memory-limit' -> 'device_memory_limit'" in str(info.value)


def test_garbled_local_rank_is_caught_before_discovery(
    fake_mpi: FakeMPI, no_discovery: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MPI_LOCALRANKID", "two")
    with pytest.raises(OptionError, match="MPI_LOCALRANKID='two' is not a whole number"):
        _as_dask_mpi_builds_it(2)
    assert fake_mpi.aborted == [1]


# ---- a real MPI job (skips without mpirun and mpi4py)


def test_real_launcher_variables_place_the_ranks(mpirun: Any, tmp_path: Path) -> None:
    """4 ranks on a fake 2-GPU machine: local ranks 0..3 take GPUs 0, 1, 0, 1."""
    proc = subprocess.run(
        [*mpirun.argv(4), sys.executable, str(PROBE), "2", str(tmp_path)],
        env=mpirun.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    assert [r["gpus"] for r in ranks] == [[0], [1], [0], [1]]
    assert [r["env"] for r in ranks] == [["0,1"], ["1,0"], ["0,1"], ["1,0"]]
    assert [r["names"] for r in ranks] == [[0], [1], [2], [3]]


def test_real_job_with_too_many_ranks_ends_with_the_error(mpirun: Any, tmp_path: Path) -> None:
    proc = subprocess.run(
        [*mpirun.argv(5), sys.executable, str(PROBE), "2", str(tmp_path)],
        env=mpirun.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0
    assert "Error: 5 MPI ranks run on this node but it has 2 GPUs visible" in proc.stderr, (
        proc.stderr[-3000:]
    )


@pytest.mark.parametrize("worker_options, flags", [BAD[0], BAD[9]])
def test_dask_mpi_command_reports_bad_worker_options(
    mpirun: Any, tmp_path: Path, worker_options: dict[str, Any], flags: list[str]
) -> None:
    """`dask-mpi --worker-class cudask.CUDAWorker --worker-options JSON`: the worker
    rank prints the CLI's message on one line and ends the job (no GPU needed: the
    options are checked before any GPU is looked for)."""
    pytest.importorskip("dask_mpi", reason="dask-mpi is not installed")
    proc = subprocess.run(
        [
            *mpirun.argv(2),
            sys.executable,
            "-m",
            "dask_mpi.cli",
            "--worker-class",
            "cudask.CUDAWorker",
            "--scheduler-file",
            str(tmp_path / "sched.json"),
            "--no-dashboard",
            "--scheduler-port",
            "0",
            "--worker-options",
            json.dumps(worker_options),
        ],
        env=mpirun.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode != 0
    # one line (mpirun may glue another rank's output before it)
    line = f"Error: {_cli_message(flags)} (MPI rank 1: ending the MPI job)\n"
    assert line in proc.stderr, proc.stderr[-3000:]
