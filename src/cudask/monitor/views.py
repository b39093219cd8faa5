"""The JSON the cudask dashboard page reads, made from a MonitorPlugin's views.

Covers: the page's address (`PAGE`) and its JSON API (`API`: file name under
`/cudask/api/` -> view of a `MonitorSource`): `workers.json` (`snapshot()`),
`history.json` (`history()`) and the display-ready columns the page plots,
`columns.json` (`table_columns` + `status_html`) and `history-columns.json`
(`history_columns`). Every byte and rate formatting happens here, in Python,
where it is tested; `finite` makes any view JSON-safe (no NaN).

Does not cover: collecting the figures (`cudask.monitor.state`), the HTML
document (`cudask.monitor.document`), serving (`cudask.monitor.page`).

Threading: pure functions of their arguments; call them from any thread.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dask.utils import format_bytes

#: Where the page lives, relative to the dashboard's root.
PAGE = "/cudask"
#: Workers drawn one by one in the rate charts (besides the cluster total).
TOP = 8
#: The rates drawn over time (history() fields "<rate>_gbps").
RATES = ("spill", "unspill")

_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)


class MonitorSource(Protocol):
    """What the page reads: `cudask.monitor.state.MonitorPlugin`, or in tests any
    object with the same two views."""

    def snapshot(self) -> dict[str, Any]: ...

    def history(self) -> dict[str, Any]: ...


# --------------------------------------------------------------------- conversion
def _bytes(value: Any) -> str:
    return format_bytes(int(value)) if _is_number(value) else ""


def _gbps(value: Any) -> str:
    """A rate in GB/s: two decimals, "<0.01" for a small non-zero rate, "" when unknown."""
    if not _is_number(value):
        return ""
    return "<0.01" if 0 < value < 0.005 else f"{value:.2f}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pair(a: Any, b: Any, fmt: Callable[[Any], str]) -> str:
    """ "a / b" for two figures, "" when neither is known."""
    left, right = fmt(a), fmt(b)
    if not left and not right:
        return ""
    return f"{left or '?'} / {right or '?'}"


def _short_uuid(uuid: Any) -> str:
    """ "GPU-1a2b3c4d-...-..." -> "GPU-1a2b3c4d" (MIG "MIG-..." alike)."""
    if not isinstance(uuid, str) or not uuid:
        return ""
    head, _, rest = uuid.partition("-")
    return f"{head}-{rest.split('-')[0]}" if rest else uuid


def _natural(text: str) -> list[Any]:
    """Sort key putting "cudask-2" before "cudask-10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


#: The columns of `table_columns`, in this order.
TABLE_COLUMNS = (
    # display strings of the table
    "name",
    "host",
    "gpu",
    "gpu_title",
    "device",
    "device_pct",
    "host_tier",
    "disk_tier",
    "pinned",
    "spill",
    "unspill",
    "util",
    "gpu_memory",
    "pcie",
    "nvlink",
    # numbers of the bar chart (bytes; limit None where the device tier is unlimited)
    "device_bytes",
    "host_bytes",
    "disk_bytes",
    "limit_bytes",
)


def table_columns(snapshot: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The page's table and bar chart as columns (a bokeh ColumnDataSource's data):
    one entry per row of `snapshot["workers"]`, in natural order of host and name.

    Display columns are strings, "" where a figure is unknown (None, or a worker
    without cudask metrics); bytes as dask formats them ("1.50 GiB"), rates in
    GB/s with two decimals. The bar chart's columns are numbers of bytes."""
    rows = sorted(
        snapshot.get("workers") or (),
        key=lambda r: (_natural(str(r.get("host", ""))), _natural(str(r.get("name", "")))),
    )
    out: dict[str, list[Any]] = {name: [] for name in TABLE_COLUMNS}
    for row in rows:
        cudask = bool(row.get("cudask"))
        device, limit = row.get("device_bytes"), row.get("device_limit_bytes")
        has_limit = _is_number(limit) and limit > 0
        uuid, model = row.get("gpu_uuid"), row.get("gpu_name")
        out["name"].append(str(row.get("name", "")))
        out["host"].append(str(row.get("host", "")))
        out["gpu"].append(_short_uuid(uuid))
        out["gpu_title"].append(" ".join(str(x) for x in (model, uuid) if x))
        if cudask:
            out["device"].append(f"{_bytes(device)} / {_bytes(limit) if has_limit else 'no limit'}")
            out["device_pct"].append(
                f"{100 * device / limit:.0f} %" if has_limit and _is_number(device) else ""
            )
            out["host_tier"].append(_bytes(row.get("host_bytes")))
            out["disk_tier"].append(_bytes(row.get("disk_bytes")))
            out["pinned"].append(
                _pair(row.get("pinned_in_use_bytes"), row.get("pinned_reserved_bytes"), _bytes)
            )
        else:
            for name in ("device", "device_pct", "host_tier", "disk_tier", "pinned"):
                out[name].append("")
        out["spill"].append(_gbps(row.get("spill_gbps")))
        out["unspill"].append(_gbps(row.get("unspill_gbps")))
        util = row.get("gpu_utilization")
        out["util"].append(f"{util:.0f} %" if _is_number(util) else "")
        out["gpu_memory"].append(
            _pair(row.get("gpu_memory_used_bytes"), row.get("gpu_memory_total_bytes"), _bytes)
        )
        out["pcie"].append(_pair(row.get("pcie_tx_gbps"), row.get("pcie_rx_gbps"), _gbps))
        out["nvlink"].append(_pair(row.get("nvlink_tx_gbps"), row.get("nvlink_rx_gbps"), _gbps))
        for name in ("device_bytes", "host_bytes", "disk_bytes"):
            value = row.get(name)
            out[name].append(float(value) if cudask and _is_number(value) else 0.0)
        out["limit_bytes"].append(float(limit) if cudask and has_limit else None)
    return out


def status_html(snapshot: Mapping[str, Any]) -> str:
    """The page's one-line summary (HTML, every value escaped): the cluster's
    totals, or the reason there is nothing to show."""
    rows = list(snapshot.get("workers") or ())
    reason = snapshot.get("reason")
    parts: list[str] = []
    if rows:
        hosts = len({r.get("host") for r in rows})
        cudask = [r for r in rows if r.get("cudask")]

        def total(field: str) -> float:
            return sum(float(r[field]) for r in cudask if _is_number(r.get(field)))

        parts.append(
            f"<b>{len(rows)} worker{'s' if len(rows) != 1 else ''}</b> on {hosts} "
            f"host{'s' if hosts != 1 else ''} ({len(cudask)} with cudask metrics)"
        )
        if cudask:
            limit = total("device_limit_bytes")
            parts.append(
                f"device {_bytes(total('device_bytes'))}"
                + (f" of {_bytes(limit)}" if limit else "")
            )
            parts.append(f"host tier {_bytes(total('host_bytes'))}")
            parts.append(f"disk tier {_bytes(total('disk_bytes'))}")
            parts.append(
                f"spill {total('spill_gbps'):.2f} GB/s, unspill {total('unspill_gbps'):.2f} GB/s"
            )
    text = " · ".join(parts)
    if reason:
        note = f'<b style="color:#b00020">{html.escape(str(reason))}</b>'
        text = f"{text} · {note}" if text else note
    elif not rows:
        text = '<b style="color:#b00020">no workers</b>'
    return text


def columns_view(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """Body of columns.json: {"columns": table_columns, "status": status_html,
    "time": snapshot time, "rows": row count}."""
    columns = table_columns(snapshot)
    return {
        "columns": columns,
        "status": status_html(snapshot),
        "time": snapshot.get("time"),
        "rows": len(columns["name"]),
    }


LINE_COLUMNS = ("xs", "ys", "label", "color", "width")


def history_columns(history: Mapping[str, Any], rate: str, top: int = TOP) -> dict[str, Any]:
    """One rate's history as multi-line columns (bokeh ColumnDataSource data):
    {"total": the cluster total (one line, or none without data), "workers": the
    `top` workers that moved the most bytes in the window, busiest first (workers
    whose rate stayed 0 or unknown are left out)}.

    "xs" are seconds relative to the newest sample (0 = now, negative = earlier),
    "ys" GB/s; points where a rate is unknown (None) are left out of the line;
    "label", "color" and "width" style each line."""
    if rate not in RATES:
        raise ValueError(f"rate={rate!r}: accepted are {', '.join(RATES)}")
    field = f"{rate}_gbps"
    total_cols: dict[str, list[Any]] = {name: [] for name in LINE_COLUMNS}
    worker_cols: dict[str, list[Any]] = {name: [] for name in LINE_COLUMNS}
    times = [float(t) for t in history.get("time") or ()]
    if not times:
        return {"total": total_cols, "workers": worker_cols}
    last = times[-1]
    xs = [t - last for t in times]
    workers: dict[str, Sequence[Any]] = {
        str(name): (series.get(field) or ())
        for name, series in (history.get("workers") or {}).items()
    }

    def add(
        out: dict[str, list[Any]], label: str, values: Sequence[Any], color: str, width: float
    ) -> None:
        points = [(x, float(v)) for x, v in zip(xs, values, strict=False) if _is_number(v)]
        if not points:
            return
        out["xs"].append([x for x, _ in points])
        out["ys"].append([y for _, y in points])
        out["label"].append(label)
        out["color"].append(color)
        out["width"].append(width)

    total: list[float | None] = []
    for i in range(len(times)):
        known = [float(v[i]) for v in workers.values() if i < len(v) and _is_number(v[i])]
        total.append(sum(known) if known else None)
    n = len(workers)
    add(
        total_cols,
        f"total of {n} worker{'s' if n != 1 else ''} (right axis)",
        total,
        "#000000",
        2.5,
    )
    moved = {
        name: sum(float(v) for v in values if _is_number(v)) for name, values in workers.items()
    }
    busiest = sorted((w for w in workers if moved[w] > 0), key=lambda w: (-moved[w], _natural(w)))
    for i, name in enumerate(busiest[:top]):
        add(worker_cols, name, workers[name], _COLORS[i % len(_COLORS)], 1.5)
    return {"total": total_cols, "workers": worker_cols}


def history_view(history: Mapping[str, Any], top: int = TOP) -> dict[str, Any]:
    """Body of history-columns.json: {rate: history_columns(history, rate)} for
    every rate in RATES."""
    return {rate: history_columns(history, rate, top) for rate in RATES}


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _workers(plugin: MonitorSource) -> Any:
    return plugin.snapshot()


def _history(plugin: MonitorSource) -> Any:
    return plugin.history()


def _columns(plugin: MonitorSource) -> Any:
    return columns_view(plugin.snapshot())


def _history_columns(plugin: MonitorSource) -> Any:
    return history_view(plugin.history())


#: API file (under /cudask/api/) -> view
API: dict[str, Callable[[MonitorSource], Any]] = {
    "workers.json": _workers,
    "history.json": _history,
    "columns.json": _columns,
    "history-columns.json": _history_columns,
}


__all__ = [
    "API",
    "LINE_COLUMNS",
    "PAGE",
    "RATES",
    "TABLE_COLUMNS",
    "TOP",
    "MonitorSource",
    "columns_view",
    "finite",
    "history_columns",
    "history_view",
    "status_html",
    "table_columns",
]
