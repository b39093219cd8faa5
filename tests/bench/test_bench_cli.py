"""`cudask bench` options and errors (CPU): help, and one-line messages before any
process starts, for spill, cupy, startup, soak and transfer. Whole runs:
test_bench_cli_runs.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bench_invoke import CPU, invoke, one_line_error

from cudask_bench import environment

HAS_GPU = environment.gpus().get("available", False)
HAS_CUPY = environment.has_module("cupy")


def test_help_lists_workloads() -> None:
    code, out = invoke("--help")
    assert code == 0
    for name in ("spill", "cupy", "startup", "chart"):
        assert name in out


@pytest.mark.parametrize("command", ["spill", "cupy", "startup"])
def test_command_help(command: str) -> None:
    code, out = invoke(command, "--help")
    assert code == 0
    for flag in (
        "--against",
        "--dask-cuda-python",
        "--jit-unspill",
        "--output",
        "--chart",
        "--progress",
        "--repeat",
        "--device-memory-limit",
        "--baseline",
    ):
        assert flag in out


@pytest.mark.parametrize("command", ["spill", "cupy"])
def test_processes_flag(command: str) -> None:
    assert "--processes" in invoke(command, "--help")[1]
    line = one_line_error(*invoke(command, *CPU, "--processes", "0"))
    assert "--processes" in line and "0" in line


@pytest.mark.parametrize("command", ["spill", "cupy"])
def test_mode_help(command: str) -> None:
    code, out = invoke(command, "--help")
    assert code == 0
    assert "--mode [cold|warm]" in out and "[default: cold]" in out and "--warm-runs" in out
    flat = " ".join(out.split())  # the option help is wrapped
    assert "first run on a fresh cluster, timed from the first submit" in flat
    assert "--mode cold (default)" in out and "_warm" in out
    if command == "cupy":
        assert "OP_input" in out and "OP_total" in out


@pytest.mark.parametrize("command", ["spill", "cupy"])
def test_mode_usage_errors(command: str) -> None:
    """--processes belongs to warm mode, --warm-runs to cold mode: one line each."""
    message = "--processes applies to --mode warm; in cold mode every repetition is its own process"
    assert one_line_error(*invoke(command, *CPU, "--processes", "2")) == f"Error: {message}"
    line = one_line_error(*invoke(command, *CPU, "--mode", "cold", "--processes", "1"))
    assert line == f"Error: {message}"
    line = one_line_error(*invoke(command, *CPU, "--mode", "warm", "--warm-runs", "1"))
    assert line.startswith("Error: --warm-runs applies to --mode cold")
    code, out = invoke(command, *CPU, "--mode", "hot")
    assert code == 2 and "'hot'" in out and "cold" in out and "warm" in out
    code, out = invoke(command, *CPU, "--warm-runs", "-1")
    assert code == 2 and "--warm-runs" in out


def test_unknown_workload() -> None:
    code, out = invoke("nonsense")
    assert code != 0 and "nonsense" in out and "Traceback" not in out


def test_unknown_operation_names_accepted() -> None:
    line = one_line_error(*invoke("cupy", *CPU, "--operation", "fft"))
    assert "'fft'" in line and "transpose_sum" in line and "map_overlap" in line


def test_bad_device_memory_limit() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--device-memory-limit", "4XB"))
    assert "4XB" in line and "accepted" in line


def test_bad_total_and_chunk() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--total", "lots"))
    assert "--total" in line and "lots" in line
    line = one_line_error(*invoke("spill", *CPU, "--total", "1MiB", "--chunk-size", "2MiB"))
    assert "larger than --total" in line
    line = one_line_error(*invoke("spill", *CPU, "--chunk-size", "1001"))
    assert "multiple of 8" in line
    line = one_line_error(*invoke("spill", *CPU, "--total", "0"))
    assert "--total" in line


def test_bad_disk_size() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--disk-size", "a lot"))
    assert "--disk-size='a lot' is not a size" in line


def test_cupy_shape_errors() -> None:
    line = one_line_error(*invoke("cupy", *CPU, "--size", "100", "--chunk-size", "200"))
    assert "--chunk-size=200" in line
    line = one_line_error(
        *invoke("cupy", *CPU, "--operation", "svd", "--chunk-size", "50", "--second-size", "60")
    )
    assert "--second-size=60" in line
    code, out = invoke("cupy", *CPU, "--size", "3")
    assert code == 2 and "--size" in out


def test_bad_repeat() -> None:
    code, out = invoke("spill", *CPU, "--repeat", "0")
    assert code == 2 and "--repeat" in out


def test_jit_flags_conflict() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--jit-unspill", "on", "--no-jit-unspill"))
    assert "--no-jit-unspill" in line


def test_jit_needs_a_backend_that_has_it() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--jit-unspill"))
    assert "--jit-unspill" in line


def test_missing_python_path() -> None:
    line = one_line_error(
        *invoke("spill", *CPU, "--against", "dask-cuda", "--dask-cuda-python", "/no/such/python")
    )
    assert "/no/such/python" in line and "does not exist" in line


def test_python_path_that_is_not_python(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho not python >&2\nexit 3\n")
    fake.chmod(0o755)
    line = one_line_error(
        *invoke("spill", *CPU, "--against", "dask-cuda", "--dask-cuda-python", str(fake))
    )
    assert str(fake) in line


def test_dask_cuda_path_missing_dir(tmp_path: Path) -> None:
    line = one_line_error(
        *invoke("spill", *CPU, "--against", "dask-cuda", "--dask-cuda-path", str(tmp_path / "x"))
    )
    assert "is not a directory" in line


def test_dask_cuda_python_without_against() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--dask-cuda-python", sys.executable))
    assert "--against dask-cuda" in line


@pytest.mark.skipif(environment.has_module("dask_cuda"), reason="dask-cuda is installed here")
def test_against_dask_cuda_not_installed() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--against", "dask-cuda"))
    assert "dask-cuda" in line and "--dask-cuda-python" in line


def test_jit_unspill_against_new_dask_cuda(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    line = one_line_error(
        *invoke(
            "spill",
            *CPU,
            "--against",
            "dask-cuda",
            "--dask-cuda-path",
            str(path),
            "--jit-unspill",
            "both",
        )
    )
    assert "26.10.00" in line and "26.04" in line and "JIT-unspill" in line


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here")
def test_missing_cupy() -> None:
    line = one_line_error(*invoke("spill"))
    assert "cupy" in line and "pip install" in line


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_no_gpu_for_cudask_backend() -> None:
    line = one_line_error(*invoke("startup", "--array-module", "numpy"))
    assert "GPU" in line and "--backend dict --array-module numpy" in line


def test_against_jit_unspill_needs_against() -> None:
    line = one_line_error(*invoke("spill", *CPU, "--against-jit-unspill", "on"))
    assert "--against-jit-unspill" in line and "--against dask-cuda" in line


def test_against_jit_unspill_off_passes_the_new_dask_cuda_check(
    tmp_path: Path, fake_dask_cuda: Callable[..., Path]
) -> None:
    path = fake_dask_cuda(tmp_path / "dc", "26.10.00", proxy_object=False)
    args = ("spill", *CPU, "--against", "dask-cuda", "--dask-cuda-path", str(path))
    assert "JIT-unspill" in one_line_error(*invoke(*args, "--against-jit-unspill", "on"))
    _, out = invoke(*args, "--jit-unspill", "both", "--against-jit-unspill", "off")
    assert "JIT-unspill" not in out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--duration", "banana"], "'banana' is not a time"),
        (["--duration", "0"], "'0' must be more than 0 seconds"),
        (["--kill-every", "soon"], "'soon' is not a time"),
        (["--min-kills", "2", "--kill-every", "0"], "--min-kills=2 with --kill-every=0.0"),
        (["--min-kills", "40", "--duration", "60"], "take longer than --duration + 600 s"),
        (["--min-kills", "-1"], "-1 is not in the range"),
        (["--device-memory-limit", "0"], "--device-memory-limit: '0'"),
        (["--max-held", "lots"], "--max-held='lots'"),
        (["--host-fraction", "1.5"], "1.5; accepted: a fraction"),
        (["--n-workers", "0"], "0 is not in the range"),
    ],
)
def test_soak_bad_input(args: list[str], named: str) -> None:
    code, out = invoke("soak", *args)
    assert code == 2, out
    assert named in one_line_error(code, out)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--sizes", "64MiB,banana"], "'banana'; accepted: sizes of at least 8 bytes"),
        (["--sizes", "4"], "'4'; accepted"),
        (["--n", "1000", "--blocks", "7"], "--n 1000 is not a multiple of --blocks 7"),
        (["--repeat", "-1"], "-1 is not in the range"),
        (["--device-memory-limit", "lots"], "--device-memory-limit='lots'"),
        (["--protocols", "tcp,udp"], "'tcp,udp'; accepted: tcp, ucx"),
        (
            ["--dask-cuda-path", "/tmp"],
            "--dask-cuda-python / --dask-cuda-path need --against dask-cuda",
        ),
        (["--shuffle-methods", "tasks,bogus"], "'tasks,bogus'; accepted: tasks, p2p, explicit"),
        (["--shuffle-rows", "-1"], "-1 is not in the range"),
        (["--rmm-pool-size", "none,lots"], "--rmm-pool-size='lots'"),
        (["--rmm-pool-size", "40GB,none,40GB"], "'40GB,none,40GB' names a pool twice; accepted"),
        (["--rounds", "0"], "0 is not in the range"),
        (
            ["--protocols", "tcp", "--settings", "cudask-ipc,bogus"],
            (
                "'cudask-ipc,bogus'; accepted: cudask-ipc, cudask-ipc-no-staging, "
                "cudask-ipc-gc-freeze, cudask-ipc-spill-ahead, cudask-ipc-no-on-demand, cudask-tcp (with these"
            ),
        ),
    ],
)
def test_transfer_bad_input(args: list[str], named: str) -> None:
    code, out = invoke("transfer", *args)
    assert code == 2, out
    assert named in one_line_error(code, out)


def test_transfer_shuffle_without_dask_cudf(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask_bench import environment

    monkeypatch.setattr(environment, "has_module", lambda name: name != "dask_cudf")
    code, out = invoke("transfer", "--shuffle-rows", "1000")
    assert (
        "--shuffle-rows 1000 needs dask_cudf, which is not installed. Install it with: pip install "
        "dask-cudf-cu13  (or --shuffle-rows 0)"
    ) in one_line_error(code, out)
    monkeypatch.setattr(environment, "has_module", lambda name: True)
    code, out = invoke("transfer", "--shuffle-rows", "3")
    assert "3; accepted: 0 (no shuffle) or at least --blocks (8) rows" in one_line_error(code, out)


def test_transfer_needs_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask_bench import environment

    monkeypatch.setattr(environment, "gpus", lambda: {"available": False, "reason": "NVML finds 0"})
    code, out = invoke("transfer")
    assert "cudask bench transfer needs an NVIDIA GPU" in one_line_error(code, out)


def test_transfer_placement_names_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask_bench import environment

    monkeypatch.setattr(environment, "gpus", lambda: {"available": True, "devices": [{"index": 0}]})
    for placement in ("0", "0,1", "0,x", "0+1", "0+0", "0+00", "0,\u00b2"):
        code, out = invoke("transfer", "--placement", placement)
        assert (
            code == 2
            and f"{placement!r}; accepted: two or more GPU indices below 1"
            in one_line_error(code, out)
        ), out


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, ("0,1",)), ("0,1", ("0", "1")), ("1+0,0", ("1,0", "0")), ("00 + 1", ("0,1",))],
)
def test_transfer_placement_to_worker_processes(
    monkeypatch: pytest.MonkeyPatch, given: str | None, expected: tuple[str, ...]
) -> None:
    """By default one worker process over both GPUs (a worker per GPU, as users start them)."""
    from cudask_bench import transfer as transfer_run

    monkeypatch.setattr(
        environment, "gpus", lambda: {"available": True, "devices": [{"index": 0}, {"index": 1}]}
    )
    monkeypatch.setattr(environment, "has_module", lambda name: True)
    plans: list[transfer_run.TransferPlan] = []
    monkeypatch.setattr(
        transfer_run,
        "run_transfer",
        lambda plan, **kw: plans.append(plan) or {"plan": {}, "settings": {}},
    )
    code, out = invoke(
        "transfer", "--shuffle-rows", "0", *(["--placement", given] if given else [])
    )
    assert code == 0, out
    assert plans[0].placement == expected


def test_transfer_against_a_missing_dask_cuda(tmp_path: Path) -> None:
    code, out = invoke(
        "transfer", "--against", "dask-cuda", "--dask-cuda-path", str(tmp_path / "nope")
    )
    assert "--dask-cuda-path=" in one_line_error(code, out) and "is not a directory" in out
