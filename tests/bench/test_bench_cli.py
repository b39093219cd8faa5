"""`cudask bench` options and errors (CPU): one-line messages before any process starts,
and a whole run of the harness on the plain-dict backend with NumPy."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from cudask_bench import environment, pngtext
from cudask_bench.cli import bench

CPU = ["--backend", "dict", "--array-module", "numpy"]
HAS_GPU = environment.gpus().get("available", False)
HAS_CUPY = environment.has_module("cupy")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(bench, list(args), prog_name="cudask bench")
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"traceback instead of an error message: {result.exception!r}"
    return result.exit_code, result.output


def one_line_error(code: int, output: str) -> str:
    assert code != 0, output
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output
    return errors[0]


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


def test_jit_unspill_against_new_dask_cuda(tmp_path: Path, fake_dask_cuda: Callable[..., Path]) -> None:
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


@pytest.mark.timeout(600)
def test_whole_run_on_dict_backend(tmp_path: Path) -> None:
    """The harness end to end on CPU, cold mode (the default): a warm-up process, then a
    fresh runner process per measured repetition; JSON, chart, table."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "r" / "spill.json", tmp_path / "r" / "spill.png"
    code, text = invoke(
        "spill",
        *CPU,
        "--total",
        "4MiB",
        "--chunk-size",
        "1MiB",
        "--repeat",
        "2",
        "--output",
        str(out),
        "--chart",
        str(png),
        "--progress",
    )
    assert code == 0, text
    assert "dict store" in text and "create" in text and "read_verify" in text
    assert "cold: first run on a fresh cluster, timed from the first submit" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == "cudask-bench/1" and doc["status"] == "ok"
    assert doc["parameters"]["total"] == 4 * 2**20 and doc["parameters"]["chunks"] == 4
    assert doc["parameters"]["mode"] == "cold" and doc["parameters"]["warm_runs"] == 2
    assert doc["parameters"]["warmup"] == 1 and doc["parameters"]["processes"] == 3
    [variant] = doc["variants"]
    assert variant["backend"] == "dict" and variant["status"] == "ok"
    assert variant["store"]["data_type"] == "builtins.dict"
    # one warm-up process, then one process per measured repetition: three runners
    assert variant["runs"] == 3 and len(set(variant["pids"])) == 3 and None not in variant["pids"]
    m = variant["measurements"]
    assert list(m) == ["create", "read_verify", "create_warm", "read_verify_warm"]
    create = m["create"]
    assert len(create["times"]) == 2 and create["bytes"] == 4 * 2**20
    assert len(create["warmup_times"]) == 1  # the warm-up process: kept, never in a median
    assert create["median"] > 0 and create["gbps"] > 0
    assert "every run" in create["check"]
    # --warm-runs 2 in each of the two measured processes (and two in the warm-up one)
    assert len(m["read_verify_warm"]["times"]) == 4
    assert len(m["read_verify_warm"]["warmup_times"]) == 2
    assert doc["machine"]["hostname"] and doc["harness"]["versions"]["dask"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the chart is of the file written, whose commit its caption gives
    text = pngtext.read(png.read_bytes())
    assert text["Source"] == str(out)
    assert text["Source-SHA256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    commit = doc["provenance"]["source"].get("commit") or "commit not recorded"
    assert f"cudask {commit[:7]}" in text["Description"].splitlines()[1]
    assert "figures: cold (first run on a fresh cluster) and warm" in text["Description"]


@pytest.mark.timeout(600)
def test_warm_mode_on_dict_backend(tmp_path: Path) -> None:
    """--mode warm: today's steady state in one process, every metric named *_warm."""
    out = tmp_path / "warm.json"
    code, text = invoke(
        "spill", *CPU, "--mode", "warm", "--total", "2MiB", "--chunk-size", "1MiB",
        "--repeat", "2", "--warmup", "1", "--output", str(out),
    )
    assert code == 0, text
    assert "warm: steady state after warm-ups" in text
    doc = json.loads(out.read_text())
    assert doc["parameters"]["mode"] == "warm" and doc["parameters"]["warm_runs"] is None
    assert doc["parameters"]["processes"] == 1
    [variant] = doc["variants"]
    assert variant["runs"] == 1
    m = variant["measurements"]
    assert list(m) == ["create_warm", "read_verify_warm"]
    assert len(m["create_warm"]["times"]) == 2 and len(m["create_warm"]["warmup_times"]) == 1


@pytest.mark.timeout(600)
def test_cupy_cold_on_dict_backend(tmp_path: Path) -> None:
    """Cold cupy: a process per repetition, and in it a fresh cluster per operation."""
    out = tmp_path / "cupy.json"
    code, text = invoke(
        "cupy", *CPU, "--operation", "sum,dot", "--size", "200", "--chunk-size", "50",
        "--repeat", "1", "--warmup", "1", "--warm-runs", "1", "--output", str(out),
    )
    assert code == 0, text
    assert "*_input: creating the input, *_total: input + operation" in text
    doc = json.loads(out.read_text())
    [variant] = doc["variants"]
    assert variant["runs"] == 2 and len(set(variant["pids"])) == 2
    m = variant["measurements"]
    assert list(m) == ["sum_input", "sum", "sum_total", "sum_warm",
                       "dot_input", "dot", "dot_total", "dot_warm"]
    for op in ("sum", "dot"):
        assert all(len(m[op + s]["times"]) == 1 for s in ("_input", "", "_total", "_warm"))
        assert all(len(m[op + s]["warmup_times"]) == 1 for s in ("_input", "", "_total", "_warm"))
        assert m[op + "_total"]["median"] == pytest.approx(
            m[op + "_input"]["median"] + m[op]["median"])
        assert m[op]["check"]
    assert set(variant["stores"]) == {"sum", "dot"}  # a cluster each
    # the table lists the cold figures first
    rows = [line.split()[0] for line in text.splitlines() if line.startswith(("sum", "dot"))]
    assert rows[:8] == ["sum_input", "sum", "sum_total", "dot_input", "dot", "dot_total",
                        "sum_warm", "dot_warm"]


@pytest.mark.timeout(600)
def test_startup_runs_fresh_processes(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    code, text = invoke("startup", *CPU, "--repeat", "2", "--warmup", "1", "--output", str(out))
    assert code == 0, text
    [variant] = json.loads(out.read_text())["variants"]
    assert variant["runs"] == 3
    m = variant["measurements"]
    assert len(m["startup"]["times"]) == 2 and len(m["startup"]["warmup_times"]) == 1
    assert {"import", "cluster", "first_roundtrip", "first_array_task", "close"} <= set(m)
    ready = m["ready_for_arrays"]["times"]
    assert all(r > s for r, s in zip(ready, m["startup"]["times"], strict=True))
    assert len(variant["process_wall_s"]) == 3 and len(set(variant["pids"])) == 3


def test_failing_variant_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variant whose runner fails: the table says FAILED, JSON keeps the error, exit 1."""
    from cudask_bench import harness

    def failing_runner(*args: object, **kwargs: object) -> dict[str, object]:
        return {
            "status": "failed",
            "error": "RuntimeError: out of memory",
            "measurements": {},
            "returncode": 1,
            "process_wall_s": 0.1,
            "log_tail": ["boom"],
        }

    monkeypatch.setattr(harness, "spawn_runner", failing_runner)
    out = tmp_path / "fail.json"
    code, text = invoke(
        "spill", *CPU, "--total", "1MiB", "--chunk-size", "1MiB", "--output", str(out)
    )
    assert code == 1
    assert "FAILED dict store: RuntimeError: out of memory" in text
    assert "1 of 1 variants failed" in text
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed"
    assert doc["variants"][0]["error"] == "RuntimeError: out of memory"
    assert doc["variants"][0]["log_tail"] == ["boom"]


def test_chart_command(tmp_path: Path, synthetic_document: dict[str, object]) -> None:
    pytest.importorskip("matplotlib")
    src = tmp_path / "doc.json"
    src.write_text(json.dumps(synthetic_document))
    code, out = invoke("chart", str(src), "--output", str(tmp_path / "c.png"))
    assert code == 0, out
    assert "ratios" in out and "dask-cuda 4 GiB" in out
    assert (tmp_path / "c.png").stat().st_size > 1000
    # the picture names the file it was drawn from, as given on the command line
    text = pngtext.read((tmp_path / "c.png").read_bytes())
    assert text["Source"] == str(src) and text["Description"].startswith(f"result: {src}\n")


def test_chart_command_refuses_other_json(tmp_path: Path) -> None:
    src = tmp_path / "other.json"
    src.write_text('{"hello": 1}')
    code, out = invoke("chart", str(src), "--output", str(tmp_path / "c.png"))
    assert code == 1 and "not a cudask bench result" in out


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


@pytest.mark.parametrize(("args", "named"), [
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
])
def test_soak_bad_input(args: list[str], named: str) -> None:
    code, out = invoke("soak", *args)
    assert code == 2, out
    assert named in one_line_error(code, out)


@pytest.mark.parametrize(("args", "named"), [
    (["--sizes", "64MiB,banana"], "'banana'; accepted: sizes of at least 8 bytes"),
    (["--sizes", "4"], "'4'; accepted"),
    (["--n", "1000", "--blocks", "7"], "--n 1000 is not a multiple of --blocks 7"),
    (["--repeat", "-1"], "-1 is not in the range"),
    (["--device-memory-limit", "lots"], "--device-memory-limit='lots'"),
    (["--protocols", "tcp,udp"], "'tcp,udp'; accepted: tcp, ucx"),
    (["--dask-cuda-path", "/tmp"], "--dask-cuda-python / --dask-cuda-path need --against dask-cuda"),
    (["--shuffle-methods", "tasks,bogus"], "'tasks,bogus'; accepted: tasks, p2p, explicit"),
    (["--shuffle-rows", "-1"], "-1 is not in the range"),
    (["--rmm-pool-size", "none,lots"], "--rmm-pool-size='lots'"),
    (["--rmm-pool-size", "40GB,none,40GB"], "'40GB,none,40GB' names a pool twice; accepted"),
    (["--rounds", "0"], "0 is not in the range"),
    (["--protocols", "tcp", "--settings", "cudask-ipc,bogus"],
     ("'cudask-ipc,bogus'; accepted: cudask-ipc, cudask-ipc-headroom0, cudask-ipc-no-staging, "
      "cudask-ipc-gc-freeze, cudask-ipc-spill-ahead, cudask-ipc-no-on-demand, cudask-tcp (with these")),
])
def test_transfer_bad_input(args: list[str], named: str) -> None:
    code, out = invoke("transfer", *args)
    assert code == 2, out
    assert named in one_line_error(code, out)


def test_transfer_shuffle_without_dask_cudf(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudask_bench import environment

    monkeypatch.setattr(environment, "has_module", lambda name: name != "dask_cudf")
    code, out = invoke("transfer", "--shuffle-rows", "1000")
    assert ("--shuffle-rows 1000 needs dask_cudf, which is not installed. Install it with: pip install "
            "dask-cudf-cu13  (or --shuffle-rows 0)") in one_line_error(code, out)
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
        assert code == 2 and f"{placement!r}; accepted: two or more GPU indices below 1" in \
            one_line_error(code, out), out


@pytest.mark.parametrize(("given", "expected"), [(None, ("0,1",)), ("0,1", ("0", "1")),
                                                 ("1+0,0", ("1,0", "0")), ("00 + 1", ("0,1",))])
def test_transfer_placement_to_worker_processes(monkeypatch: pytest.MonkeyPatch, given: str | None,
                                                expected: tuple[str, ...]) -> None:
    """By default one worker process over both GPUs (a worker per GPU, as users start them)."""
    from cudask_bench import transfer as transfer_run

    monkeypatch.setattr(environment, "gpus", lambda: {"available": True, "devices": [{"index": 0}, {"index": 1}]})
    monkeypatch.setattr(environment, "has_module", lambda name: True)
    plans: list[transfer_run.TransferPlan] = []
    monkeypatch.setattr(transfer_run, "run_transfer",
                        lambda plan, **kw: plans.append(plan) or {"plan": {}, "settings": {}})
    code, out = invoke("transfer", "--shuffle-rows", "0", *(["--placement", given] if given else []))
    assert code == 0, out
    assert plans[0].placement == expected


def test_transfer_against_a_missing_dask_cuda(tmp_path: Path) -> None:
    code, out = invoke("transfer", "--against", "dask-cuda", "--dask-cuda-path", str(tmp_path / "nope"))
    assert "--dask-cuda-path=" in one_line_error(code, out) and "is not a directory" in out


def test_transfer_settings_and_dask_cuda_workers(tmp_path: Path) -> None:
    """Which settings run, and how dask-cuda's workers are started: its CLI module
    with dask-cuda's directory (and, for another interpreter, cudask alone) on
    PYTHONPATH."""
    import sys

    from cudask_bench.transfer import Setting, settings, worker_launch

    dc = Setting("dask-cuda", "dask-cuda", "tcp", pythonpath=(str(tmp_path),))
    names = [s.name for s in settings(("tcp", "ucx"), dc)]
    assert names == ["cudask-ipc", "cudask-ipc-headroom0", "cudask-ipc-no-staging", "cudask-ipc-gc-freeze",
                     "cudask-ipc-spill-ahead", "cudask-ipc-no-on-demand", "cudask-tcp", "cudask-ucx",
                     "dask-cuda-tcp", "dask-cuda-ucx"]
    assert [s.name for s in settings(("tcp",), None)] == ["cudask-ipc", "cudask-ipc-headroom0",
                                                          "cudask-ipc-no-staging", "cudask-ipc-gc-freeze",
                                                          "cudask-ipc-spill-ahead",
                                                          "cudask-ipc-no-on-demand", "cudask-tcp"]
    ipc, headroom0, unstaged, frozen, ahead, unhooked, tcp = settings(("tcp",), None)
    with worker_launch(ipc) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True"})
    with worker_launch(headroom0) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True",
                                 "DASK_CUDASK__MEMORY__PINNED_HEADROOM": "0"})
    with worker_launch(unstaged) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True",
                                 "DASK_CUDASK__COMM__DEVICE_IPC_STAGING": "0"})
    with worker_launch(frozen) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True",
                                 "DASK_CUDASK__WORKER__GC_FREEZE": "True"})
    with worker_launch(ahead) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True",
                                 "DASK_CUDASK__MEMORY__SPILL_TARGET": "0.9"})
    with worker_launch(unhooked) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "True",
                                 "DASK_CUDASK__MEMORY__SPILL_ON_DEMAND": "False"})
    with worker_launch(tcp) as launch:
        assert launch == (None, {"DASK_CUDASK__COMM__DEVICE_IPC": "False"})
    with worker_launch(settings(("tcp",), dc)[-1]) as (command, env):
        assert command == [sys.executable, "-m", "dask_cuda.cli"]
        assert env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    other = Setting("dask-cuda-tcp", "dask-cuda", "tcp", python="/usr/bin/python3")
    with worker_launch(other) as (command, env):
        assert command[0] == "/usr/bin/python3"
        shim = Path(env["PYTHONPATH"].split(":")[0])
        assert (shim / "cudask").is_symlink()
    assert not shim.exists()  # the shim lasts as long as the workers


def test_transfer_reports_the_store_figures() -> None:
    from types import SimpleNamespace

    from cudask_bench.counters import store_figures

    class Store(dict):
        def metrics(self) -> dict[str, float]:
            return {"device-bytes": 5.0, "pinned-provision-bytes": 8.0, "pinned-provision-seconds": 0.5,
                    "spill-device-to-host-bytes": 0.0, "unspill-host-to-device-count": 2.0}

    assert store_figures(SimpleNamespace(data=Store())) == {
        "pinned-provision-bytes": 8.0, "pinned-provision-seconds": 0.5, "unspill-host-to-device-count": 2.0}
    assert store_figures(SimpleNamespace(data={})) == {}  # dask-cuda's or a plain store


def test_a_zict_device_buffer_s_spills_are_counted() -> None:
    """dask-cuda's DeviceHostFile keeps the device tier in a zict Buffer
    (`device_buffer`): once watched, what it moves to host shows in the store figures."""
    from types import SimpleNamespace

    import zict

    from cudask_bench.counters import store_figures, watch_spills

    buffer: zict.Buffer[str, bytes] = zict.Buffer({}, {}, n=10, weight=lambda k, v: len(v))
    worker = SimpleNamespace(data=SimpleNamespace(device_buffer=buffer))
    assert store_figures(worker) == {}
    assert watch_spills(worker) and not watch_spills(worker)  # once per store
    buffer["a"] = b"x" * 8
    assert store_figures(worker) == {}  # nothing spilled yet
    buffer["b"] = b"y" * 8  # past n: "a" goes to the slow mapping
    figures = store_figures(worker)
    assert figures["spill-device-to-host-count"] == 1.0
    assert figures["spill-device-to-host-bytes"] > 0
    assert not watch_spills(SimpleNamespace(data={}))  # a plain store: nothing to watch


def test_what_a_store_holds_is_read_from_cudask_s_metrics_or_dask_cuda_s_buffers() -> None:
    """`held_figures`: device and host bytes from cudask's store metrics, or from the
    weights of a zict Buffer over the device (dask-cuda's DeviceHostFile), with the spill
    figures; nothing for a plain store."""
    from types import SimpleNamespace

    import zict

    from cudask_bench.counters import held_figures, watch_spills

    metrics = {"device-bytes": 3e9, "host-bytes": 1.6e9, "device-keys": 2.0,
               "spill-device-to-host-bytes": 1.6e9}
    cudask_like = SimpleNamespace(data=SimpleNamespace(metrics=lambda: metrics))
    assert held_figures(cudask_like) == {"device-bytes": 3e9, "host-bytes": 1.6e9,
                                         "spill-device-to-host-bytes": 1.6e9}
    host: zict.Buffer[str, bytes] = zict.Buffer({}, {}, n=100, weight=lambda k, v: len(v))
    device: zict.Buffer[str, bytes] = zict.Buffer({}, host, n=10, weight=lambda k, v: len(v))
    dask_cuda_like = SimpleNamespace(data=SimpleNamespace(device_buffer=device, host_buffer=host))
    assert watch_spills(dask_cuda_like)
    device["a"] = b"x" * 8
    assert held_figures(dask_cuda_like) == {"device-bytes": 8.0, "host-bytes": 0.0}
    device["b"] = b"y" * 8  # past n: "a" goes to the host buffer
    figures = held_figures(dask_cuda_like)
    assert figures["device-bytes"] == 8.0 and figures["host-bytes"] == 8.0
    assert figures["spill-device-to-host-count"] == 1.0
    assert held_figures(SimpleNamespace(data={})) == {}
