from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from cudask.cli.main import cli, cuda
from cudask.options import options_for


def test_every_option_has_a_flag():
    help_text = CliRunner().invoke(cli, ["worker", "--help"], terminal_width=200).output
    flags = [opt.cli_flag for opt in options_for("cli")]
    assert len(flags) >= 40, flags  # the loop below checks something
    for flag in flags:
        assert flag in help_text


def test_dask_cuda_group_has_the_same_commands():
    assert set(cuda.commands) >= {"worker", "config"}
    assert cuda.commands["worker"] is cli.commands["worker"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rmm-async", "--rmm-managed-memory"], "cannot be combined"),
        (["--rmm-release-threshold", "1GB"], "needs rmm_async"),
        (["--set-rmm-allocator-for-libs", "jax"], "'jax' not accepted"),
        (["--enable-infiniband", "--protocol", "tcp"], "needs protocol='ucx'"),
        (["--nthreads", "0"], "at least 1"),
        (["--tls-ca-file", "ca.pem"], "TLS needs all"),
        (["--contact-address", "tcp://node1:9000"], "Must specify listen_address"),
        (
            ["--listen-address", "tcp://0.0.0.0:9000", "--worker-port", "9000"],
            "Cannot specify worker_port when listen_address is given",
        ),
        (
            ["--listen-address", "tcp://0.0.0.0:9000", "--host", "127.0.0.1"],
            "Cannot specify listen_address when host or interface is given",
        ),
        (
            ["--listen-address", "tcp://0.0.0.0:9000", "--interface", "lo"],
            "Cannot specify listen_address when host or interface is given",
        ),
    ],
)
def test_bad_flags_give_one_line_no_traceback(args, message):
    result = CliRunner().invoke(cli, ["worker", "tcp://127.0.0.1:8786", *args])
    assert result.exit_code == 2  # a usage error, caught before any GPU is looked for
    assert message in result.output
    assert "Traceback" not in result.output


def test_scheduler_looking_like_a_flag():
    result = CliRunner().invoke(cli, ["worker", "--", "-oops"])
    assert result.exit_code == 2 and "looks like a flag" in result.output


def test_no_scheduler(monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    result = CliRunner().invoke(cli, ["worker"])
    assert result.exit_code == 2 and "no scheduler" in result.output  # a usage error


def test_entry_points_installed():
    out = subprocess.run(
        ["dask", "cuda", "worker", "--help"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and "--device-memory-limit" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "cudask.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and "--rmm-pool-size" in out.stdout


def test_no_gpu_is_a_plain_error_exit_1():
    # CI machines have no GPU: the worker command must say so without a traceback.
    out = subprocess.run(
        ["cudask", "worker", "tcp://127.0.0.1:8786"], capture_output=True, text=True, check=False
    )
    if "no NVIDIA GPU" not in out.stderr:
        pytest.skip("this machine has a GPU")
    assert out.returncode == 1 and "Traceback" not in out.stderr


def test_dask_jobqueue_worker_command_line_is_accepted():
    # dask-jobqueue runs `python -m cudask.cli worker` (its worker_command) with these flags;
    # every one must parse (here the run stops at the missing GPU, before any process).
    args = [
        "worker",
        "tcp://127.0.0.1:8786",
        "--name",
        "dummy-name",
        "--nthreads",
        "1",
        "--memory-limit",
        "7.45GiB",
        "--nanny",
        "--death-timeout",
        "60",
        "--local-directory",
        "/tmp",
        "--interface",
        "lo",
        "--protocol",
        "tcp",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "cudask.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "no NVIDIA GPU" not in out.stderr:
        pytest.skip("this machine has a GPU")
    assert out.returncode == 1 and "No such option" not in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no-nanny"], "needs exactly one GPU"),
        (["--listen-address", "tcp://0.0.0.0:9000"], "when using multiple GPUs"),
    ],
)
def test_one_worker_options_with_two_gpus(monkeypatch, args, message):
    """Refused before any process starts, on a (fake) machine with two GPUs."""
    from cudask.deploy import node
    from cudask.devices import discover
    from cudask.testing import FakeBackend, fake_gpu

    machine = discover(FakeBackend([fake_gpu(0, cpus=range(4)), fake_gpu(1, cpus=range(4))]))
    monkeypatch.setattr(node, "discover", lambda: machine)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = CliRunner().invoke(cli, ["worker", "tcp://127.0.0.1:8786", *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_scheduler_file_beats_the_environment(tmp_path):
    """--scheduler-file on the command line wins over DASK_SCHEDULER_ADDRESS (as for
    `cudask top`): no conflict, and the address in the environment is not checked."""
    result = CliRunner().invoke(
        cli,
        ["worker", "--scheduler-file", str(tmp_path / "s.json"), "--nthreads", "0"],
        env={"DASK_SCHEDULER_ADDRESS": "banana"},
    )
    assert result.exit_code == 2, result.output
    assert "nthreads=0" in result.output and "banana" not in result.output
