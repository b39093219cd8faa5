"""Stopping benchmark processes on SIGINT or SIGTERM, leaving none behind.

Covers, for a `cudask bench` command: `interrupts()`, which turns the first SIGINT or
SIGTERM into `Interrupted` (raised in the main thread, so `finally` blocks stop what
they started) and ignores later ones while that unwinds; `deferred()`, a section where
the exception waits until the section ends (starting a process and recording it);
`wait_exited`, a wait that leaves the process unreaped; `stop_group(proc, grace)`,
which sends SIGTERM to a runner, gives it `grace` seconds to close its cluster and
remove its files, then sends SIGKILL to its process group (the runner and its workers).
For a runner (cudask_bench.run): `runner_lifeline()`, after which SIGTERM raises
`Interrupted` there too (and `check_stop` again, at each step), and the runner sends
itself SIGTERM once its parent is gone (a harness killed with SIGKILL leaves no runner
running), then SIGKILL if that did not end it; `record_run(work, path)`, a runner's
work with its outcome (figures, or the interrupt or error that ended it) written as JSON;
`runner_main`, a runner's whole main: its arguments parsed, then both.

Does not cover: what is stopped (cudask_bench.harness) or the temporary directories
(their owners remove them). Threading: the handlers run on the main thread, and
`interrupts`, `deferred` and `runner_lifeline` must be called from it (elsewhere
`interrupts` installs nothing); `runner_lifeline` starts one daemon thread. Imports
the standard library only: the runner loads it next to dask-cuda.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: How often a runner looks whether its parent is still there (seconds).
PARENT_POLL_S = 0.5


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised in the main thread (not an Exception: nothing that
    catches errors may swallow it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 130 for SIGINT, 143 for SIGTERM, as shells report."""
        return 128 + self.signum


class _State:
    """The main thread's interrupt bookkeeping (only the main thread touches it)."""

    received: int | None = None  # the first signal since `interrupts`/`runner_lifeline`
    raised = False
    deferring = 0


_STATE = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    if _STATE.received is not None:
        return  # already stopping: let the cleanup run
    _STATE.received = signum
    if not _STATE.deferring:
        _STATE.raised = True
        raise Interrupted(signum)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` inside the block; the previous handlers
    come back on exit. A signal ignored when the block starts (SIG_IGN, as for a
    background job's SIGINT) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _STATE.received, _STATE.raised, _STATE.deferring = None, False, 0
    for sig in SIGNALS:
        if previous[sig] is not signal.SIG_IGN:
            signal.signal(sig, _handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _STATE.received = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal received inside the block raises `Interrupted` when the block ends
    (without `interrupts` around it, the block runs as it is)."""
    _STATE.deferring += 1
    try:
        yield
    finally:
        _STATE.deferring -= 1
        if not _STATE.deferring and _STATE.received is not None and not _STATE.raised:
            _STATE.raised = True
            raise Interrupted(_STATE.received)


def _exited(pid: int) -> bool:
    """Whether child `pid` has ended, without reaping it (its process group stays
    addressable while it is a zombie)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait(proc: subprocess.Popen[str], timeout: float, check: bool) -> bool:
    deadline = time.monotonic() + timeout
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            return False
        if check:
            check_stop()
        time.sleep(0.05)
    return True


def wait_exited(proc: subprocess.Popen[str], timeout: float) -> bool:
    """Whether `proc` ended within `timeout` seconds; it is left unreaped, so that
    `stop_group` can still address its process group. Raises `Interrupted` where a
    signal was received (`check_stop`)."""
    return _wait(proc, timeout, check=True)


def stop_group(proc: subprocess.Popen[str], grace: float) -> None:
    """Stop `proc`, the leader of a process group of its own, and everything in that
    group: SIGTERM to `proc` unless it ended, up to `grace` seconds for it to end,
    then SIGKILL to the group (what is left of it); `proc` is reaped on return."""
    if proc.returncode is None and not _exited(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        _wait(proc, grace, check=False)  # stopping already: no second interrupt here
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def check_stop() -> None:
    """Raise `Interrupted` again where a signal was received (outside a `deferred`
    section): an exception raised by a signal handler while a finalizer (`__del__`, a
    weakref callback) runs is printed and dropped, so a runner also checks at each step
    of its work, and the harness while it waits for a runner."""
    if _STATE.received is not None and not _STATE.deferring:
        _STATE.raised = True
        raise Interrupted(_STATE.received)


def _watch_parent(parent: int, grace: float) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)  # still here: the cluster did not close; end it and its workers
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def runner_lifeline(grace: float = 30.0) -> None:
    """In a runner: SIGTERM raises `Interrupted` in the main thread (once, or at the end
    of a `deferred` section; `check_stop` raises it again), and the process sends
    itself SIGTERM when its parent process is gone, then SIGKILL to itself (and its
    process group, where it leads one) if it is still running `grace` seconds later."""
    _STATE.received, _STATE.raised, _STATE.deferring = None, False, 0
    signal.signal(signal.SIGTERM, _handler)
    threading.Thread(
        target=_watch_parent,
        args=(os.getppid(), grace),
        daemon=True,
        name="cudask-bench-parent-watch",
    ).start()


def record_run(work: Callable[[], dict[str, Any]], path: str) -> int:
    """Run a runner's `work` and write {"status": "ok", "error": None, **its result} to
    `path` as JSON; an interrupt or an exception is recorded instead (status "failed",
    the error, and for an exception its traceback). Return the runner's exit code."""
    result: dict[str, Any] = {"status": "ok", "error": None}
    code = 0
    try:
        result.update(work())
    except Interrupted as exc:
        result.update(status="failed", error=f"stopped by {exc.name}")
        code = exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the parent needs the reason, not a crash
        result.update(
            status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()
        )
        code = 1
    with deferred(), open(path, "w") as fh:  # written whole: a signal now waits for it
        json.dump(result, fh, default=str)
    return code


def runner_main(
    parser: argparse.ArgumentParser,
    work: Callable[[argparse.Namespace], dict[str, Any]],
    argv: Sequence[str] | None = None,
) -> int:
    """A runner's whole `main`: `parser`, with `--json` (where the result goes) added here,
    parses `argv`; then `runner_lifeline` and `record_run` of `work(args)`."""
    parser.add_argument("--json", required=True, help="where to write the result")
    args = parser.parse_args(argv)
    runner_lifeline()
    return record_run(lambda: work(args), args.json)


__all__ = [
    "Interrupted",
    "check_stop",
    "deferred",
    "interrupts",
    "record_run",
    "runner_lifeline",
    "runner_main",
    "stop_group",
    "wait_exited",
]
