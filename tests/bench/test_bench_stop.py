"""`cudask bench` with real processes (CPU): SIGINT or SIGTERM stops its runner and the
runner's workers and removes its temporary directories; a runner whose harness is killed
stops too; without a GPU, the command its error suggests ends quickly with progress."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cudask_bench import environment

BENCH = [sys.executable, "-m", "cudask.cli", "bench"]
#: Small chunks, but repetitions enough to outlast the test by far.
LONG_SPILL = [
    "spill",
    "--backend",
    "dict",
    "--array-module",
    "numpy",
    "--total",
    "16MiB",
    "--chunk-size",
    "4MiB",
    "--mode",
    "warm",
    "--repeat",
    "1000000",
]
HAS_GPU = environment.gpus().get("available", False)


#: Runs the command in its arguments (same process, through exec) with SIGINT's default
#: action: a shell starts a background job with SIGINT ignored, and the bench leaves an
#: ignored SIGINT ignored; here it gets SIGINT as from a terminal.
DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    (
        "import os, signal, sys; "
        "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    ),
]


def _start(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    tmp.mkdir()
    return subprocess.Popen(
        [*DEFAULT_SIGINT, *BENCH, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def _runner_with_workers(bench: subprocess.Popen[str]) -> list[psutil.Process]:
    """The runner `bench` started and its descendants, once the runner has a worker."""

    def found() -> list[psutil.Process] | None:
        assert bench.poll() is None, bench.communicate()
        for child in psutil.Process(bench.pid).children():
            try:
                if "cudask_bench.run" in child.cmdline():
                    workers = [
                        p
                        for p in child.children(recursive=True)
                        if "spawn_main" in " ".join(p.cmdline())
                    ]
                    if workers:
                        return [child, *child.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return None

    processes = _wait_for(found, 120, "a runner with a worker process")
    assert isinstance(processes, list)
    return processes


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_runner_and_workers_and_removes_temporary_files(
    tmp_path: Path, sig: signal.Signals
) -> None:
    tmp = tmp_path / "tmp"
    bench = _start(LONG_SPILL, tmp)
    try:
        processes = _runner_with_workers(bench)
        assert any(tmp.iterdir())  # the runner's directory, while it runs
        bench.send_signal(sig)
        out, err = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 128 + sig, (out, err)
    last = err.strip().splitlines()[-1]
    assert last.endswith(
        f"bench spill: interrupted by {sig.name}; its processes are stopped "
        "and its temporary files removed"
    ), err
    _, alive = psutil.wait_procs(processes, timeout=60)
    assert not alive, [p.cmdline() for p in alive]
    assert sorted(os.listdir(tmp)) == []


#: A parent that starts a runner (output to a file, so no broken pipe tells the runner
#: anything), prints its pid and waits to be killed.
PARENT = """
import subprocess, sys, time
with open(sys.argv[1], "w") as log:
    runner = subprocess.Popen([sys.executable, "-m", "cudask_bench.run", *sys.argv[2:]],
                              stdout=log, stderr=log, start_new_session=True)
print(runner.pid, flush=True)
time.sleep(3600)
"""


@pytest.mark.timeout(400)
def test_runner_stops_when_its_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the harness no chance to stop its runner: the runner sees its
    parent gone and stops, closing its workers and removing its local directory."""
    argv = [
        "--backend",
        "dict",
        "--workload",
        "spill",
        "--array-module",
        "numpy",
        "--mode",
        "warm",
        "--repeat",
        "1000000",
        "--total",
        str(2**24),
        "--chunk-size",
        str(2**22),
        "--json",
        str(tmp_path / "result.json"),
    ]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "log"), *argv],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        assert parent.stdout is not None
        runner = psutil.Process(int(parent.stdout.readline()))

        def workers() -> list[psutil.Process]:
            assert runner.is_running(), (tmp_path / "log").read_text()
            return [
                p for p in runner.children(recursive=True) if "spawn_main" in " ".join(p.cmdline())
            ]

        _wait_for(workers, 120, "a runner with a worker process")
        processes = [runner, *runner.children(recursive=True)]
    finally:
        parent.kill()
        parent.communicate()
    _, alive = psutil.wait_procs(processes, timeout=90)
    assert not alive, [p.cmdline() for p in alive]
    assert "stopped by SIGTERM" in (tmp_path / "result.json").read_text()
    # its cluster's local directory is gone (the scheduler's dask-scratch-space is
    # dask's, removed with the harness's directory of the runner)
    assert [p.name for p in tmp.iterdir() if p.name.startswith("cudask")] == []


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
@pytest.mark.timeout(400)
@pytest.mark.parametrize("workload", ["spill", "cupy", "startup"])
def test_suggested_cpu_command_finishes_with_progress(tmp_path: Path, workload: str) -> None:
    """The no-GPU error's suggestion, run as printed (the same command `cudask bench
    --help` gives for spill): it ends well within two minutes (a minute on an idle
    machine) and shows a progress line, --array-module numpy's defaults giving a small
    workload and --progress."""
    asked = subprocess.run(
        [*BENCH, workload, "--array-module", "numpy"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert asked.returncode == 1 and "NVML finds none" in asked.stderr, asked.stderr
    marker = "without a GPU (host memory, under a minute): "
    suggested = shlex.split(asked.stderr.strip().split(marker, 1)[1])
    assert suggested[:3] == ["cudask", "bench", workload]
    if workload == "spill":
        shown = subprocess.run(
            [*BENCH, "--help"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        assert " ".join(suggested) in " ".join(shown.split()), shown
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    start = time.monotonic()
    run = subprocess.run(
        [*BENCH, *suggested[2:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp)},
        check=False,
    )
    took = time.monotonic() - start
    assert run.returncode == 0, run.stderr
    assert took < 120
    progress = run.stderr.replace("\r", "\n")
    assert re.search(r"\[1/1\] dict store[^:]*: \[[#-]+\] \d+/\d+ ", progress), run.stderr
    assert "[1/1] dict store: ok" in progress, run.stderr
    assert sorted(os.listdir(tmp)) == []


def test_a_signal_in_a_deferred_section_raises_at_its_end() -> None:
    """The harness starts a runner and records it in such a section: an interrupt there
    must not leave a process nobody stops. Later signals, while stopping, are let be."""
    from cudask_bench import stopping

    before = signal.getsignal(signal.SIGTERM)
    reached = []
    with pytest.raises(stopping.Interrupted) as info, stopping.interrupts():
        with stopping.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            reached.append("end of the section")
        reached.append("after the section")
    assert reached == ["end of the section"]
    assert info.value.exit_code == 143 and info.value.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_ignored_sigint_stays_ignored() -> None:
    """A background job's SIGINT is ignored by its shell; the bench leaves it so."""
    from cudask_bench import stopping

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stopping.interrupts():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_runner_s_outcome_is_recorded_whatever_ends_it(tmp_path: Path) -> None:
    """record_run writes the work's result, or the error or interrupt that ended it, and
    returns the exit code a shell would report."""
    import json

    from cudask_bench import stopping

    path = str(tmp_path / "result.json")
    assert stopping.record_run(lambda: {"figures": {"s": 1.0}}, path) == 0
    assert json.loads(Path(path).read_text()) == {
        "status": "ok",
        "error": None,
        "figures": {"s": 1.0},
    }

    def fail() -> dict:
        raise RuntimeError("no GPU")

    assert stopping.record_run(fail, path) == 1
    failed = json.loads(Path(path).read_text())
    assert (
        failed["status"] == "failed"
        and failed["error"] == "RuntimeError: no GPU"
        and "fail" in failed["traceback"]
    )

    def interrupted() -> dict:
        raise stopping.Interrupted(signal.SIGTERM)

    assert stopping.record_run(interrupted, path) == 143
    assert json.loads(Path(path).read_text())["error"] == "stopped by SIGTERM"
