"""PNG charts of `cudask bench` results.

Covers: one grouped bar chart per result document: a group per metric, cold metrics
before warm ones, a bar per variant at its median seconds with min-max whiskers, the
value printed on each bar, "failed" where a variant did not produce the metric, slanted
labels when there are many or long metric names, and a log axis when the values span
more than 30x; each metric's label says whether it is cold or warm. Below the chart a
caption names the result file the bars come from, the machine, the date and the cudask
commit, and the PNG's text chunks carry the same with the file's SHA-256 (`Origin`), so a
reader can trace a picture to its JSON. matplotlib is imported
lazily (`cudask[bench]`) and drawn with the Agg backend, so no display is needed.

Does not cover: running benchmarks or computing ratios (cudask_bench.report).
Threading: pyplot's global state: one chart at a time, from one thread.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudask.errors import MissingDependencyError
from cudask_bench.provenance import figure_modes
from cudask_bench.spec import ordered_metrics

#: Widest chart, inches (a cold cupy run has four metrics per operation).
MAX_WIDTH = 40.0
#: PNG text keys: the result file charted, its SHA-256, the caption printed under the chart.
SOURCE_KEY, SHA256_KEY, CAPTION_KEY = "Source", "Source-SHA256", "Description"
_MODES = {"cold": "first run on a fresh cluster", "warm": "later runs in the same cluster"}


@dataclass(frozen=True)
class Origin:
    """The result file a chart is drawn from: its name as the caption shows it, the
    SHA-256 of its bytes, and the commit behind its figures where the file does not
    record one itself (files older than provenance)."""

    name: str
    sha256: str | None = None
    commit: str | None = None

    @classmethod
    def of_file(
        cls, path: str | os.PathLike[str], name: str | None = None, commit: str | None = None
    ) -> Origin:
        data = Path(path).read_bytes()
        return cls(name or os.fspath(path), hashlib.sha256(data).hexdigest(), commit)


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


def machine_line(document: Mapping[str, Any]) -> str:
    """ "1× NVIDIA H100 80GB HBM3, driver 580.159.04, CUDA 13.0": the machine `document`
    (a result) records, under "provenance" or "machine"."""
    machine = (document.get("provenance") or {}).get("machine") or document.get("machine") or {}
    gpus = machine.get("gpus") or {}
    names = [str(d.get("name")) for d in gpus.get("devices") or []]
    used = (machine.get("gpu_used") or {}).get("name")
    parts = [
        f"{len(names)}× {names[0]}"
        if names and len(set(names)) == 1
        else ", ".join(names) or str(used or "machine not recorded")
    ]
    if used and names and len(names) > 1:
        parts.append(f"ran on {used}")
    if gpus.get("driver"):
        parts.append(f"driver {gpus['driver']}")
    if gpus.get("cuda_driver"):
        parts.append(f"CUDA {gpus['cuda_driver']}")
    return ", ".join(parts)


def _commit(document: Mapping[str, Any], origin: Origin | None) -> str:
    source = (document.get("provenance") or {}).get("source") or {}
    if source.get("commit"):
        return f"cudask {str(source['commit'])[:7]}" + (
            " (dirty tree)" if source.get("dirty") else ""
        )
    if origin is not None and origin.commit:
        return f"cudask {origin.commit}"
    return "cudask commit not recorded"


def caption(document: Mapping[str, Any], origin: Origin | None) -> list[str]:
    """The lines printed under the chart: result file; machine, date, commit; modes."""
    provenance = document.get("provenance") or {}
    date = str(provenance.get("written_at") or document.get("started_at") or "date unknown")
    modes = provenance.get("figures") or figure_modes(document)
    said = " and ".join(f"{m} ({_MODES[m]})" for m in _MODES if m in set(modes.values()))
    return [
        f"result: {origin.name}"
        if origin is not None
        else "result: not written to a file (run with --output FILE to keep it)",
        f"{machine_line(document)} · {date[:10]} · {_commit(document, origin)}",
        f"figures: {said or 'neither cold nor warm'}",
    ]


def _label(metric: str, modes: Mapping[str, str]) -> str:
    return f"{metric} ({modes[metric]})" if metric in modes else metric


def write_chart(
    document: Mapping[str, Any], path: str | os.PathLike[str], origin: Origin | None = None
) -> None:
    """Draw `document` (a result file's content; `origin` says which file) as a PNG at
    `path`, captioned with that file, the machine, the date and the commit."""
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
    lines = caption(document, origin)
    height = 4.8 + 0.2 * len(lines)
    fig, ax = plt.subplots(figsize=(min(MAX_WIDTH, max(7.0, wide)), height))
    for i, v in enumerate(variants):
        _draw_variant(ax, i, v, metrics, width)
    ax.set_xticks(range(len(metrics)))
    modes = (document.get("provenance") or {}).get("figures") or figure_modes(document)
    labels = [_label(m, modes) for m in metrics]
    slanted = len(metrics) > 4 or max(len(m) for m in labels) > 12
    ax.set_xticklabels(
        labels,
        rotation=35 if slanted else 0,
        ha="right" if slanted else "center",
        rotation_mode="anchor",
    )
    ax.set_ylabel("seconds (median, lower is better)")
    if log:
        ax.set_yscale("log")
    ax.set_title(_title(document))
    ax.legend(fontsize=8)
    below = (0.2 * len(lines) + 0.1) / height
    fig.text(
        0.01,
        0.01,
        "\n".join(lines),
        fontsize=7.5,
        color="#333333",
        ha="left",
        va="bottom",
        linespacing=1.4,
    )
    fig.tight_layout(rect=(0, below, 1, 1))
    metadata = {"Title": _title(document), CAPTION_KEY: "\n".join(lines)}
    if origin is not None:
        metadata[SOURCE_KEY] = origin.name
        if origin.sha256:
            metadata[SHA256_KEY] = origin.sha256
    fig.savefig(os.fspath(path), dpi=120, metadata=metadata)
    plt.close(fig)


__all__ = [
    "CAPTION_KEY",
    "SHA256_KEY",
    "SOURCE_KEY",
    "Origin",
    "caption",
    "machine_line",
    "require_matplotlib",
    "write_chart",
]
