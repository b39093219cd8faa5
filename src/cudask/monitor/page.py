"""The cudask dashboard page: every GPU worker's memory tiers, spill rates and GPU.

Covers:

- `routes(plugin)`: the tornado routes that `MonitorPlugin.start` adds to the
  scheduler's dashboard server: `/cudask` (the page) and its JSON API,
  `/cudask/api/workers.json` (`plugin.snapshot()`), `/cudask/api/history.json`
  (`plugin.history()`), and the column-oriented views the page reads,
  `/cudask/api/columns.json` and `/cudask/api/history-columns.json`.
  The JSON is never cached.
- The page itself: one static HTML document made with bokeh's embedding API
  (`file_html` with bokeh's JavaScript inlined, so it works on machines with no
  network). Its table and charts read the JSON API with `AjaxDataSource` every
  second through relative URLs, so the page works under the dashboard's
  `--dashboard-prefix` and behind a proxy. It shows one table row and one
  stacked bar (device / host / disk, device limit marked) per GPU worker, the
  spill and unspill rates of the last minutes (the cluster total and the 8
  busiest workers), and a status line that always says what is shown, or why
  nothing is (`snapshot()["reason"]`, or that the scheduler stopped answering).
- `table_columns` and `history_columns`: the pure functions that turn
  `snapshot()` / `history()` into the display-ready columns the page plots;
  every byte and rate formatting happens there, in Python, where it is tested.
- `page_link(dashboard_link)`: the page's address from a cluster's
  `dashboard_link`, for `cudask demo` and LocalCUDACluster to print.

Routes match any path ending in `/cudask...`, so the page is found under a
`--dashboard-prefix` too: the scheduler does not tell its plugins the prefix.

Does not cover: collecting the figures (`cudask.monitor.state`), Prometheus,
`cudask top`. Known limitation: distributed's navigation bar (Status, Workers,
...) is built from its own list of pages and has no public way to add one, and
cudask never patches distributed; so the page is reached by its address,
printed by `cudask demo` and LocalCUDACluster (`page_link`), and it links back
to the dashboard's own pages in its header.
"""

from __future__ import annotations

import functools
import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from dask.utils import format_bytes
from tornado.web import RedirectHandler, RequestHandler

#: Where the page lives, relative to the dashboard's root.
PAGE = "/cudask"
#: Milliseconds between two reads of the JSON API by the page.
POLL_MS = 1000
#: Workers drawn one by one in the rate charts (besides the cluster total).
TOP = 8
#: The rates drawn over time (history() fields "<rate>_gbps").
RATES = ("spill", "unspill")

_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
_TIER_COLORS = {"device": "#76b900", "host": "#4c78a8", "disk": "#b279a2"}
_LIMIT_COLOR = "#d62728"
_TABLE_ROW_PX = 25
_BAR_ROW_PX = 22


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
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _pair(a: Any, b: Any, fmt: Callable[[Any], str]) -> str:
    """"a / b" for two figures, "" when neither is known."""
    left, right = fmt(a), fmt(b)
    if not left and not right:
        return ""
    return f"{left or '?'} / {right or '?'}"


def _short_uuid(uuid: Any) -> str:
    """"GPU-1a2b3c4d-...-..." -> "GPU-1a2b3c4d" (MIG "MIG-..." alike)."""
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
    "name", "host", "gpu", "gpu_title", "device", "device_pct", "host_tier", "disk_tier",
    "pinned", "spill", "unspill", "util", "gpu_memory", "pcie", "nvlink",
    # numbers of the bar chart (bytes; limit None where the device tier is unlimited)
    "device_bytes", "host_bytes", "disk_bytes", "limit_bytes",
)


def table_columns(snapshot: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The page's table and bar chart as columns (a bokeh ColumnDataSource's data):
    one entry per row of `snapshot["workers"]`, in natural order of host and name.

    Display columns are strings, "" where a figure is unknown (None, or a worker
    without cudask metrics); bytes as dask formats them ("1.50 GiB"), rates in
    GB/s with two decimals. The bar chart's columns are numbers of bytes."""
    rows = sorted(snapshot.get("workers") or (),
                  key=lambda r: (_natural(str(r.get("host", ""))), _natural(str(r.get("name", "")))))
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
            out["device_pct"].append(f"{100 * device / limit:.0f} %"
                                     if has_limit and _is_number(device) else "")
            out["host_tier"].append(_bytes(row.get("host_bytes")))
            out["disk_tier"].append(_bytes(row.get("disk_bytes")))
            out["pinned"].append(_pair(row.get("pinned_in_use_bytes"),
                                       row.get("pinned_reserved_bytes"), _bytes))
        else:
            for name in ("device", "device_pct", "host_tier", "disk_tier", "pinned"):
                out[name].append("")
        out["spill"].append(_gbps(row.get("spill_gbps")))
        out["unspill"].append(_gbps(row.get("unspill_gbps")))
        util = row.get("gpu_utilization")
        out["util"].append(f"{util:.0f} %" if _is_number(util) else "")
        out["gpu_memory"].append(_pair(row.get("gpu_memory_used_bytes"),
                                       row.get("gpu_memory_total_bytes"), _bytes))
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

        parts.append(f"<b>{len(rows)} worker{'s' if len(rows) != 1 else ''}</b> on {hosts} "
                     f"host{'s' if hosts != 1 else ''} ({len(cudask)} with cudask metrics)")
        if cudask:
            limit = total("device_limit_bytes")
            parts.append(f"device {_bytes(total('device_bytes'))}"
                         + (f" of {_bytes(limit)}" if limit else ""))
            parts.append(f"host tier {_bytes(total('host_bytes'))}")
            parts.append(f"disk tier {_bytes(total('disk_bytes'))}")
            parts.append(f"spill {total('spill_gbps'):.2f} GB/s, "
                         f"unspill {total('unspill_gbps'):.2f} GB/s")
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
    return {"columns": columns, "status": status_html(snapshot),
            "time": snapshot.get("time"), "rows": len(columns["name"])}


_LINE_COLUMNS = ("xs", "ys", "label", "color", "width")


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
    total_cols: dict[str, list[Any]] = {name: [] for name in _LINE_COLUMNS}
    worker_cols: dict[str, list[Any]] = {name: [] for name in _LINE_COLUMNS}
    times = [float(t) for t in history.get("time") or ()]
    if not times:
        return {"total": total_cols, "workers": worker_cols}
    last = times[-1]
    xs = [t - last for t in times]
    workers: dict[str, Sequence[Any]] = {
        str(name): (series.get(field) or ()) for name, series in (history.get("workers") or {}).items()
    }

    def add(out: dict[str, list[Any]], label: str, values: Sequence[Any], color: str,
            width: float) -> None:
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
    add(total_cols, f"total of {n} worker{'s' if n != 1 else ''} (right axis)", total,
        "#000000", 2.5)
    moved = {name: sum(float(v) for v in values if _is_number(v)) for name, values in workers.items()}
    busiest = sorted((w for w in workers if moved[w] > 0), key=lambda w: (-moved[w], _natural(w)))
    for i, name in enumerate(busiest[:top]):
        add(worker_cols, name, workers[name], _COLORS[i % len(_COLORS)], 1.5)
    return {"total": total_cols, "workers": worker_cols}


def history_view(history: Mapping[str, Any], top: int = TOP) -> dict[str, Any]:
    """Body of history-columns.json: {rate: history_columns(history, rate)} for
    every rate in RATES."""
    return {rate: history_columns(history, rate, top) for rate in RATES}


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ------------------------------------------------------------------------- links
def page_link(dashboard_link: str) -> str:
    """The cudask page's address from a cluster's `dashboard_link`:
    "http://host:8787/status" -> "http://host:8787/cudask" (any prefix or proxy
    path before "status" is kept; a link not ending in "/status" gets "/cudask"
    appended to its path)."""
    if not isinstance(dashboard_link, str) or not dashboard_link.strip():
        raise ValueError(f"dashboard_link={dashboard_link!r}: expected the dashboard's address, "
                         "e.g. 'http://127.0.0.1:8787/status'")
    parts = urlsplit(dashboard_link.strip())
    path = parts.path
    if path.endswith("/status"):
        path = path[: -len("status")] + PAGE.lstrip("/")
    else:
        path = path.rstrip("/") + PAGE
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


# ------------------------------------------------------------------------- routes
class PageHandler(RequestHandler):
    """GET /cudask: the page (the same document for every request)."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.write(page_html())


class JSONHandler(RequestHandler):
    """GET one JSON view of the plugin, `view(plugin)`, never cached."""

    def initialize(self, plugin: MonitorSource, view: Callable[[MonitorSource], Any]) -> None:
        self.plugin = plugin
        self.view = view

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store, no-cache, must-revalidate, max-age=0")
        self.write(json.dumps(_finite(self.view(self.plugin)), allow_nan=False))


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


def routes(plugin: MonitorSource) -> list[tuple[str, type, dict[str, Any]]]:
    """The page's tornado routes, for `scheduler.http_application.add_handlers`.

    Each matches with or without the dashboard's prefix ("/cudask" and
    "/<prefix>/cudask"), since the scheduler does not tell plugins its prefix;
    the page's own links are relative."""
    any_prefix = r"(?:/.+)?"
    out: list[tuple[str, type, dict[str, Any]]] = [
        (any_prefix + PAGE, PageHandler, {}),
        # "/cudask/" would resolve the page's relative links one level too deep
        (any_prefix + PAGE + "/", RedirectHandler, {"url": "../" + PAGE.lstrip("/")}),
    ]
    for name, view in API.items():
        out.append((f"{any_prefix}{PAGE}/api/{re.escape(name)}", JSONHandler,
                    {"plugin": plugin, "view": view}))
    return out


# --------------------------------------------------------------------------- page
# Extends bokeh's own file template (bokeh puts "{% extends base %}" before a template
# given as a string): the page's head style, header and layout; plot_script follows.
_TEMPLATE = """\
{% block postamble %}
<style>
  html { height: auto; overflow-y: scroll; }  /* a scrollbar from the start: widths stay */
  body { height: auto; }
  body { margin: 0; padding: 10px 18px 18px 18px; color: #222; background: #fff;
         font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
  header { display: flex; align-items: baseline; gap: 24px; flex-wrap: wrap;
           border-bottom: 1px solid #ddd; padding-bottom: 6px; margin-bottom: 6px; }
  header h1 { font-size: 20px; margin: 0; font-weight: 600; }
  header h1 span { color: #76b900; }
  header nav a { margin-right: 14px; color: #1f5fa8; text-decoration: none; font-size: 14px; }
  header nav a:hover { text-decoration: underline; }
  h2 { font-size: 15px; margin: 14px 0 4px 0; color: #333; font-weight: 600; }
  .cudask-grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr);
                 gap: 24px; align-items: start; }
  .cudask-scroll { max-height: 600px; overflow-y: auto; overflow-x: hidden; }
  .cudask-key { font-size: 13px; margin: 0 0 4px 0; }
  .cudask-key span { margin-right: 14px; white-space: nowrap; }
  .cudask-key i { display: inline-block; width: 12px; height: 12px; margin-right: 5px;
                  vertical-align: -1px; }
  .cudask-key i.limit { width: 3px; height: 14px; }
  .cudask-note { font-size: 12px; color: #666; margin: 4px 0 0 0; }
  @media (max-width: 1100px) { .cudask-grid { grid-template-columns: minmax(0, 1fr); } }
</style>
{% endblock %}
{% block contents %}
<header>
  <h1><span>cudask</span> GPU workers</h1>
  <nav>
    <a href="status">Dask dashboard</a><a href="workers">Dask workers</a>
    <a href="cudask/api/workers.json">workers.json</a>
    <a href="cudask/api/history.json">history.json</a>
  </nav>
</header>
{{ embed(roots["cudask-status"]) }}
<h2>Workers, one row per GPU</h2>
{{ embed(roots["cudask-table"]) }}
<p class="cudask-note">Sizes of each worker's data store tiers. Spill: device to host,
unspill: host to device, GB/s over the last 10 s. GPU, PCIe and NVLink figures come from
NVML and are empty where the GPU does not report them. Hover a GPU for its model and UUID.</p>
<div class="cudask-grid">
  <div>
    <h2>Memory tiers per worker</h2>
    <div class="cudask-key">
      <span><i style="background: {{ colors.device }}"></i>device</span>
      <span><i style="background: {{ colors.host }}"></i>host</span>
      <span><i style="background: {{ colors.disk }}"></i>disk</span>
      <span><i class="limit" style="background: {{ colors.limit }}"></i>device limit</span>
    </div>
    <div class="cudask-scroll">{{ embed(roots["cudask-bars"]) }}</div>
  </div>
  <div>
    <h2>Spill and unspill rates, last 5 minutes</h2>
    {{ embed(roots["cudask-spill"]) }}
    {{ embed(roots["cudask-unspill"]) }}
  </div>
</div>
{% endblock %}
{% block inner_body %}
{{ super() }}
<script>
/* Say so when the scheduler stops answering, rather than showing old figures. */
setInterval(function () {
  if (typeof Bokeh === "undefined" || !Bokeh.documents.length) { return; }
  var doc = Bokeh.documents[0];
  var source = doc.get_model_by_name("cudask-columns");
  var status = doc.get_model_by_name("cudask-status");
  if (!source || !status) { return; }
  var last = source.last_fetch_time;
  if (last == null || Date.now() - last.getTime() > 5000) {
    var since = last == null ? "" : " since " + last.toLocaleTimeString();
    status.text = '<b style="color:#b00020">no answer from the scheduler' + since +
      " (the page reads cudask/api/columns.json)</b>";
  }
}, 2500);
</script>
{% endblock %}
"""

_COLUMNS_ADAPTER = """
const body = cb_data.response;
status.text = body.status + ' · <span style="color:#666">updated ' +
  new Date().toLocaleTimeString() + '</span>';
const columns = body.columns;
// JSON has no NaN: an unknown limit (null) must not be drawn at 0
columns.limit_bytes = columns.limit_bytes.map((v) => v == null ? NaN : v);
return columns;
"""

_HISTORY_ADAPTER = """
const body = cb_data.response;
spill_total.data = body.spill.total;
unspill_total.data = body.unspill.total;
unspill_workers.data = body.unspill.workers;
return body.spill.workers;
"""

_BYTES_TICK = """
const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
let v = tick;
let i = 0;
while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
return (Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
"""

# Table sorting: names and hosts in natural order ("gpu-2" before "gpu-10");
# figures by their value, units included ("512.00 MiB" before "1.00 GiB").
_NATURAL_ORDER = """
return String(x ?? "").localeCompare(String(y ?? ""), undefined, {numeric: true});
"""

_QUANTITY_ORDER = """
const units = {B: 1, kiB: 2 ** 10, KiB: 2 ** 10, MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40,
               PiB: 2 ** 50};
const value = (text) => {
  const m = /^(<?)\\s*(-?[0-9.]+)\\s*([kKMGTP]?i?B)?/.exec(String(text ?? ""));
  if (m == null) { return -Infinity; }  // unknown: below every figure
  return parseFloat(m[2]) * (m[3] ? (units[m[3]] ?? 1) : 1) * (m[1] ? 0.5 : 1);
};
const a = value(x);
const b = value(y);
return a < b ? -1 : a > b ? 1 : 0;
"""

_ON_ROWS = """
const names = source.get_column("name");
const n = names.length;
const factors = Array.from(names).reverse();
if (JSON.stringify(factors) !== JSON.stringify(y_range.factors)) {
  y_range.factors = factors;
}
const height = Math.max(160, 70 + row_px * n);
if (bars.height !== height) { bars.height = height; }
const table_height = Math.min(Math.max(80, 32 + table_row_px * n), 460);
if (table.height !== table_height) { table.height = table_height; }
// The table redraws by itself only when the number of rows changes; new figures
// in the same rows need this nudge (what its CDSView emits when its rows change).
table.view.change.emit();
"""


@functools.cache
def page_html() -> str:
    """The page: one self-contained HTML document (bokeh inlined)."""
    return _render()


def _render() -> str:
    from bokeh.core.properties import field
    from bokeh.embed import file_html
    from bokeh.models import (
        AdaptiveTicker,
        AjaxDataSource,
        BasicTickFormatter,
        ColumnDataSource,
        CustomJS,
        CustomJSTickFormatter,
        DataRange1d,
        FactorRange,
        HoverTool,
        LinearAxis,
    )
    from bokeh.models.annotations.legends import Legend, LegendItem
    from bokeh.models.comparisons import CustomJSCompare
    from bokeh.models.widgets.markups import Div
    from bokeh.models.widgets.tables import (
        DataTable,
        HTMLTemplateFormatter,
        StringFormatter,
        TableColumn,
    )
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    api = PAGE.lstrip("/") + "/api/"  # relative to the page: "cudask/api/..."
    status = Div(name="cudask-status", sizing_mode="stretch_width",
                 text="loading&hellip; (the page reads cudask/api/columns.json every second)",
                 styles={"font-size": "14px", "padding": "4px 0"})
    source = AjaxDataSource(
        name="cudask-columns", data_url=api + "columns.json", method="GET",
        polling_interval=POLL_MS, mode="replace",
        data={name: [] for name in TABLE_COLUMNS},
        adapter=CustomJS(args={"status": status}, code=_COLUMNS_ADAPTER),
    )

    left, right = StringFormatter(), StringFormatter(text_align="right")
    gpu = HTMLTemplateFormatter(template='<span title="<%- gpu_title %>"><%- value %></span>')
    natural, quantity = CustomJSCompare(code=_NATURAL_ORDER), CustomJSCompare(code=_QUANTITY_ORDER)
    spec = (
        ("name", "worker", 120, left), ("host", "host", 100, left), ("gpu", "GPU", 115, gpu),
        ("device", "device used / limit", 170, right), ("device_pct", "device", 60, right),
        ("host_tier", "host tier", 90, right), ("disk_tier", "disk tier", 90, right),
        ("pinned", "pinned in use / reserved", 170, right),
        ("spill", "spill GB/s", 80, right), ("unspill", "unspill GB/s", 90, right),
        ("util", "GPU util", 65, right), ("gpu_memory", "GPU mem used / total", 165, right),
        ("pcie", "PCIe tx / rx GB/s", 125, right), ("nvlink", "NVLink tx / rx GB/s", 135, right),
    )
    columns = [TableColumn(field=f, title=t, width=w, formatter=fmt,
                           sorter=quantity if fmt is right else natural)
               for f, t, w, fmt in spec]
    table = DataTable(name="cudask-table", source=source, columns=columns, index_position=None,
                      sortable=True, reorderable=False, height=120, row_height=_TABLE_ROW_PX,
                      sizing_mode="stretch_width", autosize_mode="force_fit")

    y_range = FactorRange(factors=[], range_padding=0.6, range_padding_units="absolute")
    bars = figure(name="cudask-bars", y_range=y_range, x_range=DataRange1d(start=0),
                  height=160, sizing_mode="stretch_width", x_axis_location="above",
                  toolbar_location=None, tools="")
    tiers = ["device_bytes", "host_bytes", "disk_bytes"]
    renderers = bars.hbar_stack(
        tiers, y="name", height=0.7, source=source,
        color=[_TIER_COLORS["device"], _TIER_COLORS["host"], _TIER_COLORS["disk"]],
    )
    limit = bars.scatter(x="limit_bytes", y="name", source=source, marker="dash",
                         angle=math.pi / 2, size=_BAR_ROW_PX, line_width=3, color=_LIMIT_COLOR)
    bars.add_tools(HoverTool(renderers=[*renderers, limit], tooltips=[
        ("worker", "@name"), ("device", "@device"), ("host tier", "@host_tier"),
        ("disk tier", "@disk_tier"), ("GPU", "@gpu_title"),
    ]))
    bars.xaxis.ticker = AdaptiveTicker(base=2, mantissas=[1], min_interval=1, num_minor_ticks=0)
    bars.xaxis.formatter = CustomJSTickFormatter(code=_BYTES_TICK)
    bars.ygrid.grid_line_color = None
    bars.outline_line_color = None

    source.js_on_change("data", CustomJS(
        args={"source": source, "y_range": y_range, "bars": bars, "table": table,
              "row_px": _BAR_ROW_PX, "table_row_px": _TABLE_ROW_PX},
        code=_ON_ROWS,
    ))

    empty: dict[str, list[Any]] = {name: [] for name in _LINE_COLUMNS}
    lines = {
        (rate, part): ColumnDataSource(name=f"cudask-{rate}-{part}", data=dict(empty))
        for rate in RATES for part in ("total", "workers")
    }
    # One request a second for both charts: this source's adapter hands the other
    # three their columns.
    history = AjaxDataSource(
        name="cudask-history", data_url=api + "history-columns.json", method="GET",
        polling_interval=POLL_MS, mode="replace", data=dict(empty),
        adapter=CustomJS(args={"spill_total": lines["spill", "total"],
                               "unspill_total": lines["unspill", "total"],
                               "unspill_workers": lines["unspill", "workers"]},
                         code=_HISTORY_ADAPTER),
    )
    lines["spill", "workers"] = history
    charts = {}
    for rate, title in (("spill", "spill, device to host (GB/s)"),
                        ("unspill", "unspill, host to device (GB/s)")):
        per_worker, cluster = DataRange1d(start=0), DataRange1d(start=0)
        chart = figure(name=f"cudask-{rate}", title=title, height=250,
                       sizing_mode="stretch_width", x_range=DataRange1d(end=0, range_padding=0),
                       y_range=per_worker, y_axis_label="per worker",
                       x_axis_label="seconds before now", toolbar_location=None, tools="")
        chart.extra_y_ranges = {"total": cluster}
        chart.add_layout(LinearAxis(y_range_name="total", axis_label="cluster total"), "right")
        for axis in chart.yaxis:
            axis.formatter = BasicTickFormatter(use_scientific=False)
        # (bokeh's stubs type renderers as GlyphRenderer[Glyph], which MultiLine's is not)
        total: Any = chart.multi_line(xs="xs", ys="ys", line_color="color",
                                      line_width="width", source=lines[rate, "total"],
                                      y_range_name="total")
        workers: Any = chart.multi_line(xs="xs", ys="ys", line_color="color",
                                        line_width="width", source=lines[rate, "workers"])
        per_worker.renderers = [workers]
        cluster.renderers = [total]
        chart.add_tools(HoverTool(tooltips=[("line", "@label")]))
        legend = Legend(items=[LegendItem(label=field("label"), renderers=[total]),
                               LegendItem(label=field("label"), renderers=[workers])])
        legend.update(label_text_font_size="11px", spacing=0, padding=4)
        chart.add_layout(legend, "right")
        charts[rate] = chart

    return file_html(
        [status, table, bars, charts["spill"], charts["unspill"]], INLINE,
        title="cudask: GPU workers", template=_TEMPLATE,
        template_variables={"colors": {**_TIER_COLORS, "limit": _LIMIT_COLOR}},
    )


__all__ = [
    "API",
    "PAGE",
    "POLL_MS",
    "RATES",
    "TABLE_COLUMNS",
    "TOP",
    "JSONHandler",
    "MonitorSource",
    "PageHandler",
    "columns_view",
    "history_columns",
    "history_view",
    "page_html",
    "page_link",
    "routes",
    "status_html",
    "table_columns",
]
