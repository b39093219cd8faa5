"""The side-by-side harness: spawn one runner per variant and assemble the result.

Covers: spawning `python -m cudask_bench.run` per variant (per repetition for `startup`
and cold-mode `spill`/`cupy`, whose every measurement is a fresh process; the variants
take turns either way, `plan_rounds`), or of another runner module (`spawn_runner`'s
`module`: `cudask bench etl`'s; cudask_bench.transfer_case, one per transfer case), each
in a temporary directory of its own, removed after it; stopping a runner with its workers
past its timeout or when the command is interrupted (cudask_bench.stopping); a progress
line on stderr; and `execute(plan)`, which returns the result document
(cudask_bench.report) with machine facts and versions, and, for `spill`, the disk
figures of the filesystem the runners' workers spill to, measured first
(cudask_bench.disk). Does not cover: where runners run (cudask_bench.targets), the
workloads (cudask_bench.workloads), the runner (cudask_bench.run), charts, click options
(cudask_bench.cli). Threading: called from the command's thread; each runner's output
is read by one daemon thread of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from dask.utils import format_bytes

from cudask_bench import disk, environment, spec, stopping
from cudask_bench.report import add_disk_ratios, comparisons, merge_runs
from cudask_bench.targets import Target, make_shim, remove_shim


class ProgressLine:
    """A one-line progress display on a terminal stream (or silent when disabled)."""

    def __init__(self, enabled: bool, stream: IO[str] | None = None, width: int = 24) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.started = time.monotonic()
        self._last = 0

    def render(self, position: str, variant: str, done: int, total: int, label: str) -> str:
        fraction = min(1.0, done / total) if total else 0.0
        filled = round(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.started
        return f"[{position}] {variant}: [{bar}] {done}/{total} {label} ({elapsed:.0f} s)"

    def update(self, position: str, variant: str, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        text = self.render(position, variant, done, total, label)
        pad = max(0, self._last - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._last = len(text)

    def end_line(self) -> None:
        """End a line left open (before a message of someone else's)."""
        if self.enabled and self._last:
            self.stream.write("\n")
            self.stream.flush()
            self._last = 0

    def finish(self, text: str) -> None:
        if not self.enabled:
            return
        pad = max(0, self._last - len(text))
        self.stream.write("\r" + text + " " * pad + "\n")
        self.stream.flush()
        self._last = 0


#: Seconds a runner gets to close its cluster after SIGTERM, before SIGKILL to its group.
STOP_GRACE_S = 15.0


def spawn_runner(
    target: Target,
    argv: Sequence[str],
    *,
    shim: str | None,
    timeout: float,
    on_progress: Callable[[int, int, str], None],
    module: str = "cudask_bench.run",
) -> dict[str, Any]:
    """Run one runner process (`python -m MODULE ARGV --json PATH`, cudask_bench.run
    unless another `module` is named); return its JSON result (or a failed one saying
    why).

    The runner gets a temporary directory of its own as TMPDIR (its result file, its
    cluster's local directory, whatever it and its workers put in temporary files),
    removed on return. It leads a process group, which its workers join; past
    `timeout`, or when an exception such as `stopping.Interrupted` ends the wait, the
    runner and its group are stopped (`stopping.stop_group`) before this returns or
    raises.
    """
    workdir = tempfile.mkdtemp(prefix="cudask-bench-run-")
    try:
        return _run_in(
            workdir,
            target,
            argv,
            shim=shim,
            timeout=timeout,
            on_progress=on_progress,
            module=module,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(
    workdir: str,
    target: Target,
    argv: Sequence[str],
    *,
    shim: str | None,
    timeout: float,
    on_progress: Callable[[int, int, str], None],
    module: str,
) -> dict[str, Any]:
    json_path = os.path.join(workdir, "result.json")
    cmd = [target.python, "-m", module, *argv, "--json", json_path]
    env = {**target.env(shim if target.foreign else None), "TMPDIR": workdir}
    tail: collections.deque[str] = collections.deque(maxlen=40)
    started = time.perf_counter()
    with stopping.deferred():  # an interrupt waits until the process is ours to stop
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            bufsize=1,
            start_new_session=True,  # its workers share its process group: one kill ends all
        )
    timed_out = False
    try:
        reader = threading.Thread(target=_read, args=(proc, tail, on_progress), daemon=True)
        reader.start()
        timed_out = not stopping.wait_exited(proc, timeout)
    finally:
        stopping.stop_group(proc, STOP_GRACE_S)
    reader.join(timeout=10)
    wall = time.perf_counter() - started
    result: dict[str, Any]
    try:
        with open(json_path) as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        why = (
            f"timed out after {timeout:.0f} s"
            if timed_out
            else f"runner exited with status {proc.returncode} without a result: {last}"
        )
        result = {"status": "failed", "error": why, "measurements": {}}
    if timed_out:
        result.update(status="failed", error=f"timed out after {timeout:.0f} s")
    result["returncode"] = proc.returncode
    result["process_wall_s"] = wall
    result["command"] = shlex.join(cmd[:-2])
    if result.get("status") != "ok":
        result["log_tail"] = list(tail)
    return result


def _read(
    proc: subprocess.Popen[str],
    tail: collections.deque[str],
    on_progress: Callable[[int, int, str], None],
) -> None:
    """A runner's output: progress events to `on_progress`, other lines to `tail`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(spec.PROGRESS_PREFIX):
            try:
                event = json.loads(line[len(spec.PROGRESS_PREFIX) :])
                on_progress(int(event["done"]), int(event["total"]), str(event["label"]))
            except (ValueError, KeyError, TypeError):
                tail.append(line.rstrip())
        else:
            tail.append(line.rstrip())


@dataclasses.dataclass
class Plan:
    """Everything a `cudask bench` command decided before starting a process."""

    workload: str
    variants: list[spec.Variant]
    targets: dict[str, Target]
    runner_options: dict[str, Any]
    repeat: int
    warmup: int
    parameters: dict[str, Any]
    processes: int = 1  # warm mode: per variant, taking turns (see plan_rounds)
    timeout: float = 3600.0
    argv: list[str] = dataclasses.field(default_factory=list)
    disk_size: int = 0  # bytes of the disk measurement before the variants; 0: none


def _gpu_used(machine: Mapping[str, Any], device: str) -> dict[str, Any] | None:
    for entry in machine.get("gpus", {}).get("devices", []):
        if str(entry.get("index")) == device or entry.get("uuid") == device:
            return dict(entry)
    return None


def plan_rounds(plan: Plan) -> list[tuple[int, int]]:
    """(warm-ups, measured repetitions) of each process a variant runs, in order.

    The rounds go through the variants in turn, so drift on the machine (caches
    warming up, clocks) falls on every variant alike rather than on whichever
    runs first. In startup and cold mode every repetition is a fresh process,
    the warm-ups included; in warm mode each of the `processes` makes the
    warm-ups and repetitions itself.
    """
    if spec.process_per_repetition(plan.workload, plan.runner_options.get("mode")):
        return [(1, 0)] * plan.warmup + [(0, 1)] * plan.repeat
    return [(plan.warmup, plan.repeat)] * plan.processes


def measure_disk(size: int, progress: ProgressLine) -> dict[str, Any]:
    """The disk figures (cudask_bench.disk) in a directory beside the runners' own, on
    the filesystem their workers spill to; the directory is removed after."""
    progress.update("disk", "sequential write and read", 0, 1, format_bytes(size))
    directory = tempfile.mkdtemp(prefix="cudask-bench-disk-")
    try:
        result = disk.measure(directory, size)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    progress.finish(f"[disk] {disk.summary(result)}")
    return result


def execute(plan: Plan, progress: ProgressLine) -> dict[str, Any]:
    """Run every variant of `plan` in its own process(es) and assemble the result document."""
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.perf_counter()
    machine = environment.machine()
    machine["gpu_used"] = _gpu_used(machine, str(plan.runner_options.get("device", "0")))
    shim: str | None = None
    rounds = plan_rounds(plan)
    measured_disk = measure_disk(plan.disk_size, progress) if plan.disk_size else None
    try:
        if any(t.foreign for t in plan.targets.values()):
            with stopping.deferred():  # made and recorded, or not made
                shim = make_shim()
        runs = _run_rounds(plan, rounds, shim, progress)
        entries = [_finish(plan, index, runs[index], progress) for index in range(len(runs))]
    finally:
        if shim is not None:
            remove_shim(shim)
    return _document(plan, started, t0, machine, len(rounds), entries, measured_disk)


def _run_rounds(
    plan: Plan, rounds: list[tuple[int, int]], shim: str | None, progress: ProgressLine
) -> list[list[dict[str, Any]]]:
    """Each variant's runner results: per round, one process of every variant in turn; a
    variant whose last process failed runs no more (it would fail the same way again)."""
    runs: list[list[dict[str, Any]]] = [[] for _ in plan.variants]
    for number, (warmup, repeat) in enumerate(rounds):
        for index, variant in enumerate(plan.variants):
            if runs[index] and runs[index][-1].get("status") != "ok":
                continue  # a failing configuration fails the same way again
            label = (
                variant.name
                if len(rounds) == 1
                else (f"{variant.name} process {number + 1}/{len(rounds)}")
            )
            runs[index].append(_run_once(plan, index, label, warmup, repeat, shim, progress))
    return runs


def _run_once(
    plan: Plan,
    index: int,
    label: str,
    warmup: int,
    repeat: int,
    shim: str | None,
    progress: ProgressLine,
) -> dict[str, Any]:
    """One runner process of variant `index`: `warmup` unmeasured repetitions, then
    `repeat` measured ones, its progress shown as `label`."""
    variant = plan.variants[index]
    position = f"{index + 1}/{len(plan.variants)}"
    argv = spec.runner_argv(
        variant, plan.workload, repeat=repeat, warmup=warmup, **plan.runner_options
    )

    def on_progress(done: int, total: int, text: str) -> None:
        progress.update(position, label, done, total, text)

    progress.update(position, label, 0, 1, "starting")
    return spawn_runner(
        plan.targets[variant.backend],
        argv,
        shim=shim,
        timeout=plan.timeout,
        on_progress=on_progress,
    )


def _finish(
    plan: Plan, index: int, runs: list[dict[str, Any]], progress: ProgressLine
) -> dict[str, Any]:
    """Variant `index`'s entry from its runs (cudask_bench.report.merge_runs), its
    outcome shown as the progress line's last."""
    variant = plan.variants[index]
    entry = merge_runs(variant, plan.targets[variant.backend], runs)
    status = "ok" if entry["status"] == "ok" else f"FAILED: {entry['error']}"
    progress.finish(f"[{index + 1}/{len(plan.variants)}] {variant.name}: {status}")
    return entry


def _document(
    plan: Plan,
    started: _dt.datetime,
    t0: float,
    machine: dict[str, Any],
    processes: int,
    entries: list[dict[str, Any]],
    measured_disk: dict[str, Any] | None,
) -> dict[str, Any]:
    """The result document: the command, the times, the machine, the harness's versions,
    the parameters, every variant's entry, the disk figures and the comparisons."""
    document: dict[str, Any] = {
        "format": spec.RESULT_FORMAT,
        "workload": plan.workload,
        "command": shlex.join(plan.argv),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - t0,
        "machine": machine,
        "harness": {"python": sys.executable, "versions": environment.versions()},
        "parameters": {
            **plan.parameters,
            "repeat": plan.repeat,
            "warmup": plan.warmup,
            "processes": processes,
        },
        "variants": entries,
    }
    if measured_disk is not None:
        document["disk"] = measured_disk
        add_disk_ratios(entries, disk.reference(measured_disk))
    document["comparisons"] = comparisons(entries)
    document["status"] = "ok" if all(e["status"] == "ok" for e in entries) else "failed"
    return document


__all__ = ["Plan", "ProgressLine", "execute", "measure_disk", "plan_rounds", "spawn_runner"]
