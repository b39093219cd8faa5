"""CUDAWorker built the way dask-mpi and dask-jobqueue's runners build their
worker class, on a fake one-GPU machine (nothing is started)."""

from __future__ import annotations

import asyncio
from typing import Any

import dask.config
import pytest

from cudask.deploy import node
from cudask.devices import discover
from cudask.errors import OptionError
from cudask.testing import FakeBackend, fake_gpu


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = discover(FakeBackend([fake_gpu(0, cpus=range(4))]))
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _build(*args: Any, **kwargs: Any) -> node.CUDAWorker:
    # no device limit: this machine may lack CuPy, which spilling needs
    kwargs.setdefault("device_memory_limit", None)

    async def main() -> node.CUDAWorker:  # Nannies are made inside an event loop
        return node.CUDAWorker(*args, **kwargs)

    return asyncio.run(main())


def test_as_dask_mpi_builds_it(one_gpu: None) -> None:
    # dask_mpi.initialize: the address in the config, these keywords, the rank as name
    with dask.config.set(scheduler_address="tcp://10.0.0.1:8786"):
        w = _build(
            interface=None,
            protocol=None,
            nthreads=1,
            memory_limit="auto",
            local_directory="",
            name=3,
        )
    assert w.scheduler == "tcp://10.0.0.1:8786"
    assert [n.name for n in w.nannies] == [3]
    assert w.options.local_directory is None  # "" means not given


def test_as_dask_jobqueue_runners_build_it(one_gpu: None) -> None:
    # dask_jobqueue.runner.BaseRunner.start_worker: worker_class(name=..., scheduler_ip=...)
    w = _build(name=None, scheduler_ip="tcp://10.0.0.2:8786", nthreads=2)
    assert w.scheduler == "tcp://10.0.0.2:8786" and w.options.nthreads == 2
    assert (
        _build("tcp://10.0.0.2:8786", scheduler_ip="tcp://10.0.0.2:8786").scheduler
        == "tcp://10.0.0.2:8786"
    )
    with pytest.raises(OptionError, match="two schedulers"):
        _build("tcp://10.0.0.2:8786", scheduler_ip="tcp://10.0.0.3:8786")


def test_as_the_dask_mpi_command_builds_it(one_gpu: None) -> None:
    # dask-mpi's CLI: nthreads=None unless given, name f"{name}-{rank}", scheduler_ip
    w = _build(
        interface=None,
        protocol=None,
        nthreads=None,
        memory_limit="auto",
        local_directory=None,
        name="dask_mpi-2",
        scheduler_file=None,
        scheduler_ip="tcp://10.0.0.4:8786",
    )
    assert w.scheduler == "tcp://10.0.0.4:8786"
    assert w.options.nthreads == 1  # None is the default (threads-per-worker), not all CPUs
    assert [n.name for n in w.nannies] == ["dask_mpi-2"]
    assert [n.nthreads for n in w.nannies] == [1]


def test_no_nanny_refuses_a_nanny_class(one_gpu: None) -> None:
    with pytest.raises(OptionError, match="is a Nanny"):
        _build(
            "tcp://10.0.0.1:8786", nanny=False, worker_class="cudask.testing.workers.TaggedNanny"
        )


def test_a_nanny_class_is_started_per_gpu(one_gpu: None) -> None:
    from cudask.testing.workers import TaggedNanny

    w = _build("tcp://10.0.0.1:8786", worker_class="cudask.testing.workers.TaggedNanny")
    assert [type(n) for n in w.nannies] == [TaggedNanny]


def test_a_refused_certificate_is_one_error_before_any_worker_starts(
    one_gpu: None, tmp_path: Any
) -> None:
    """A TLS scheduler that does not accept the node's certificate: CUDAWorker says so
    (cudask.deploy.preflight) instead of starting nannies that retry until
    --death-timeout."""
    import shutil

    from distributed import Scheduler
    from distributed.security import Security
    from netns import make_pki

    from cudask.errors import TLSRefusedError

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    pki = make_pki(tmp_path, "127.0.0.1")

    async def main() -> None:
        security = Security(
            tls_ca_file=pki["ca"],
            tls_scheduler_cert=pki["sched"],
            tls_scheduler_key=pki["sched-key"],
            require_encryption=True,
        )
        async with Scheduler(
            protocol="tls", host="127.0.0.1", port=0, security=security, dashboard_address=":0"
        ) as s:
            for cert, key, ca, said in (
                (pki["bad"], pki["bad-key"], pki["ca"], "refused this worker's certificate"),
                (pki["worker"], pki["worker-key"], pki["rogue"], "does not trust"),
            ):
                w = node.CUDAWorker(
                    s.address, tls_ca_file=ca, tls_cert=cert, tls_key=key, device_memory_limit=None
                )
                with pytest.raises(TLSRefusedError, match=said):
                    await w
                assert all(n.status.name == "init" for n in w.nannies)
                assert not s.workers

    asyncio.run(main())


def test_fewer_gpus_than_expected_is_one_error_at_start(one_gpu: None) -> None:
    """A pod given fewer GPUs than its limit (or a job on the wrong node) says so."""
    from cudask.errors import DeviceError

    with pytest.raises(DeviceError, match=r"expected_gpus=2 but 1 GPU\(s\) are visible"):
        _build("tcp://10.0.0.1:8786", expected_gpus=2)
    assert len(_build("tcp://10.0.0.1:8786", expected_gpus=1).nannies) == 1


def test_cudask_worker_checks_its_input_once(
    one_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cudask worker` checks its flags itself (to name them in its errors) and hands
    the checked options to CUDAWorker, which does not check them again; CUDAWorker
    called from Python checks its keywords."""
    from click.testing import CliRunner

    from cudask.cli.main import cli
    from cudask.deploy import checks
    from cudask.errors import DeviceError
    from cudask.options import WorkerOptions

    calls: list[str] = []
    placed: list[WorkerOptions] = []
    real = checks.check_input

    def counted(values: Any, surface: Any, **kwargs: Any) -> WorkerOptions:
        calls.append(surface)
        return real(values, surface, **kwargs)

    def place(
        self: node.CUDAWorker, scheduler: Any, options: WorkerOptions, kwargs: Any, stacklevel: int
    ) -> None:
        placed.append(options)
        raise DeviceError("stopped before finding GPUs")

    monkeypatch.setattr(checks, "check_input", counted)
    monkeypatch.setattr(node, "check_input", counted)
    monkeypatch.setattr(node.CUDAWorker, "_place", place)
    result = CliRunner().invoke(cli, ["worker", "tcp://10.0.0.1:8786", "--nthreads", "3"])
    assert "stopped before finding GPUs" in result.output, result.output
    assert calls == ["cli"] and [o.nthreads for o in placed] == [3]
    with pytest.raises(DeviceError, match="stopped"):
        node.CUDAWorker("tcp://10.0.0.1:8786", nthreads=2)
    assert calls == ["cli", "worker"] and placed[-1].nthreads == 2
    with pytest.raises(OptionError, match="nthreads=0"):
        node.CUDAWorker("tcp://10.0.0.1:8786", nthreads=0)
