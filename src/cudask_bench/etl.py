"""`cudask bench etl`: dask-cuDF ETL beyond device memory, settings side by side.

Covers: `run_etl(plan, targets)`: a temporary data directory (removed at the end, also
when the command is interrupted or a child fails), the files and their reference
answers written by a child process (cudask_bench.etl_data), then per repetition, per
format, each setting in a fresh child process and cluster (cudask_bench.etl_run, through
cudask_bench.harness.spawn_runner: stopped with its workers past the timeout or on
SIGINT/SIGTERM), the settings' order rotated by one each repetition (`rotation`); a
setting that failed is not run again. Then the document: per format and setting, every
child's result with each run's answers checked against the reference, the cold figures
(first run of each fresh cluster: medians over repetitions of the total and each
phase, the largest peaks) and the warm ones (the runs after it), each setting's cold
and warm total over the floor's, for the settings with the device limit the bound on
each phase's peak (`bound`: the limit plus the largest task's inputs, output and, as
the floor's samples saw them, temporaries: cudask_bench.working_set) and whether the
peaks are within `SLACK` of it, its error (the first failure, never hidden); a line on
stdout as each child ends (`child_line`) and the document so far handed to a
`checkpoint` (the command writes it to --output, so an interrupted run keeps what
finished); and `summary`, the lines the command prints (a table per format, last).

Does not cover: the options and their checks (cudask_bench.cli.etl), the work itself
(cudask_bench.etl_run, cudask_bench.etl_phases). Threading: the command's thread;
spawn_runner reads each child's output in a daemon thread of its own.
"""

from __future__ import annotations

import copy
import datetime as _dt
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from dask.utils import format_bytes

from cudask_bench import environment, harness, stopping
from cudask_bench.etl_data import FACT_ROW_BYTES, EtlPlan, compare, setting_named
from cudask_bench.etl_phases import PHASES
from cudask_bench.limit import SLACK
from cudask_bench.targets import Target, make_shim, remove_shim

GB = 1e9


def rotation(settings: Sequence[str], repeat: int) -> list[list[str]]:
    """The order of the settings in each repetition: repetition r starts r places on."""
    n = len(settings)
    return [[settings[(r + i) % n] for i in range(n)] for r in range(repeat)] if n else []


def _spawn(
    plan: EtlPlan,
    target: Target,
    module: str,
    argv: list[str],
    shim: str | None,
    progress: harness.ProgressLine,
    position: str,
    label: str,
) -> dict[str, Any]:
    def on_progress(done: int, total: int, text: str) -> None:
        progress.update(position, label, done, total, text)

    progress.update(position, label, 0, 1, "starting")
    result = harness.spawn_runner(
        target,
        ["--plan", plan.to_json(), *argv],
        shim=shim,
        timeout=plan.timeout,
        on_progress=on_progress,
        module=module,
    )
    progress.end_line()
    print(child_line(position, label, result), flush=True)  # a run cut short shows how far it got
    return result


def child_line(position: str, label: str, result: Mapping[str, Any]) -> str:
    """One child's outcome as one line: each run's total and peak, or the error."""
    if result.get("status") != "ok":
        return f"[{position}] {label}: FAILED: {result.get('error')}"
    runs = [
        f"{r.get('kind')} FAILED: {r['error']}"
        if r.get("error")
        else f"{r.get('kind')} {_n(r.get('total_s'), 0)} s"
        + (f" (peak {r['peak_bytes'] / GB:.2f} GB)" if r.get("peak_bytes") is not None else "")
        for r in result.get("runs", [])
    ]
    return f"[{position}] {label}: " + (
        "; ".join(runs) + " (answers checked at the end)" if runs else "ok"
    )


def run_etl(
    plan: EtlPlan,
    targets: Mapping[str, Target],
    progress: harness.ProgressLine | None = None,
    argv: Sequence[str] = (),
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Write the data, run every setting on every format, return the document; after
    the data and after each child, hand `checkpoint` the document so far (status
    "partial", `failed_so_far`, no `finished_at`)."""
    progress = progress or harness.ProgressLine(False)
    run = _EtlRun(plan, targets, argv, checkpoint)
    local = Target(sys.executable)
    shim: str | None = None
    root = tempfile.mkdtemp(prefix="cudask-bench-etl-data-", dir=plan.data_dir)
    try:
        if any(t.foreign for t in targets.values()):
            with stopping.deferred():  # made and recorded, or not made
                shim = make_shim()
        run.data = _spawn(
            plan,
            local,
            "cudask_bench.etl_data",
            ["--root", root],
            None,
            progress,
            "data",
            "writing the files",
        )
        run.save()
        _run_settings(run, root, shim, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if shim is not None:
            remove_shim(shim)
    return run.document(run.results)


class _EtlRun:
    """What one `run_etl` has so far: the inputs of its document and the children's
    results (per format and setting, one per repetition that ran)."""

    def __init__(
        self,
        plan: EtlPlan,
        targets: Mapping[str, Target],
        argv: Sequence[str],
        checkpoint: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.plan, self.targets, self.argv, self.checkpoint = plan, targets, argv, checkpoint
        self.started, self.t0 = _dt.datetime.now(_dt.UTC), time.perf_counter()
        self.order = rotation(plan.settings, plan.repeat)
        self.env = harness_environment()
        self.results: dict[str, dict[str, list[dict[str, Any]]]] = {
            fmt: {name: [] for name in plan.settings} for fmt in plan.formats
        }
        self.data: dict[str, Any] = {}

    def document(self, results: Mapping[str, Mapping[str, list[Any]]]) -> dict[str, Any]:
        """The document of these children's results (`self.results` or a copy of it)."""
        return document(
            self.plan,
            self.data,
            results,
            self.order,
            self.targets,
            self.started,
            time.perf_counter() - self.t0,
            self.argv,
            self.env,
        )

    def save(self) -> None:
        """The document so far to `checkpoint`: status "partial", whether any failed."""
        if self.checkpoint is not None:
            doc = self.document(copy.deepcopy(self.results))
            doc.pop("finished_at")
            with stopping.deferred():  # handed over whole
                self.checkpoint(doc | {"status": "partial", "failed_so_far": doc["status"] != "ok"})


def _run_settings(
    run: _EtlRun, root: str, shim: str | None, progress: harness.ProgressLine
) -> None:
    """Each repetition's settings in their order, on every format, each in a child
    process of its own (cudask_bench.etl_run), the document saved after each. Nothing
    runs without the data, nor again after it failed (it would fail the same way)."""
    plan = run.plan
    total = plan.repeat * len(plan.formats) * len(plan.settings)
    done = 0
    for rep, names in enumerate(run.order):
        for fmt in plan.formats:
            for name in names:
                done += 1
                earlier = run.results[fmt][name]
                if run.data.get("status") != "ok" or (
                    earlier and earlier[-1].get("status") != "ok"
                ):
                    continue  # no data, or a setting that failed fails the same way again
                label = f"{name} {fmt}" + (f" (repetition {rep + 1})" if plan.repeat > 1 else "")
                earlier.append(
                    _spawn(
                        plan,
                        run.targets[setting_named(name).backend],
                        "cudask_bench.etl_run",
                        ["--root", root, "--setting", name, "--format", fmt],
                        shim,
                        progress,
                        f"{done}/{total}",
                        label,
                    )
                )
                run.save()


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _largest(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Median seconds (total and per phase) and largest peaks of completed runs."""
    done = [r for r in runs if not r.get("error")]
    if not done:
        return None
    return {
        "runs": len(done),
        "total_s": _median([r["total_s"] for r in done]),
        "phases_s": {
            p: _median([r["phases"].get(p, {}).get("seconds") for r in done]) for p in PHASES
        },
        "peak_bytes": _largest([r.get("peak_bytes") for r in done]),
        "phase_peak_bytes": {
            p: _largest([r["phases"].get(p, {}).get("peak_bytes") for r in done]) for p in PHASES
        },
        "phase_working_set_bytes": _phase_largest(done, "working_set_bytes"),
        "phase_working_set_nvml_bytes": _phase_largest(done, "working_set_nvml_bytes"),
    }


def _phase_largest(runs: Sequence[Mapping[str, Any]], field: str) -> dict[str, int | None]:
    return {p: _largest([r["phases"].get(p, {}).get(field) for r in runs]) for p in PHASES}


def bound(fig: dict[str, Any], limit: int, floor: Mapping[str, Any] | None = None) -> None:
    """Per phase, the bound on the peak and whether every phase's peak is within SLACK of
    it (unknown without NVML). The bound is the limit plus the phase's largest task: its
    inputs and output as sized in this run, or, where larger, its inputs, temporaries and
    output as NVML saw them in `floor`'s figures (the same work with no limit, where
    nothing spills: `_floor_tasks`, its cold and warm runs together; `working_set.growth`)."""
    own, peaks = fig.get("phase_working_set_bytes") or {}, fig["phase_peak_bytes"]
    seen = (floor or {}).get("phase_working_set_nvml_bytes") or {}
    tasks = {p: _largest([own.get(p), seen.get(p)]) for p in PHASES}
    fig["phase_task_bytes"] = tasks
    fig["phase_bound_bytes"] = {p: None if n is None else limit + n for p, n in tasks.items()}
    known = [
        (peaks[p], b)
        for p, b in fig["phase_bound_bytes"].items()
        if b is not None and peaks.get(p) is not None
    ]
    fig["within"] = all(peak <= SLACK * b for peak, b in known) if known else None


def _floor_tasks(floor: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The floor's largest tasks as NVML saw them, its cold and warm runs together (the
    same tasks: a clean sample before a task is rare, so each run sees few of them)."""
    figs = [f for f in ((floor or {}).get("cold"), (floor or {}).get("warm")) if f]
    if not figs:
        return None
    return {
        "phase_working_set_nvml_bytes": {
            p: _largest([(f.get("phase_working_set_nvml_bytes") or {}).get(p) for f in figs])
            for p in PHASES
        }
    }


def setting_entry(
    name: str, children: list[dict[str, Any]], reference: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One setting on one format: its children's results, each run checked."""
    setting = setting_named(name)
    entry: dict[str, Any] = {
        "setting": name,
        "description": setting.description,
        "backend": setting.backend,
        "status": "ok",
        "error": None,
        "children": children,
    }
    for child in children:
        for run in child.get("runs") or []:
            wrong = compare(reference, run.get("answers") or {}) if reference else ["no reference"]
            run["check"] = "error" if run.get("error") else ("right" if not wrong else wrong)
            if run["check"] != wrong:  # right (or no answers): the long parts add nothing
                for part in ("sample", "by_category"):
                    (run.get("answers") or {}).pop(part, None)
    failed = next((c for c in children if c.get("status") != "ok"), None)
    if failed is not None:
        entry.update(status="failed", error=str(failed.get("error") or "failed"))
    runs = [c.get("runs") or [] for c in children]
    entry["cold"] = figures([r[0] for r in runs if r])
    entry["warm"] = figures([run for r in runs for run in r[1:]])
    checked = [run["check"] for r in runs for run in r if run["check"] != "error"]
    entry["correct"] = bool(checked) and all(c == "right" for c in checked)
    return entry


def harness_environment() -> dict[str, Any]:
    """The machine and this process's library versions (about a second: read once a run)."""
    return {
        "machine": environment.machine(),
        "harness": {"python": sys.executable, "versions": environment.versions()},
    }


def document(
    plan: EtlPlan,
    data: Mapping[str, Any],
    results: Mapping[str, Mapping[str, list[Any]]],
    order: list[list[str]],
    targets: Mapping[str, Target],
    started: _dt.datetime,
    wall: float,
    argv: Sequence[str],
    env: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result document (before provenance: cudask_bench.report.write_json adds it);
    `env`: `harness_environment()`, read here when not given."""
    formats = data.get("formats") or {}
    out: dict[str, dict[str, Any]] = {}
    for fmt, by_name in results.items():
        reference = (formats.get(fmt) or {}).get("reference")
        out[fmt] = {
            name: setting_entry(name, children, reference)
            for name, children in by_name.items()
            if children
        }
        floor = out[fmt].get("floor")
        seen = _floor_tasks(floor)
        for entry in out[fmt].values():
            for mode in ("cold", "warm"):
                base = (floor or {}).get(mode)
                if setting_named(entry["setting"]).limited and entry.get(mode):
                    bound(entry[mode], plan.device_memory_limit, seen)
                mine = entry.get(mode)
                if mine and base and base["total_s"]:
                    mine["x_floor"] = mine["total_s"] / base["total_s"]
    entries = [e for by_name in out.values() for e in by_name.values()]
    ok = data.get("status") == "ok" and all(e["status"] == "ok" and e["correct"] for e in entries)
    return {
        "workload": "etl",
        "command": shlex.join(argv),
        "status": "ok" if ok else "failed",
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "wall_s": wall,
        "plan": asdict(plan),
        "order": order,
        "skipped": dict(plan.skipped),
        "data": dict(data),
        "targets": {
            b: {"python": t.python, "pythonpath": list(t.pythonpath)} for b, t in targets.items()
        },
        "results": out,
        **(env if env is not None else harness_environment()),
    }


def failures(doc: Mapping[str, Any]) -> list[str]:
    """ "setting format: why" for each setting that failed or answered wrong."""
    out = (
        []
        if (doc.get("data") or {}).get("status") == "ok"
        else [f"data: {(doc.get('data') or {}).get('error')}"]
    )
    for fmt, by_name in doc["results"].items():
        for name, e in by_name.items():
            if e["status"] != "ok" or not e["correct"]:
                out.append(f"{name} {fmt}: " + (e["error"] or "wrong answers"))
    return out


def _n(value: float | None, width: int, spec: str = ".2f", scale: float = 1.0) -> str:
    return f"{value / scale:>{width}{spec}}" if value is not None else " " * (width - 1) + "-"


def _row(name: str, e: Mapping[str, Any]) -> str:
    cold, warm = e.get("cold"), e.get("warm")
    cells = [f"{name:<21}"]
    if cold:
        cells += [_n(cold["total_s"], 7)] + [_n(cold["phases_s"][p], 7) for p in PHASES]
        cells += [_n(cold["peak_bytes"], 7, scale=GB), _n(cold.get("x_floor"), 7)]
    else:
        cells += [" " * 7] * (len(PHASES) + 3)
    if warm:
        cells += [
            _n(warm["total_s"], 7),
            _n(warm["peak_bytes"], 7, scale=GB),
            _n(warm.get("x_floor"), 7),
        ]
    else:
        cells += [" " * 7] * 3
    answer = (
        "right" if e["correct"] else ("-" if e["status"] != "ok" and not e.get("cold") else "WRONG")
    )
    text = " ".join(cells) + f"  {answer}"
    if e["status"] != "ok":
        text += f"\n{'':<21} failed: {str(e['error'])[:200]}"
    return text


def _yes(within: bool | None) -> str:
    return "-" if within is None else ("yes" if within else "NO")


def summary(doc: Mapping[str, Any]) -> list[str]:
    """The lines the command prints: per format, a header and a row per setting."""
    plan, data = doc["plan"], doc.get("data") or {}
    lines = []
    if data.get("status") != "ok":
        lines.append(f"data: not written: {data.get('error')}")
    limit = plan["device_memory_limit"]
    device = plan["files"] * plan["rows_per_file"] * FACT_ROW_BYTES
    for fmt, by_name in doc["results"].items():
        disk = ((data.get("formats") or {}).get(fmt) or {}).get("disk_bytes")
        lines.append(
            f"etl {fmt}: {plan['files']} files x {plan['rows_per_file']:,} rows, "
            f"{format_bytes(device)} on the device ({device / limit:.1f}x the "
            f"{format_bytes(limit)} limit)"
            + (f", {format_bytes(disk)} on disk" if disk else "")
            + f"; data by {data.get('generator', '?')}, frames {plan['frames']}"
            + ("; graphs fused (collection.optimize())" if plan.get("fuse") else "")
            + (
                " (distributed.LocalCluster standing in for every setting)"
                if plan["frames"] == "pandas"
                else ""
            )
        )
        lines.append(
            "  cold: first run of a fresh cluster from the first submit (median of "
            f"{plan['repeat']}); warm: the {plan['warm_runs']} run(s) after it; peak: "
            "NVML used above the idle cluster, GB"
        )
        lines.append(
            f"{'setting':<21} {'cold s':>7} "
            + " ".join(f"{p:>7}" for p in PHASES)
            + f" {'peak':>7} {'x floor':>7} {'warm s':>7} {'peak':>7} {'x floor':>7}"
            + "  answers"
        )
        lines += [_row(name, e) for name, e in by_name.items()]
        verdicts = [
            f"{name} {_yes((e.get('cold') or {}).get('within'))}/"
            f"{_yes((e.get('warm') or {}).get('within'))}"
            for name, e in by_name.items()
            if setting_named(name).limited
        ]
        if verdicts:
            lines.append(
                f"  peak within {SLACK:.2f}x (limit + the largest task's inputs, output "
                "and, as NVML saw them with no limit, temporaries) in every phase, "
                "cold/warm: " + ", ".join(verdicts)
            )
    if doc.get("skipped"):
        lines += [f"skipped {name}: {why}" for name, why in doc["skipped"].items()]
    return lines


__all__ = ["document", "failures", "figures", "rotation", "run_etl", "setting_entry", "summary"]
