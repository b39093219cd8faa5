"""A `cudask bench` result document: one entry per variant, ratios, a text table, JSON.

Covers: merging a variant's runner results (one per process) into its entry with
medians (`merge_runs`), the ratios variant / reference of pairs measured in the same run
(`comparisons`: cudask against dask-cuda, cudask with no limit against the dict store,
JIT-unspill on against off), each pass's disk rates against the disk's own figures
(`add_disk_ratios`), the plain-text table a command prints, and writing the
JSON file, stamped with its provenance (cudask_bench.provenance: commit, configuration,
versions, cold or warm per figure). Does not cover: running anything
(cudask_bench.harness), charts (cudask_bench.chart). Pure functions over plain data but
`write_json`, which runs git; no threads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cudask_bench import disk, provenance, spec
from cudask_bench.measure import summarize
from cudask_bench.targets import Target


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
        "versions",
        "worker_versions",
        "worker",
        "cluster",
        "store",
        "stores",
        "cudask_modules",
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
                    "disk_traffic": [],
                },
            )
            slot["times"].extend(m.get("times") or [])
            slot["warmup_times"].extend(m.get("warmup_times") or [])
            traffic = m.get("disk_traffic") or []
            # aligned with the times: a run without counters leaves the traffic out
            slot["disk_traffic"].extend(traffic or [{}] * len(m.get("times") or []))
            if m.get("status", "ok") != "ok" and slot["status"] == "ok":
                slot["status"], slot["error"] = "failed", m.get("error")
    for slot in merged.values():
        if not any(slot["disk_traffic"]):
            del slot["disk_traffic"]
    entry["measurements"] = {k: summarize(v) for k, v in merged.items()}
    return entry


def add_disk_ratios(
    variants: Sequence[Mapping[str, Any]], reference: Mapping[str, Any] | None
) -> None:
    """Each measurement's disk rates as a fraction of the disk's own sequential figures
    (cudask_bench.disk.reference), in its "disk" entry: `write_vs_disk`, `read_vs_disk`,
    and which figures (`disk_method`)."""
    if reference is None:
        return
    for v in variants:
        for m in (v.get("measurements") or {}).values():
            traffic = m.get("disk")
            if not traffic:
                continue
            for rate, name, ref in (
                ("write_GBps", "write_vs_disk", "write_GBps"),
                ("read_GBps", "read_vs_disk", "read_GBps"),
            ):
                value, against = traffic.get(rate), reference.get(ref)
                traffic[name] = value / against if value is not None and against else None
            traffic["disk_method"] = reference["method"]


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
        line += (
            f"; *{spec.WARM_SUFFIX}: the next {runs} run{'' if runs == 1 else 's'} "
            "in the same cluster"
        )
        if parameters.get("operations"):
            line += (
                f"; *{spec.INPUT_SUFFIX}: creating the input, *{spec.TOTAL_SUFFIX}: "
                "input + operation"
            )
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
    lines = _grid(rows)
    gpu = document.get("machine", {}).get("gpu_used") or {}
    header = f"cudask bench {document['workload']}"
    if gpu.get("name"):
        header += f" on {gpu['name']}"
    lines[:0] = [header, *_mode_lines(document.get("parameters") or {})]
    lines += _disk_lines(document)
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


def _grid(rows: list[list[str]]) -> list[str]:
    """`rows` as aligned columns, a rule under the first."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _decimal_bytes(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n:.0f} B"


def _traffic_cell(traffic: Mapping[str, Any]) -> str:
    """'w 12.10 GB 1.52 GB/s (0.74x), r 105 B': bytes written and read in the pass and,
    from a megabyte on, their rates over it and their fractions of the disk's own
    figures."""
    parts = []
    for label, nbytes, rate, ratio in (
        ("w", "written_bytes", "write_GBps", "write_vs_disk"),
        ("r", "read_bytes", "read_GBps", "read_vs_disk"),
    ):
        n = traffic.get(nbytes)
        if n is None:
            continue
        text = f"{label} {_decimal_bytes(n)}"
        if n >= 1e6 and traffic.get(rate):
            text += f" {traffic[rate]:.2f} GB/s"
            if traffic.get(ratio) is not None:
                text += f" ({traffic[ratio]:.2f}x)"
        parts.append(text)
    return ", ".join(parts) or "-"


def _disk_lines(document: Mapping[str, Any]) -> list[str]:
    """The disk's own figures and, per pass and variant, the worker's disk I/O."""
    result = document.get("disk")
    lines = ["", disk.summary(result)] if result else []
    variants = document["variants"]

    def traffic(v: Mapping[str, Any], metric: str) -> Mapping[str, Any] | None:
        return ((v.get("measurements") or {}).get(metric) or {}).get("disk")

    metrics = [m for m in spec.ordered_metrics(variants) if any(traffic(v, m) for v in variants)]
    if not metrics:
        return lines
    ref = disk.reference(result)
    method = "O_DIRECT" if ref and ref["method"] == "direct" else "buffered"
    against = f"; (x): of the disk's {method} figure" if ref else ""
    heading = (
        "worker's disk I/O per pass (median; w: written, r: read, through system "
        f"calls; GB/s over the pass{against}):"
    )
    lines += ["", heading]
    rows = [["pass", *[v["name"] for v in variants]]]
    for metric in metrics:
        rows.append(
            [metric, *[_traffic_cell(t) if (t := traffic(v, metric)) else "-" for v in variants]]
        )
    return lines + _grid(rows)


def write_json(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write `document` to `path` with its provenance added (`provenance.write`)."""
    provenance.write(path, dict(document))


__all__ = [
    "add_disk_ratios",
    "comparisons",
    "fmt_seconds",
    "format_table",
    "merge_runs",
    "write_json",
]
