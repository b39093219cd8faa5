"""The side-by-side harness: spawn one runner per variant, collect, compare, report.

Covers: where each backend runs (this interpreter for cudask and the dict
baseline; this or another interpreter, or this one with an extra PYTHONPATH
directory, for dask-cuda), checking those environments before any benchmark
process starts, spawning `python -m cudask.bench.run` per variant (per
repetition for `startup` and cold-mode `spill`/`cupy`, whose every measurement
is a fresh process; the variants take turns either way), a progress line on
stderr, merging runner results into one JSON document with machine facts and
versions, the ratios cudask / reference measured in the same run, and a text
table.

Does not cover: the workloads (cudask.bench.workloads), the runner
(cudask.bench.run), charts (cudask.bench.chart), click options (cudask.cli.bench).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from cudask.bench import environment, spec
from cudask.bench.workloads import summarize
from cudask.errors import MissingDependencyError, OptionError

CUPY_INSTALL = "pip install cupy-cuda13x (or: pip install 'cudask[cuda]')"


@dataclasses.dataclass(frozen=True)
class Target:
    """An interpreter (and PYTHONPATH additions) that runs a backend's runner."""

    python: str
    pythonpath: tuple[str, ...] = ()
    probe: Mapping[str, Any] | None = None

    def env(self, shim: str | None) -> dict[str, str]:
        env = dict(os.environ)
        parts = [p for p in (*self.pythonpath, shim) if p]
        if parts:
            existing = env.get("PYTHONPATH")
            env["PYTHONPATH"] = os.pathsep.join(parts + ([existing] if existing else []))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    @property
    def foreign(self) -> bool:
        """Whether cudask must be put on this interpreter's path (it is not ours)."""
        return os.path.realpath(self.python) != os.path.realpath(sys.executable)


def package_root() -> Path:
    """The directory that holds the `cudask` package."""
    import cudask

    return Path(cudask.__file__).resolve().parent


def make_shim() -> str:
    """A temp directory holding only a `cudask` link, for another interpreter's PYTHONPATH.

    Putting the directory that contains cudask on PYTHONPATH could expose other
    packages installed next to it (site-packages) to a different Python; the
    link exposes cudask alone.
    """
    shim = tempfile.mkdtemp(prefix="cudask-bench-path-")
    os.symlink(package_root(), os.path.join(shim, "cudask"))
    return shim


def check_dask_cuda_paths(python: str | None, path: str | None) -> Target:
    """Check --dask-cuda-python / --dask-cuda-path exist (no process started)."""
    if python is not None:
        resolved = python if os.sep in python else _which(python)
        if resolved is None or not os.path.exists(resolved):
            raise OptionError(
                f"--dask-cuda-python={python!r} does not exist; give the path of a Python "
                "interpreter where dask-cuda is installed, e.g. --dask-cuda-python "
                "/opt/dask-cuda-26.10/bin/python"
            )
        if os.path.isdir(resolved) or not os.access(resolved, os.X_OK):
            raise OptionError(
                f"--dask-cuda-python={python!r} is not an executable file; give the path of "
                "a Python interpreter, e.g. /opt/dask-cuda-26.10/bin/python"
            )
        python = resolved
    extra: tuple[str, ...] = ()
    if path is not None:
        if not os.path.isdir(path):
            raise OptionError(
                f"--dask-cuda-path={path!r} is not a directory; give a directory where "
                "dask-cuda is installed (pip install --target DIR dask-cuda-cu13)"
            )
        extra = (os.path.abspath(path),)
    return Target(python or sys.executable, extra)


def resolve_dask_cuda(
    python: str | None, path: str | None, *, jit_unspill: bool, array_module: str
) -> Target:
    """Check the dask-cuda environment before any benchmark starts; raise a one-line error.

    Runs a stdlib-only probe in that interpreter (it imports neither dask-cuda
    nor CuPy) to learn what is installed there and which dask-cuda version.
    """
    target = check_dask_cuda_paths(python, path)
    extra = target.pythonpath
    try:
        facts = environment.probe_python(target.python, target.env(None))
    except RuntimeError as exc:
        raise OptionError(f"--dask-cuda-python: {exc}") from None
    where = f"{target.python}" + (f" with PYTHONPATH {extra[0]}" if extra else "")
    found = facts.get("found", {})
    if not found.get("dask_cuda"):
        hint = (
            "give --dask-cuda-python PATH (a Python where dask-cuda is installed) or "
            "--dask-cuda-path DIR"
            if python is None and path is None
            else "install dask-cuda there"
        )
        raise MissingDependencyError("dask-cuda", f"--against dask-cuda (in {where})", hint)
    for module in ("dask", "distributed"):
        if not found.get(module, True):
            raise MissingDependencyError(
                module, f"--against dask-cuda (in {where})", f"pip install {module}"
            )
    if array_module == "cupy" and not found.get("cupy"):
        raise MissingDependencyError("cupy", f"--against dask-cuda (in {where})", CUPY_INSTALL)
    version = facts.get("versions", {}).get("dask_cuda")
    if jit_unspill and not environment.dask_cuda_has_jit_unspill(
        version, facts.get("dask_cuda_has_proxy_object")
    ):
        raise OptionError(
            f"--jit-unspill against dask-cuda {version} (in {where}): dask-cuda removed "
            "JIT-unspill in 26.06; point --dask-cuda-python at an environment with "
            "dask-cuda 26.04, or use --jit-unspill off (or --against-jit-unspill off)"
        )
    return dataclasses.replace(target, probe=facts)


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def check_local(backends: Sequence[str], array_module: str) -> None:
    """Check this interpreter can run the local backends; raise a one-line error."""
    if (
        array_module == "cupy"
        and {"cudask", "dict"} & set(backends)
        and not environment.has_module("cupy")
    ):
        raise MissingDependencyError("cupy", "cudask bench (--array-module cupy)", CUPY_INSTALL)


# --------------------------------------------------------------------------- progress


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

    def finish(self, text: str) -> None:
        if not self.enabled:
            return
        pad = max(0, self._last - len(text))
        self.stream.write("\r" + text + " " * pad + "\n")
        self.stream.flush()
        self._last = 0


# --------------------------------------------------------------------------- spawning


def spawn_runner(
    target: Target,
    argv: Sequence[str],
    *,
    shim: str | None,
    timeout: float,
    on_progress: Callable[[int, int, str], None],
) -> dict[str, Any]:
    """Run one runner process; return its JSON result (or a failed one saying why)."""
    fd, json_path = tempfile.mkstemp(prefix="cudask-bench-", suffix=".json")
    os.close(fd)
    os.unlink(json_path)
    cmd = [target.python, "-m", "cudask.bench.run", *argv, "--json", json_path]
    tail: collections.deque[str] = collections.deque(maxlen=40)
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=target.env(shim if target.foreign else None),
        text=True,
        bufsize=1,
        start_new_session=True,  # its workers share its process group: one kill ends all
    )

    def read() -> None:
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

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    reader.join(timeout=10)
    wall = time.perf_counter() - started
    result: dict[str, Any]
    try:
        with open(json_path) as fh:
            result = json.load(fh)
        os.unlink(json_path)
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


def _kill_group(proc: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


# --------------------------------------------------------------------------- assembly


def merge_runs(
    variant: spec.Variant, target: Target, runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One variant's entry from its runner results (several for `startup`)."""
    entry: dict[str, Any] = {
        **variant.describe(),
        "python": target.python,
        "pythonpath": list(target.pythonpath),
        "status": "ok",
        "error": None,
        "runs": len(runs),
        "process_wall_s": [r.get("process_wall_s") for r in runs],
        "pids": [r.get("pid") for r in runs],
        "commands": sorted({str(r.get("command")) for r in runs if r.get("command")}),
    }
    failed = [r for r in runs if r.get("status") != "ok"]
    if failed:
        entry["status"] = "failed"
        entry["error"] = str(failed[0].get("error") or "failed")
        for key in ("traceback", "log_tail"):
            if failed[0].get(key):
                entry[key] = failed[0][key]
    first = next((r for r in runs if r.get("status") == "ok"), runs[0] if runs else {})
    for key in (
        "versions", "worker_versions", "worker", "cluster", "store", "stores", "cudask_modules"
    ):
        if key in first:
            entry[key] = first[key]
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        for name, m in (run.get("measurements") or {}).items():
            slot = merged.setdefault(
                name,
                {
                    "unit": m.get("unit", "s"),
                    "times": [],
                    "warmup_times": [],
                    "bytes": m.get("bytes"),
                    "parameters": m.get("parameters", {}),
                    "status": "ok",
                    "error": None,
                    "check": m.get("check"),
                },
            )
            slot["times"].extend(m.get("times") or [])
            slot["warmup_times"].extend(m.get("warmup_times") or [])
            if m.get("status", "ok") != "ok" and slot["status"] == "ok":
                slot["status"], slot["error"] = "failed", m.get("error")
    entry["measurements"] = {k: summarize(v) for k, v in merged.items()}
    return entry


def _median(entry: Mapping[str, Any], metric: str) -> float | None:
    m = (entry.get("measurements") or {}).get(metric)
    if not m or m.get("status") != "ok" or entry.get("status") != "ok":
        return None
    value = m.get("median")
    return float(value) if value else None


def comparisons(variants: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ratios variant / reference of median seconds, for pairs measured in this run.

    Pairs: cudask vs dask-cuda with the same device limit and JIT-unspill;
    cudask with no device limit vs the plain dict store; JIT-unspill on vs off
    within one backend and limit. ratio < 1 means the variant is faster;
    speedup = 1 / ratio.
    """
    by_key = {
        (v["backend"], json.dumps(v["device_memory_limit"]), v["jit_unspill"]): v for v in variants
    }
    pairs: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
    for v in variants:
        limit = json.dumps(v["device_memory_limit"])
        if v["backend"] == "cudask":
            ref = by_key.get(("dask-cuda", limit, v["jit_unspill"]))
            if ref is not None:
                pairs.append(("vs dask-cuda", v, ref))
            if v["device_memory_limit"] is None and not v["jit_unspill"]:
                ref = by_key.get(("dict", "null", False))
                if ref is not None:
                    pairs.append(("vs dict store", v, ref))
        if v["jit_unspill"] and v["backend"] != "dict":
            ref = by_key.get((v["backend"], limit, False))
            if ref is not None:
                pairs.append(("jit-unspill vs plain", v, ref))
    out: list[dict[str, Any]] = []
    for kind, v, ref in pairs:
        metrics = [m for m in (v.get("measurements") or {}) if m in (ref.get("measurements") or {})]
        for metric in metrics:
            a, b = _median(v, metric), _median(ref, metric)
            if a is None or b is None:
                continue
            out.append(
                {
                    "kind": kind,
                    "metric": metric,
                    "variant": v["name"],
                    "reference": ref["name"],
                    "variant_s": a,
                    "reference_s": b,
                    "ratio": a / b,
                    "speedup": b / a,
                }
            )
    return out


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1000:.2f} ms"
    return f"{value:.3f} s"


def _mode_lines(parameters: Mapping[str, Any]) -> list[str]:
    """What the figures are, for a spill or cupy document (none for startup)."""
    mode = parameters.get("mode")
    if mode not in spec.MODE_DESCRIPTIONS:
        return []
    line = f"{mode}: {spec.MODE_DESCRIPTIONS[mode]}"
    if mode == "cold":
        runs = parameters.get("warm_runs")
        line += (f"; *{spec.WARM_SUFFIX}: the next {runs} run{'' if runs == 1 else 's'} "
                 "in the same cluster")
        if parameters.get("operations"):
            line += (f"; *{spec.INPUT_SUFFIX}: creating the input, *{spec.TOTAL_SUFFIX}: "
                     "input + operation")
    return [line]


def format_table(document: Mapping[str, Any]) -> str:
    """A plain-text report: medians per metric and variant, then ratios, then failures."""
    variants = document["variants"]
    metrics = spec.ordered_metrics(variants)
    names = [v["name"] for v in variants]
    rows = [["metric (median)", *names]]
    for metric in metrics:
        row = [metric]
        for v in variants:
            m = (v.get("measurements") or {}).get(metric)
            if m is None:
                row.append("failed" if v.get("status") != "ok" else "-")
            elif m.get("status") != "ok":
                row.append("failed")
            else:
                cell = fmt_seconds(m.get("median"))
                if m.get("gbps"):
                    cell += f" ({m['gbps']:.1f} GB/s)"
                row.append(cell)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    gpu = document.get("machine", {}).get("gpu_used") or {}
    header = f"cudask bench {document['workload']}"
    if gpu.get("name"):
        header += f" on {gpu['name']}"
    lines[:0] = [header, *_mode_lines(document.get("parameters") or {})]
    found = document.get("comparisons")
    pairs = comparisons(variants) if found is None else found
    if pairs:
        lines.append("")
        lines.append("ratios (variant / reference, same run; < 1 is faster):")
        for c in pairs:
            lines.append(
                f"  {c['metric']}: {c['variant']} {fmt_seconds(c['variant_s'])} / "
                f"{c['reference']} {fmt_seconds(c['reference_s'])} = {c['ratio']:.3f} "
                f"({c['speedup']:.2f}x)"
            )
    failures = [v for v in variants if v.get("status") != "ok"]
    if failures:
        lines.append("")
        for v in failures:
            lines.append(f"FAILED {v['name']}: {v.get('error')}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run


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


def execute(plan: Plan, progress: ProgressLine) -> dict[str, Any]:
    """Run every variant of `plan` in its own process(es) and assemble the result document."""
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.perf_counter()
    machine = environment.machine()
    machine["gpu_used"] = _gpu_used(machine, str(plan.runner_options.get("device", "0")))
    shim = make_shim() if any(t.foreign for t in plan.targets.values()) else None
    entries: list[dict[str, Any]] = []
    count = len(plan.variants)

    def run_once(index: int, label: str, warmup: int, repeat: int) -> dict[str, Any]:
        variant = plan.variants[index]
        position = f"{index + 1}/{count}"
        argv = spec.runner_argv(
            variant, plan.workload, repeat=repeat, warmup=warmup, **plan.runner_options
        )

        def on_progress(done: int, total: int, text: str) -> None:
            progress.update(position, label, done, total, text)

        progress.update(position, label, 0, 1, "starting")
        return spawn_runner(plan.targets[variant.backend], argv, shim=shim,
                            timeout=plan.timeout, on_progress=on_progress)

    def finish(index: int, runs: list[dict[str, Any]]) -> None:
        variant = plan.variants[index]
        entry = merge_runs(variant, plan.targets[variant.backend], runs)
        entries.append(entry)
        status = "ok" if entry["status"] == "ok" else f"FAILED: {entry['error']}"
        progress.finish(f"[{index + 1}/{count}] {variant.name}: {status}")

    rounds = plan_rounds(plan)
    try:
        runs: list[list[dict[str, Any]]] = [[] for _ in plan.variants]
        for number, (warmup, repeat) in enumerate(rounds):
            for index, variant in enumerate(plan.variants):
                if runs[index] and runs[index][-1].get("status") != "ok":
                    continue  # a failing configuration fails the same way again
                label = variant.name if len(rounds) == 1 else (
                    f"{variant.name} process {number + 1}/{len(rounds)}")
                runs[index].append(run_once(index, label, warmup, repeat))
        for index in range(count):
            finish(index, runs[index])
    finally:
        if shim is not None:
            try:
                os.unlink(os.path.join(shim, "cudask"))
                os.rmdir(shim)
            except OSError:
                pass
    document: dict[str, Any] = {
        "format": spec.RESULT_FORMAT,
        "workload": plan.workload,
        "command": shlex.join(plan.argv),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - t0,
        "machine": machine,
        "harness": {"python": sys.executable, "versions": environment.versions()},
        "parameters": {**plan.parameters, "repeat": plan.repeat, "warmup": plan.warmup,
                       "processes": len(rounds)},
        "variants": entries,
    }
    document["comparisons"] = comparisons(entries)
    document["status"] = "ok" if all(e["status"] == "ok" for e in entries) else "failed"
    return document


def write_json(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(document, fh, indent=1, default=str)
        fh.write("\n")


__all__ = [
    "Plan",
    "ProgressLine",
    "Target",
    "check_local",
    "comparisons",
    "execute",
    "format_table",
    "make_shim",
    "merge_runs",
    "package_root",
    "plan_rounds",
    "resolve_dask_cuda",
    "spawn_runner",
    "write_json",
]
