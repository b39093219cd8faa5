"""`cudask top` / `dask cuda top`: every GPU worker's numbers in the terminal, refreshed.

Covers: connecting to a scheduler, installing cudask's MonitorPlugin there when
it lacks one (so spill and link rates are known), and showing the scheduler's
snapshot (`cudask.monitor.state.snapshot`) as a table that refreshes every
--interval seconds: per worker its device tier (used / limit), host and disk
tiers, pinned memory, spill and unspill rates, GPU utilization and memory, and
PCIe/NVLink rates where NVML counts them (blank where unknown), with totals and
the scheduler's time underneath. `--once` prints the table once; `--once --json`
prints the snapshot itself, for programs. Ctrl-C stops it with status 0.

Does not cover: gathering the numbers (cudask.monitor.state, on the scheduler;
cudask.worker.metrics.StoreMetrics, on the workers), the dashboard page
(cudask.monitor.page), nor finding the scheduler (cudask.cli.connect). Threading: the
command's thread asks, waits and redraws (Live without its refresh thread).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from cudask.cli.connect import SchedulerTarget, connect, failure_reason, scheduler_options
from cudask.cli.user_errors import CommandError
from cudask.sizes import format_bytes

if TYPE_CHECKING:
    from distributed import Client
    from rich.console import Console, RenderableType

Row = Mapping[str, Any]

#: (header, justify, rank) of the table's columns, in order. Where the terminal is
#: too narrow, columns with nothing to show go first, then those of rank 1, 2, ...;
#: rank 0 always stays.
COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("worker", "left", 0),
    ("host", "left", 4),
    ("GPU", "left", 5),
    ("device\nused / limit", "right", 0),
    ("host\ntier", "right", 0),
    ("disk\ntier", "right", 6),
    ("pinned\nreserved / in use", "right", 7),
    ("spill\nGB/s", "right", 0),
    ("unspill\nGB/s", "right", 0),
    ("GPU\nutil", "right", 8),
    ("GPU memory\nused / total", "right", 3),
    ("PCIe GB/s\ntx / rx", "right", 2),
    ("NVLink GB/s\ntx / rx", "right", 1),
)
#: spaces between two columns
GAP = 2


# ---------------------------------------------------------------------------- cells
def short_uuid(uuid: str | None) -> str:
    """`GPU-1a2b3c4d-...` -> `GPU-1a2b3c4d` (MIG UUIDs alike); '' when unknown."""
    if not uuid:
        return ""
    prefix, sep, rest = uuid.partition("-")
    return f"{prefix}-{rest[:8]}" if sep and prefix.isalpha() else uuid[:12]


def _bytes(n: float | None) -> str:
    return "" if n is None else format_bytes(int(n))


def _used_of(used: float | None, total: float | None) -> str:
    """`used / total pct%`, `used` alone without a total, '' when unknown."""
    if used is None:
        return ""
    if not total:
        return _bytes(used)
    return f"{_bytes(used)} / {_bytes(total)} {100.0 * used / total:3.0f}%"


def _device(used: float | None, limit: float | None) -> str:
    if used is not None and not limit:
        return f"{_bytes(used)} / no limit"
    return _used_of(used, limit)


def _rate(gbps: float | None) -> str:
    return "" if gbps is None else f"{gbps:.2f}"


def _pair(tx: float | None, rx: float | None) -> str:
    if tx is None and rx is None:
        return ""
    return f"{'-' if tx is None else f'{tx:.1f}'} / {'-' if rx is None else f'{rx:.1f}'}"


def _bytes_pair(a: float | None, b: float | None) -> str:
    return "" if a is None and b is None else f"{_bytes(a)} / {_bytes(b)}"


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}%"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _sum(rows: Sequence[Row], field: str) -> float | None:
    """The sum of the known values; None when none is known."""
    known = [float(r[field]) for r in rows if r.get(field) is not None]
    return sum(known) if known else None


def row_cells(row: Row) -> list[str]:
    """One worker's cells, in COLUMNS order ('' where unknown)."""
    return [
        str(row.get("name", "")),
        str(row.get("host", "")),
        short_uuid(row.get("gpu_uuid")),
        _device(row.get("device_bytes"), row.get("device_limit_bytes")),
        _bytes(row.get("host_bytes")),
        _bytes(row.get("disk_bytes")),
        _bytes_pair(row.get("pinned_reserved_bytes"), row.get("pinned_in_use_bytes")),
        _rate(row.get("spill_gbps")),
        _rate(row.get("unspill_gbps")),
        _percent(row.get("gpu_utilization")),
        _used_of(row.get("gpu_memory_used_bytes"), row.get("gpu_memory_total_bytes")),
        _pair(row.get("pcie_tx_gbps"), row.get("pcie_rx_gbps")),
        _pair(row.get("nvlink_tx_gbps"), row.get("nvlink_rx_gbps")),
    ]


def _one_per_gpu(rows: Sequence[Row]) -> list[Row]:
    """One row per GPU (host and UUID; rows of an unknown GPU each count): NVML's
    figures are the GPU's, shown alike by each of several workers on it."""
    seen: set[tuple[Any, Any]] = set()
    out = []
    for r in rows:
        key = (r.get("host"), r.get("gpu_uuid"))
        if key[1] is None or key not in seen:
            seen.add(key)
            out.append(r)
    return out


def total_cells(rows: Sequence[Row]) -> list[str]:
    """The totals row (utilization: the mean of the known ones; NVML's GPU-wide
    figures counted once per GPU)."""
    gpus = _one_per_gpu(rows)
    utilization = [
        float(r["gpu_utilization"]) for r in gpus if r.get("gpu_utilization") is not None
    ]
    hosts = len({r.get("host") for r in rows})
    return [
        _count(len(rows), "GPU worker"),
        _count(hosts, "host"),
        "total",
        _device(_sum(rows, "device_bytes"), _sum(rows, "device_limit_bytes")),
        _bytes(_sum(rows, "host_bytes")),
        _bytes(_sum(rows, "disk_bytes")),
        _bytes_pair(_sum(rows, "pinned_reserved_bytes"), _sum(rows, "pinned_in_use_bytes")),
        _rate(_sum(rows, "spill_gbps")),
        _rate(_sum(rows, "unspill_gbps")),
        f"avg {sum(utilization) / len(utilization):.0f}%" if utilization else "",
        _used_of(_sum(gpus, "gpu_memory_used_bytes"), _sum(gpus, "gpu_memory_total_bytes")),
        _pair(_sum(gpus, "pcie_tx_gbps"), _sum(gpus, "pcie_rx_gbps")),
        _pair(_sum(gpus, "nvlink_tx_gbps"), _sum(gpus, "nvlink_rx_gbps")),
    ]


def status_line(snapshot: Mapping[str, Any], interval: float | None = None) -> str:
    """The line under the table: the scheduler's time, the refresh interval and
    what is missing."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(snapshot.get("time", 0.0))))
    parts = [f"scheduler time {stamp}"]
    if interval is not None:
        parts.append(f"every {interval:g} s, Ctrl-C to quit")
    rows = list(snapshot.get("workers") or ())
    others = sum(1 for r in rows if not r.get("cudask"))
    if others and any(r.get("cudask") for r in rows):
        parts.append(f"{_count(others, 'worker')} without cudask metrics not shown")
    if not snapshot.get("plugin"):
        parts.append("rates unknown: the scheduler has no cudask-monitor plugin")
    return " · ".join(parts)


# ---------------------------------------------------------------------------- the view
def fit(cells: Sequence[Sequence[str]], width: int | None) -> list[int]:
    """The indices of the columns to show so that the table fits `width` characters
    (all of them when width is None or they fit). `cells`: the rows of cells
    (totals included), in COLUMNS order."""
    from rich.cells import cell_len

    shown = list(range(len(COLUMNS)))
    if width is None:
        return shown
    widths = [
        max([cell_len(line) for line in header.split("\n")] + [cell_len(row[i]) for row in cells])
        for i, (header, _, _) in enumerate(COLUMNS)
    ]
    empty = {i for i in shown if not any(row[i] for row in cells[:-1])}  # the last: totals
    order = sorted(
        (i for i in shown if COLUMNS[i][2] > 0), key=lambda i: (i not in empty, COLUMNS[i][2])
    )
    while order and sum(widths[i] for i in shown) + GAP * (len(shown) - 1) > width:
        shown.remove(order.pop(0))
    return shown


def render(
    snapshot: Mapping[str, Any], interval: float | None = None, width: int | None = None
) -> RenderableType:
    """The view of one snapshot: a table of the cudask workers with totals and a
    status line, or, with no cudask worker, the snapshot's reason. `width`: the
    terminal's; columns that do not fit are left out (and counted)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rows = [r for r in snapshot.get("workers") or () if r.get("cudask")]
    status = status_line(snapshot, interval)
    if not rows:
        reason = snapshot.get("reason") or "no worker reports cudask metrics"
        return Group(Text(str(reason), style="bold yellow"), Text(status, style="dim"))
    cells = [row_cells(row) for row in rows]
    totals = total_cells(rows)
    shown = fit([*cells, totals], width)
    if len(shown) < len(COLUMNS):
        status += f" · {_count(len(COLUMNS) - len(shown), 'column')} hidden: widen the terminal"
    table = Table(
        show_footer=len(rows) > 1,
        header_style="bold",
        footer_style="bold",
        pad_edge=False,
        box=None,
        padding=(0, GAP // 2),
        show_edge=False,
    )
    for i in shown:
        header, justify, _ = COLUMNS[i]
        table.add_column(
            header,
            footer=totals[i],
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
        )
    for row_text in cells:  # Text: a worker's name is not rich markup
        table.add_row(*(Text(row_text[i]) for i in shown))
    return Group(table, Text(status, style="dim"))


def render_text(
    snapshot: Mapping[str, Any], width: int = 200, interval: float | None = None
) -> str:
    """The view as plain text, `width` columns wide (tests, logs)."""
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render(snapshot, interval, width))
    return out.getvalue()


# ---------------------------------------------------------------------------- the command
def fetch(client: Client, target: SchedulerTarget) -> dict[str, Any]:
    """The scheduler's snapshot, or a one-line CommandError."""
    from cudask.monitor.state import snapshot

    try:
        return dict(client.run_on_scheduler(snapshot))
    except ImportError as exc:
        raise _no_cudask(target, exc) from None
    except OSError as exc:
        raise CommandError(
            f"lost the scheduler at {target.describe()}: {failure_reason(exc)}"
        ) from None


def _no_cudask(target: SchedulerTarget, exc: BaseException) -> CommandError:
    return CommandError(
        f"the scheduler at {target.describe()} cannot import cudask ({exc}); "
        "install cudask where the scheduler runs"
    )


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the block quietly (exit status 0); further Ctrl-Cs while the
    connection closes are ignored. Outside the main thread, only the former."""
    handler = signal.getsignal(signal.SIGINT)
    in_main = threading.current_thread() is threading.main_thread()

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    if in_main:
        signal.signal(signal.SIGINT, stop)
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        if in_main and handler is not None:
            signal.signal(signal.SIGINT, handler)


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def _view(console: Console, snapshot: Mapping[str, Any], interval: float | None) -> RenderableType:
    """The view for this console: as wide as the terminal, or, on a pipe or a file,
    with every column and the console widened to the table."""
    if console.is_terminal:
        return render(snapshot, interval, console.width)
    view = render(snapshot, interval)
    options = console.options.update_width(10_000)
    console.width = max(80, console.measure(view, options=options).maximum)
    return view


def _watch(
    client: Client, target: SchedulerTarget, interval: float, first: Mapping[str, Any]
) -> None:
    from rich.live import Live

    console = _console()
    with Live(_view(console, first, interval), console=console, auto_refresh=False) as live:
        deadline = time.monotonic()
        while True:
            deadline += interval
            time.sleep(max(0.0, deadline - time.monotonic()))
            live.update(_view(console, fetch(client, target), interval), refresh=True)
            deadline = max(deadline, time.monotonic())  # late (a slow scheduler): no burst


@click.command("top", context_settings={"help_option_names": ["-h", "--help"]})
@scheduler_options
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print the table once and exit.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --once: print the snapshot as JSON instead of the table.",
)
def top(target: SchedulerTarget, interval: float, once: bool, as_json: bool) -> None:
    """Every GPU worker's memory tiers, spill rates, GPU use and links, refreshed live.

    SCHEDULER is the scheduler's address, e.g. tcp://10.0.0.1:8786 (or use
    --scheduler-file, or DASK_SCHEDULER_ADDRESS). Installs cudask's monitor plugin
    on the scheduler when it has none, so rates are known from the next seconds on.
    """
    if as_json and not once:
        raise click.UsageError(
            "--json needs --once (the live view is for people): cudask top ADDRESS --once --json"
        )
    from cudask.monitor.state import install

    with interruptible(), connect(target) as client:
        try:
            install(client)
        except ImportError as exc:
            raise _no_cudask(target, exc) from None
        first = fetch(client, target)
        if as_json:
            click.echo(json.dumps(first, indent=2, sort_keys=True))
        elif once:
            console = _console()
            console.print(_view(console, first, None))
        else:
            _watch(client, target, interval, first)
