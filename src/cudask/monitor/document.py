"""The cudask dashboard page as one static HTML document, made with bokeh.

Covers: `page_html()`, one self-contained document made with bokeh's embedding
API (`file_html`, bokeh's JavaScript inlined, so it works on machines with no
network). Its table and charts read the JSON API (`cudask.monitor.views`) with
`AjaxDataSource` every `POLL_MS` through relative URLs, so the page works under
the dashboard's `--dashboard-prefix` and behind a proxy. It shows one table row
and one stacked bar (device / host / disk, device limit marked) per GPU worker,
the spill and unspill rates of the last minutes (the cluster total and the
`TOP` busiest workers), and a status line that always says what is shown, or
why nothing is (the snapshot's reason, or that the scheduler stopped answering).

Does not cover: the figures and their formatting (`cudask.monitor.views`),
serving it (`cudask.monitor.page`). Imports bokeh; load it only to draw.

Threading: `page_html()` is made once per process (cached); call it from the
scheduler's event loop, as the page's handler does.
"""

from __future__ import annotations

import functools
import math
from typing import Any

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

from cudask.monitor.views import LINE_COLUMNS, PAGE, RATES, TABLE_COLUMNS

#: Milliseconds between two reads of the JSON API by the page.
POLL_MS = 1000

_TIER_COLORS = {"device": "#76b900", "host": "#4c78a8", "disk": "#b279a2"}
_LIMIT_COLOR = "#d62728"
_TABLE_ROW_PX = 25
_BAR_ROW_PX = 22


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
    api = PAGE.lstrip("/") + "/api/"  # relative to the page: "cudask/api/..."
    status, source = _status_and_columns(api)
    table = _table(source)
    bars, y_range = _bars(source)
    source.js_on_change(
        "data",
        CustomJS(
            args={
                "source": source,
                "y_range": y_range,
                "bars": bars,
                "table": table,
                "row_px": _BAR_ROW_PX,
                "table_row_px": _TABLE_ROW_PX,
            },
            code=_ON_ROWS,
        ),
    )
    charts = _rate_charts(api)
    return file_html(
        [status, table, bars, charts["spill"], charts["unspill"]],
        INLINE,
        title="cudask: GPU workers",
        template=_TEMPLATE,
        template_variables={"colors": {**_TIER_COLORS, "limit": _LIMIT_COLOR}},
    )


def _status_and_columns(api: str) -> tuple[Div, AjaxDataSource]:
    """The status line, and the source reading columns.json that also updates it."""
    status = Div(
        name="cudask-status",
        sizing_mode="stretch_width",
        text="loading&hellip; (the page reads cudask/api/columns.json every second)",
        styles={"font-size": "14px", "padding": "4px 0"},
    )
    source = AjaxDataSource(
        name="cudask-columns",
        data_url=api + "columns.json",
        method="GET",
        polling_interval=POLL_MS,
        mode="replace",
        data={name: [] for name in TABLE_COLUMNS},
        adapter=CustomJS(args={"status": status}, code=_COLUMNS_ADAPTER),
    )
    return status, source


def _table(source: AjaxDataSource) -> DataTable:
    """One row per worker; figures sort by value, names in natural order."""
    left, right = StringFormatter(), StringFormatter(text_align="right")
    gpu = HTMLTemplateFormatter(template='<span title="<%- gpu_title %>"><%- value %></span>')
    natural, quantity = CustomJSCompare(code=_NATURAL_ORDER), CustomJSCompare(code=_QUANTITY_ORDER)
    spec = (
        ("name", "worker", 120, left),
        ("host", "host", 100, left),
        ("gpu", "GPU", 115, gpu),
        ("device", "device used / limit", 170, right),
        ("device_pct", "device", 60, right),
        ("host_tier", "host tier", 90, right),
        ("disk_tier", "disk tier", 90, right),
        ("pinned", "pinned in use / reserved", 170, right),
        ("spill", "spill GB/s", 80, right),
        ("unspill", "unspill GB/s", 90, right),
        ("util", "GPU util", 65, right),
        ("gpu_memory", "GPU mem used / total", 165, right),
        ("pcie", "PCIe tx / rx GB/s", 125, right),
        ("nvlink", "NVLink tx / rx GB/s", 135, right),
    )
    columns = [
        TableColumn(
            field=f, title=t, width=w, formatter=fmt, sorter=quantity if fmt is right else natural
        )
        for f, t, w, fmt in spec
    ]
    return DataTable(
        name="cudask-table",
        source=source,
        columns=columns,
        index_position=None,
        sortable=True,
        reorderable=False,
        height=120,
        row_height=_TABLE_ROW_PX,
        sizing_mode="stretch_width",
        autosize_mode="force_fit",
    )


def _bars(source: AjaxDataSource) -> tuple[figure, FactorRange]:
    """One stacked bar per worker (device / host / disk), its device limit marked."""
    y_range = FactorRange(factors=[], range_padding=0.6, range_padding_units="absolute")
    bars = figure(
        name="cudask-bars",
        y_range=y_range,
        x_range=DataRange1d(start=0),
        height=160,
        sizing_mode="stretch_width",
        x_axis_location="above",
        toolbar_location=None,
        tools="",
    )
    tiers = ["device_bytes", "host_bytes", "disk_bytes"]
    renderers = bars.hbar_stack(
        tiers,
        y="name",
        height=0.7,
        source=source,
        color=[_TIER_COLORS["device"], _TIER_COLORS["host"], _TIER_COLORS["disk"]],
    )
    limit = bars.scatter(
        x="limit_bytes",
        y="name",
        source=source,
        marker="dash",
        angle=math.pi / 2,
        size=_BAR_ROW_PX,
        line_width=3,
        color=_LIMIT_COLOR,
    )
    bars.add_tools(
        HoverTool(
            renderers=[*renderers, limit],
            tooltips=[
                ("worker", "@name"),
                ("device", "@device"),
                ("host tier", "@host_tier"),
                ("disk tier", "@disk_tier"),
                ("GPU", "@gpu_title"),
            ],
        )
    )
    bars.xaxis.ticker = AdaptiveTicker(base=2, mantissas=[1], min_interval=1, num_minor_ticks=0)
    bars.xaxis.formatter = CustomJSTickFormatter(code=_BYTES_TICK)
    bars.ygrid.grid_line_color = None
    bars.outline_line_color = None
    return bars, y_range


def _rate_charts(api: str) -> dict[str, figure]:
    """One chart per rate in RATES, all fed by one request a second."""
    empty: dict[str, list[Any]] = {name: [] for name in LINE_COLUMNS}
    lines = {
        (rate, part): ColumnDataSource(name=f"cudask-{rate}-{part}", data=dict(empty))
        for rate in RATES
        for part in ("total", "workers")
    }
    # One request a second for both charts: this source's adapter hands the other
    # three their columns.
    history = AjaxDataSource(
        name="cudask-history",
        data_url=api + "history-columns.json",
        method="GET",
        polling_interval=POLL_MS,
        mode="replace",
        data=dict(empty),
        adapter=CustomJS(
            args={
                "spill_total": lines["spill", "total"],
                "unspill_total": lines["unspill", "total"],
                "unspill_workers": lines["unspill", "workers"],
            },
            code=_HISTORY_ADAPTER,
        ),
    )
    lines["spill", "workers"] = history
    charts = {}
    for rate, title in (
        ("spill", "spill, device to host (GB/s)"),
        ("unspill", "unspill, host to device (GB/s)"),
    ):
        charts[rate] = _rate_chart(rate, title, lines[rate, "total"], lines[rate, "workers"])
    return charts


def _rate_chart(
    rate: str, title: str, total_source: ColumnDataSource, workers_source: ColumnDataSource
) -> figure:
    """A rate over time: the busiest workers (left axis) and the cluster total (right)."""
    per_worker, cluster = DataRange1d(start=0), DataRange1d(start=0)
    chart = figure(
        name=f"cudask-{rate}",
        title=title,
        height=250,
        sizing_mode="stretch_width",
        x_range=DataRange1d(end=0, range_padding=0),
        y_range=per_worker,
        y_axis_label="per worker",
        x_axis_label="seconds before now",
        toolbar_location=None,
        tools="",
    )
    chart.extra_y_ranges = {"total": cluster}
    chart.add_layout(LinearAxis(y_range_name="total", axis_label="cluster total"), "right")
    for axis in chart.yaxis:
        axis.formatter = BasicTickFormatter(use_scientific=False)
    # (bokeh's stubs type renderers as GlyphRenderer[Glyph], which MultiLine's is not)
    total: Any = chart.multi_line(
        xs="xs",
        ys="ys",
        line_color="color",
        line_width="width",
        source=total_source,
        y_range_name="total",
    )
    workers: Any = chart.multi_line(
        xs="xs", ys="ys", line_color="color", line_width="width", source=workers_source
    )
    per_worker.renderers = [workers]
    cluster.renderers = [total]
    chart.add_tools(HoverTool(tooltips=[("line", "@label")]))
    legend = Legend(
        items=[
            LegendItem(label=field("label"), renderers=[total]),
            LegendItem(label=field("label"), renderers=[workers]),
        ]
    )
    legend.update(label_text_font_size="11px", spacing=0, padding=4)
    chart.add_layout(legend, "right")
    return chart


__all__ = ["POLL_MS", "page_html"]
