"""PNG charts of `cudask bench` results.

Covers: one grouped bar chart per result document: a group per metric, cold metrics
before warm ones, a bar per variant at its median seconds with min-max whiskers, the
value printed on each bar, "failed" where a variant did not produce the metric, slanted
labels when there are many or long metric names, and a log axis when the values span
more than 30x. matplotlib is imported lazily (`cudask[bench]`) and drawn with the Agg
backend, so no display is needed.

Does not cover: running benchmarks or computing ratios (cudask_bench.report).
Threading: pyplot's global state: one chart at a time, from one thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cudask.errors import MissingDependencyError
from cudask_bench.spec import ordered_metrics

#: Widest chart, inches (a cold cupy run has four metrics per operation).
MAX_WIDTH = 40.0


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError(
            "matplotlib", "--chart", "pip install 'cudask[bench]' (or: pip install matplotlib)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def require_matplotlib() -> None:
    """Fail early (before any benchmark runs) when --chart cannot be honoured."""
    _pyplot()


def _draw_variant(ax: Any, i: int, v: Mapping[str, Any], metrics: list[str], width: float) -> None:
    """Variant `i`'s bars (median, min-max whiskers, the value on top) or "failed" marks."""
    xs, heights, low, high, labels = [], [], [], [], []
    for j, metric in enumerate(metrics):
        m = (v.get("measurements") or {}).get(metric)
        x = j - 0.4 + width * (i + 0.5)
        ok = m is not None and m.get("status") == "ok" and v.get("status") == "ok"
        if ok and m is not None and m.get("median"):
            med = float(m["median"])
            xs.append(x)
            heights.append(med)
            low.append(med - float(m.get("min") or med))
            high.append(float(m.get("max") or med) - med)
            labels.append(f"{med:.3g}")
        elif m is not None or v.get("status") != "ok":
            ax.text(
                x,
                0.02,
                "failed",
                rotation=90,
                ha="center",
                va="bottom",
                transform=ax.get_xaxis_transform(),
                fontsize=8,
                color="firebrick",
            )
    bars = ax.bar(
        xs,
        heights,
        width,
        label=v.get("name", v.get("backend")),
        color=f"C{i % 10}",
        yerr=[low, high] if xs else None,
        capsize=2,
    )
    for bar, text in zip(bars, labels):
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _title(document: Mapping[str, Any]) -> str:
    gpu = (document.get("machine") or {}).get("gpu_used") or {}
    title = f"cudask bench {document.get('workload', '')}"
    mode = (document.get("parameters") or {}).get("mode")
    if mode:
        title += f" ({mode})"
    if gpu.get("name"):
        title += f" - {gpu['name']}"
    return title


def write_chart(document: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Draw `document` (a result file's content) as a PNG at `path`."""
    plt = _pyplot()
    variants = list(document.get("variants") or [])
    metrics = ordered_metrics(variants)
    if not variants or not metrics:
        raise ValueError("the result holds no measurements to chart")

    values = [
        (m.get("median"), m.get("min"), m.get("max"))
        for v in variants
        for m in (v.get("measurements") or {}).values()
        if m.get("status") == "ok" and m.get("median")
    ]
    positive = [x[0] for x in values if x[0] and x[0] > 0]
    log = bool(positive) and max(positive) / min(positive) > 30

    width = 0.8 / len(variants)
    wide = 1.4 * len(metrics) * max(1, len(variants)) / 2
    fig, ax = plt.subplots(figsize=(min(MAX_WIDTH, max(6.0, wide)), 4.8))
    for i, v in enumerate(variants):
        _draw_variant(ax, i, v, metrics, width)
    ax.set_xticks(range(len(metrics)))
    slanted = len(metrics) > 4 or max(len(m) for m in metrics) > 12
    ax.set_xticklabels(
        metrics, rotation=35 if slanted else 0, ha="right" if slanted else "center",
        rotation_mode="anchor",
    )
    ax.set_ylabel("seconds (median, lower is better)")
    if log:
        ax.set_yscale("log")
    ax.set_title(_title(document))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=120)
    plt.close(fig)


__all__ = ["require_matplotlib", "write_chart"]
