"""What `cudask bench transfer` reports: cold and warm per case across rounds, the targets.

Covers: `aggregate`, a case's rounds folded into "cold" and "warm" figures (the median
across rounds, and each round's value: the all-to-all's seconds, each size's
point-to-point bandwidth, each shuffle method's seconds; the medians of the all-to-all's
workers' span and of the waits around it, from the task stream) and the rounds in which a worker
spilled device memory to host (`spilled_rounds`: near the device limit a round's figures
include spilling) and those in which one pinned host memory ahead of spills
(`pinned_ahead_rounds`); `targets`, the comparisons the
transfer work is held to, per pool variant: cudask IPC's all-to-all no slower than
dask-cuda over UCX, cold and warm; its largest point-to-point transfer no slower than
dask-cuda over UCX, cold and warm. A target whose settings did not both run says so
(met: None). Beside each target's ratio, its spread across rounds
(`ratio_spread`: the middle `SPREAD` of the ratio of medians with each side's rounds drawn
again with replacement) and whether that spread lies wholly on the verdict's side of the
threshold (`clear`): a verdict whose spread crosses the threshold is within the runs'
run-to-run variation. `summary`, the lines the command prints, with, per case and
round, the blocks each worker held after the cold all-to-all, the most device memory
one held then and whether one had spilled by then (", spilled"). Beside each
point-to-point bandwidth (bytes over the seconds of the receiving worker's transfer
log), the seconds from submitting the reading task to its result (`point_to_point_task_s`).

Does not cover: measuring (cudask_bench.transfer).
Threading: pure functions of their arguments.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

MODES = ("cold", "warm")
SPREAD = 0.9  # the middle share of resampled ratios a target reports
RESAMPLES = 2000  # draws of each side's rounds behind a target's spread


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Cold and warm figures of one case across its rounds."""
    done = [r for r in runs if "all_to_all" in r]
    out: dict[str, Any] = {
        "failed": sum(1 for r in runs if "error" in r),
        "skipped": sum(1 for r in runs if "skipped" in r),
        "sum_ok": all(
            r["all_to_all"]["sum_ok"] and r.get("all_to_all_warm", {}).get("sum_ok", True)
            for r in done
        ),
    }
    out["spilled_rounds"] = [
        r.get("round", i)
        for i, r in enumerate(runs)
        if "all_to_all" in r and _store_moved(r, "spill-device-to-host-bytes")
    ]
    out["pinned_ahead_rounds"] = [
        r.get("round", i)
        for i, r in enumerate(runs)
        if "all_to_all" in r and _store_moved(r, "pinned-provision-bytes")
    ]
    out["receive_copy_GBps"] = [
        {"round": r.get("round", i), "GBps": v}
        for i, r in enumerate(runs)
        if "all_to_all" in r and (v := _receive_copy_GBps(r)) is not None
    ]
    sizes = sorted({size for r in done for size in r.get("point_to_point", {})}, key=int)
    methods = sorted({m for r in done for m in r.get("shuffle", {})})
    for mode in MODES:
        key = "all_to_all" if mode == "cold" else "all_to_all_warm"
        a2a = [r[key]["seconds"] for r in done if key in r]
        p2p = {
            size: [
                v
                for r in done
                if (v := _p2p(r.get("point_to_point", {}).get(size), mode)) is not None
            ]
            for size in sizes
        }
        ends = {
            size: [
                v
                for r in done
                if (v := _end_to_end(r.get("point_to_point", {}).get(size), mode)) is not None
            ]
            for size in sizes
        }
        shuffle = {
            m: [
                r["shuffle"][m][mode]["seconds"]
                for r in done
                if "seconds" in r.get("shuffle", {}).get(m, {}).get(mode, {})
            ]
            for m in methods
        }
        streams = [r[key]["workers"] for r in done if "workers" in r.get(key, {})]
        out[mode] = {
            "all_to_all_s": _median(a2a),
            "all_to_all_s_each": a2a,
            "all_to_all_busy_s": _median([w["busy_s"] for w in streams]),
            "all_to_all_wait_s": _median(
                [w["before_first_s"] + w["after_last_s"] for w in streams]
            ),
            "point_to_point_GBps": {size: _median(v) for size, v in p2p.items()},
            "point_to_point_GBps_each": p2p,
            "point_to_point_task_s": {size: _median(v) for size, v in ends.items()},
            "point_to_point_task_s_each": ends,
            "shuffle_s": {m: _median(v) for m, v in shuffle.items()},
        }
    return out


def _receive_copy_GBps(run: Mapping[str, Any]) -> float | None:
    """Bytes the run's workers received by CUDA IPC over the seconds their copies took,
    summed over the workers (copies that overlap count each), from cudask.comm.ipc's
    counters over the whole case: every all-to-all and point-to-point receive. None
    without such receives."""
    ipc = (run.get("ipc") or {}).values()
    seconds = sum(w.get("receive-copy-seconds", 0.0) for w in ipc)
    return sum(w.get("received-bytes", 0.0) for w in ipc) / seconds / 1e9 if seconds else None


def _store_moved(run: Mapping[str, Any], figure: str) -> bool:
    """Whether a worker of the run counts any bytes of the store's `figure` (any phase):
    spill-device-to-host-bytes (near the device limit the figures include spilling),
    pinned-provision-bytes (host memory pinned ahead of spills)."""
    return any(figures.get(figure, 0) > 0 for figures in (run.get("store") or {}).values())


def _p2p(entry: Mapping[str, Any] | None, mode: str) -> float | None:
    if not entry:
        return None
    value = entry["cold"].get("GBps") if mode == "cold" else entry.get("warm_median_GBps")
    return float(value) if value else None


def _end_to_end(entry: Mapping[str, Any] | None, mode: str) -> float | None:
    """Seconds from submitting the reading task to its result, the transfer included:
    the cold run's, or the median of the warm runs'."""
    if not entry:
        return None
    if mode == "cold":
        value = entry["cold"].get("task_s")
        return float(value) if value else None
    return _median([float(r["task_s"]) for r in entry.get("runs", [])[1:] if r.get("task_s")])


def _suffix(pool: str | None) -> str:
    return f"+pool-{pool}" if pool else ""


def _value(
    case: Mapping[str, Any] | None, mode: str, metric: str, size: str | None
) -> float | None:
    if not case or mode not in case:
        return None
    figure = case[mode][metric]
    return figure.get(size) if size is not None else figure


def _each(case: Mapping[str, Any] | None, mode: str, metric: str, size: str | None) -> list[float]:
    """Each round's value behind `_value`'s median."""
    if not case or mode not in case:
        return []
    each = case[mode].get(metric + "_each")
    if size is not None:
        each = (each or {}).get(size)
    return [float(v) for v in each or []]


def ratio_spread(mine: Sequence[float], theirs: Sequence[float]) -> list[float] | None:
    """The middle SPREAD of median(mine) / median(theirs) with each side's rounds drawn
    again with replacement, RESAMPLES times from a fixed seed (a report gives the same
    spread each time it is made); None with fewer than two rounds on a side or a round that
    is not positive. Over a handful of rounds this percentile spread is coarse and tends
    to be narrower than the run-to-run variation it estimates."""
    if len(mine) < 2 or len(theirs) < 2 or min(*mine, *theirs) <= 0:
        return None
    draw = random.Random(0)
    ratios = sorted(
        statistics.median(draw.choices(mine, k=len(mine)))
        / statistics.median(draw.choices(theirs, k=len(theirs)))
        for _ in range(RESAMPLES)
    )
    cut = round(RESAMPLES * (1 - SPREAD) / 2)  # draws left out at each end
    return [ratios[cut], ratios[-1 - cut]]


def _target(
    text: str,
    mine: float | None,
    theirs: float | None,
    *,
    lower: bool,
    each: tuple[Sequence[float], Sequence[float]] = ((), ()),
) -> dict[str, Any]:
    """One comparison: met (None: a side not measured), the ratio of `mine` to `theirs`,
    its spread across the rounds in `each` (mine's, theirs') and whether that spread lies
    wholly on the verdict's side of the threshold, 1 (`clear`; None without a spread)."""
    met = None
    if mine is not None and theirs is not None:
        met = mine <= theirs if lower else mine >= theirs
    spread = ratio_spread(*each) if met is not None else None
    clear = None
    if spread is not None:
        low, high = spread
        clear = (high <= 1 if met else low > 1) if lower else (low >= 1 if met else high < 1)
    return {
        "target": text,
        "mine": mine,
        "theirs": theirs,
        "met": met,
        "ratio": mine / theirs if mine is not None and theirs else None,
        "ratio_spread": spread,
        "clear": clear,
    }


def targets(
    settings: Mapping[str, Mapping[str, Any]], pools: Sequence[str | None]
) -> list[dict[str, Any]]:
    """The targets per pool variant whose plan has both cudask-ipc and dask-cuda-ucx."""
    out = []
    for pool in pools:
        label, sfx = (f"pool {pool}" if pool else "no pool"), _suffix(pool)
        ipc, ucx = settings.get("cudask-ipc" + sfx), settings.get("dask-cuda-ucx" + sfx)
        if ipc is None or ucx is None:
            continue
        for mode in MODES:
            out.append(
                _target(
                    f"all-to-all {mode}, {label}: cudask-ipc s <= dask-cuda-ucx",
                    _value(ipc, mode, "all_to_all_s", None),
                    _value(ucx, mode, "all_to_all_s", None),
                    lower=True,
                    each=(
                        _each(ipc, mode, "all_to_all_s", None),
                        _each(ucx, mode, "all_to_all_s", None),
                    ),
                )
            )
        sizes = list(ipc.get("cold", {}).get("point_to_point_GBps", {}))
        if sizes:
            largest = max(sizes, key=int)
            for mode in MODES:
                out.append(
                    _target(
                        f"point to point {int(largest) / 2**20:.0f} MiB {mode}, {label}: cudask-ipc GB/s "
                        ">= dask-cuda-ucx",
                        _value(ipc, mode, "point_to_point_GBps", largest),
                        _value(ucx, mode, "point_to_point_GBps", largest),
                        lower=False,
                        each=(
                            _each(ipc, mode, "point_to_point_GBps", largest),
                            _each(ucx, mode, "point_to_point_GBps", largest),
                        ),
                    )
                )
    return out


def _seconds(median: float | None, each: Sequence[float]) -> str:
    if median is None:
        return "-"
    return f"{median:.2f} s" + (
        f" ({', '.join(f'{v:.2f}' for v in each)})" if len(each) > 1 else ""
    )


def _held_line(rounds: Sequence[Mapping[str, Any]]) -> str:
    """Per round, the blocks of each layout each worker held after the cold all-to-all,
    the most device memory one held, and whether one had spilled by then."""
    items = []
    for r in rounds:
        held = r.get("all_to_all", {}).get("held") or {}
        if not held:
            continue
        blocks = [
            "+".join(str(int(f.get(layout, 0))) for f in held.values())
            for layout in ("row-blocks", "column-blocks")
        ]
        most = max(f.get("device-bytes", 0.0) for f in held.values()) / 1e9
        spilled = any(f.get("spill-device-to-host-bytes", 0.0) > 0 for f in held.values())
        items.append(
            f"round {r.get('round')} {blocks[0]} and {blocks[1]}, {most:.1f} GB"
            + (", spilled" if spilled else "")
        )
    return "; ".join(items)


def _case_lines(name: str, case: Mapping[str, Any], n_bytes: float | None) -> list[str]:
    cold, warm = case["cold"], case["warm"]
    size = f" {n_bytes / 1e9:.1f} GB" if n_bytes else ""
    lines = [
        (
            f"{name:34} all-to-all{size}: cold {_seconds(cold['all_to_all_s'], cold['all_to_all_s_each'])}, "
            f"warm {_seconds(warm['all_to_all_s'], warm['all_to_all_s_each'])}, sum ok: {case['sum_ok']}"
        )
    ]
    if cold.get("all_to_all_busy_s") is not None:
        lines.append(
            f"{name:34} all-to-all workers' span: cold {_seconds(cold['all_to_all_busy_s'], [])}, "
            f"warm {_seconds(warm.get('all_to_all_busy_s'), [])}; waiting before and after it: "
            f"cold {_seconds(cold['all_to_all_wait_s'], [])}, warm {_seconds(warm.get('all_to_all_wait_s'), [])}"
        )
    for size_key, bw in cold["point_to_point_GBps"].items():
        end_cold, end_warm = (
            (m.get("point_to_point_task_s") or {}).get(size_key) for m in (cold, warm)
        )
        end_to_end = (
            f"; submit to result: cold {end_cold * 1e3:.1f} ms, warm {end_warm * 1e3:.1f} ms"
            if end_cold is not None and end_warm is not None
            else ""
        )
        lines.append(
            f"{name:34} {int(size_key) / 2**20:7.0f} MiB  cold {bw or 0:7.1f} GB/s  warm "
            f"{warm['point_to_point_GBps'].get(size_key) or 0:7.1f} GB/s{end_to_end}"
        )
    copies = case.get("receive_copy_GBps") or []
    if copies:
        lines.append(
            f"{name:34} received by CUDA IPC in the case, bytes over the receivers' summed copy "
            "seconds: " + ", ".join(f"round {c['round']} {c['GBps']:.0f}" for c in copies) + " GB/s"
        )
    held = _held_line(case["rounds"])
    if held:
        lines.append(
            f"{name:34} after the cold all-to-all, per round: row blocks per worker, "
            f"column blocks per worker, the most device memory a worker held: {held}"
        )
    spilled = case.get("spilled_rounds") or []
    if spilled:
        measured = sum(1 for r in case["rounds"] if "all_to_all" in r)
        lines.append(
            f"{name:34} spilled device memory to host in {len(spilled)} of {measured} "
            f"measured rounds (round {', '.join(map(str, spilled))}; the first is 0)"
        )
    for method, seconds in cold["shuffle_s"].items():
        lines.append(
            f"{name:34} shuffle {method:8} cold {_seconds(seconds, [])}, warm "
            f"{_seconds(warm['shuffle_s'].get(method), [])}"
        )
    for r in case["rounds"]:
        if "error" in r or "skipped" in r:
            lines.append(
                f"{name:34} round {r['round']}: {r.get('error') or r.get('skipped')}"[:300]
            )
    return lines


def _warmup_figure(run: Mapping[str, Any]) -> str:
    a2a = run.get("all_to_all")
    if not a2a:
        return str(run.get("error") or run.get("skipped") or "no figure")
    return f"{a2a['seconds']:.2f} s" + ("" if a2a.get("sum_ok") else " (sum WRONG)")


def summary(report: Mapping[str, Any]) -> list[str]:
    """The warm-up runs, each round's order, each case's cold and warm figures (medians across rounds,
    each round's all-to-all in brackets), then every target, met or not."""
    lines = [
        f"warm-up (left out): {w['case']}, all-to-all " + _warmup_figure(w)
        for w in report.get("warmup", [])
    ]
    lines += [f"round {r}: {', '.join(names)}" for r, names in enumerate(report.get("order", []))]
    plans = {
        (p["threshold"], p.get("chunk_size") or "", p["tasks"])
        for case in report["settings"].values()
        for r in case["rounds"]
        if (p := r.get("all_to_all", {}).get("rechunk"))
    }
    lines += [
        f"all-to-all rechunk: array.rechunk.threshold {t}, "
        + (f"array.chunk-size {c}, " if c else "")
        + f"{k} tasks"
        for t, c, k in sorted(plans)
    ]
    n = (report.get("plan") or {}).get("n")
    for name, case in report["settings"].items():
        lines += _case_lines(name, case, n * n * 8 if n else None)
    found = report.get("targets", [])
    for t in found:
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        figures = (
            f": {t['mine']:.3g} against {t['theirs']:.3g} ({t['ratio']:.2f}x{_spread(t)})"
            if t["ratio"]
            else ""
        )
        lines.append(f"target {verdict}: {t['target']}{figures}")
    if found:
        within = [t for t in found if t.get("clear") is False]
        lines.append(
            f"targets met: {sum(1 for t in found if t['met'])} of {len(found)}"
            + (
                f"; {len(within)} of the {len(found)} verdicts within the rounds' spread"
                if within
                else ""
            )
        )
    return lines


def _spread(target: Mapping[str, Any]) -> str:
    """The ratio's spread across rounds, as the summary shows it after the ratio."""
    spread = target.get("ratio_spread")
    if not spread:
        return ""
    side = "within the rounds' spread" if target.get("clear") is False else "clear of the threshold"
    return f"; {SPREAD:.0%} of resampled rounds {spread[0]:.2f}-{spread[1]:.2f}x: {side}"


__all__ = ["MODES", "RESAMPLES", "SPREAD", "aggregate", "ratio_spread", "summary", "targets"]
