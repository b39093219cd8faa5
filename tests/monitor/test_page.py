"""The cudask dashboard page (cudask.monitor.page, .document): its routes and
JSON, the document itself, the numbers a real scheduler serves
for workers whose stores hold fake device objects, and the page as headless
Chromium renders it (its screenshots go to the test's tmp_path; the pictures in docs/
come from scripts/dashboard-shot).

Chromium is driven through its DevTools protocol rather than `--dump-dom`:
bokeh 3 renders its widgets into shadow DOM, which `--dump-dom` leaves out.
Browser tests are skipped, saying why, where no Chromium binary exists."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster, wait
from monitor_fakes import FakeMonitor, GiB
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application
from tornado.websocket import WebSocketClosedError, websocket_connect

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.monitor.document import page_html
from cudask.monitor.page import page_link, routes
from cudask.monitor.state import MonitorPlugin
from cudask.monitor.views import TOP
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray
from cudask.worker.plugins import StoreMetrics


# ------------------------------------------------------------------ tornado server
class Served:
    """A tornado HTTP server for `routes` on 127.0.0.1, in a thread of its own."""

    def __init__(self, routes: list[Any]) -> None:
        self.routes = routes
        self.sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{self.sockets[0].getsockname()[1]}"
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = HTTPServer(Application(self.routes))
        server.add_sockets(self.sockets)
        self._ready.set()
        await self._stop.wait()
        server.stop()
        await server.close_all_connections()

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture
def serve() -> Iterator[Callable[[list[Any]], Served]]:
    """`serve(routes)`: serve tornado routes (`.url` is the base URL); closed after
    the test."""
    servers: list[Served] = []

    def start(routes: list[Any]) -> Served:
        servers.append(Served(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


# ------------------------------------------------------------------ chromium
def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


#: `find(root, cls, text?)`: the first element of class `cls` (with that text),
#: looking through bokeh's shadow roots.
_FIND_JS = r"""
const find = (root, cls, text) => {
  for (const el of root.querySelectorAll("*")) {
    if (el.classList && el.classList.contains(cls)
        && (text === undefined || el.textContent.trim() === text)) { return el; }
    if (el.shadowRoot) {
      const found = find(el.shadowRoot, cls, text);
      if (found != null) { return found; }
    }
  }
  return null;
};
"""


def click_header(title: str) -> str:
    """Script: click the table's column header `title` (sorts by that column)."""
    return f"(() => {{ {_FIND_JS} find(document, 'slick-header-column', {json.dumps(title)}).click(); }})()"


def scroll_table(pixels: int) -> str:
    """Script: scroll the table's rows by `pixels`."""
    return (f"(() => {{ {_FIND_JS} const v = find(document, 'slick-viewport'); "
            f"v.scrollTop = {pixels}; v.dispatchEvent(new Event('scroll')); }})()")


#: What the page shows, read in the browser: the table's rendered rows (cell
#: texts), the status line, and the sizes of the sources behind the charts.
_STATE_JS = r"""
(() => {
""" + _FIND_JS + r"""
  const rows = [];
  const visit = (root) => {
    for (const el of root.querySelectorAll("*")) {
      if (el.classList && el.classList.contains("slick-row")) {
        // on screen order: SlickGrid places rendered rows by their "top"
        rows.push([el.getBoundingClientRect().top,
                   Array.from(el.querySelectorAll(".slick-cell")).map((c) => c.textContent)]);
      }
      if (el.shadowRoot) { visit(el.shadowRoot); }
    }
  };
  visit(document);
  const viewport = find(document, "slick-viewport");
  const page = document.documentElement;
  rows.sort((a, b) => a[0] - b[0]);
  const out = {rows: rows.map((r) => r[1]), bokeh: typeof Bokeh !== "undefined", title: document.title,
               overflow_x: page.scrollWidth - page.clientWidth,
               table_scroll: viewport == null ? 0 : viewport.scrollTop};
  if (out.bokeh && Bokeh.documents.length) {
    const doc = Bokeh.documents[0];
    const model = (name) => doc.get_model_by_name(name);
    out.status = model("cudask-status").text;
    out.spill_total_lines = model("cudask-spill-total").get_length();
    out.spill_worker_lines = model("cudask-history").get_length();
    out.unspill_worker_lines = model("cudask-unspill-workers").get_length();
    out.bar_rows = model("cudask-bars").y_range.factors.length;
  }
  return JSON.stringify(out);
})()
"""


@dataclass
class PageState:
    """The page as the browser shows it, plus what went wrong while it ran."""

    rows: list[list[str]] = field(default_factory=list)
    status: str = ""
    title: str = ""
    bokeh: bool = False
    spill_total_lines: int = 0
    spill_worker_lines: int = 0
    unspill_worker_lines: int = 0
    bar_rows: int = 0
    overflow_x: int = 0
    table_scroll: float = 0
    errors: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [row[0] for row in self.rows if row]


class Chromium:
    """Open a page in a fresh headless Chromium, wait until it shows what a test
    wants, take a screenshot, and report page errors (uncaught exceptions,
    console errors, failed loads)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def open(self, url: str, until: Callable[[PageState], bool], *, timeout: float = 90.0,
             screenshot: Path | None = None, size: tuple[int, int] = (1400, 1000),
             steps: Sequence[tuple[str, Callable[[PageState], bool]]] = ()) -> PageState:
        """Load `url`; poll what it shows until `until(state)` holds on two polls in
        a row with the page no wider than the window (layouts settle in steps), or
        `timeout` seconds (then return the last state: the test's assertions say
        what was missing). Then for each (script, condition) of `steps`: run the
        script in the page (a user's click, scroll) and poll until the condition
        holds likewise."""
        with tempfile.TemporaryDirectory(prefix="cudask-chromium-",
                                         ignore_cleanup_errors=True) as profile:
            # its own session: the browser's helper processes end with it (below)
            process = subprocess.Popen(
                [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu",
                 "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
                 f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                 "about:blank"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            try:
                return asyncio.run(self._drive(Path(profile), url, until, timeout, screenshot,
                                               size, steps))
            finally:
                try:  # Browser.close (sent by _drive) lets it shut down cleanly
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.terminate()
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(30)
                with contextlib.suppress(ProcessLookupError):  # helpers still running, if any
                    os.killpg(process.pid, signal.SIGKILL)

    async def _drive(self, profile: Path, url: str, until: Callable[[PageState], bool],
                     timeout: float, screenshot: Path | None, size: tuple[int, int],
                     steps: Sequence[tuple[str, Callable[[PageState], bool]]]) -> PageState:
        deadline = time.monotonic() + timeout
        port_file = profile / "DevToolsActivePort"
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium wrote no {port_file} in {timeout} s")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/json/list")
        target = next(t for t in json.loads(response.body) if t.get("type") == "page")
        ws = await websocket_connect(target["webSocketDebuggerUrl"], max_message_size=1 << 28)
        errors: list[str] = []
        counter = 0

        async def call(method: str, **params: Any) -> dict[str, Any]:
            nonlocal counter
            counter += 1
            mine = counter
            await ws.write_message(json.dumps({"id": mine, "method": method, "params": params}))
            while True:
                message = await asyncio.wait_for(ws.read_message(), max(deadline - time.monotonic(), 1))
                if message is None:
                    raise ConnectionError("chromium closed the DevTools connection")
                event = json.loads(message)
                if event.get("id") == mine:
                    if "error" in event:
                        raise RuntimeError(f"{method}: {event['error']}")
                    return dict(event.get("result", {}))
                record(event)

        def record(event: dict[str, Any]) -> None:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                errors.append("exception: " + str(details.get("exception", {}).get("description")
                                                  or details.get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                      for a in params.get("args", [])))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                if entry.get("level") == "error" and "favicon" not in str(entry.get("url")):
                    errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

        try:
            await call("Runtime.enable")
            await call("Log.enable")
            await call("Page.enable")
            await call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1],
                       deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            state = PageState()
            for script, condition in [("", until), *steps]:
                if script:
                    await call("Runtime.evaluate", expression=script)
                settled = 0
                while True:
                    result = await call("Runtime.evaluate", expression=_STATE_JS,
                                        returnByValue=True)
                    value = result.get("result", {}).get("value")
                    if isinstance(value, str):
                        state = PageState(**json.loads(value))
                    state.errors = list(errors)
                    settled = settled + 1 if condition(state) and state.overflow_x <= 0 else 0
                    if settled >= 2 or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.25)
            if screenshot is not None:
                shot = await call("Page.captureScreenshot", format="png")
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            return state
        finally:
            with contextlib.suppress(WebSocketClosedError):  # the browser is gone already
                await ws.write_message(json.dumps({"id": 0, "method": "Browser.close"}))
            ws.close()


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium binary (chromium, chromium-browser, google-chrome) on PATH; "
                    "install it (Debian: apt-get install -y chromium) to run the browser tests")
    return Chromium(binary)


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()



@pytest.mark.parametrize(("link", "page"), [
    ("http://127.0.0.1:8787/status", "http://127.0.0.1:8787/cudask"),
    ("https://hub.example.org/user/me/proxy/8787/status",
     "https://hub.example.org/user/me/proxy/8787/cudask"),
    ("http://host:8787/dask/status?token=x", "http://host:8787/dask/cudask?token=x"),
    ("http://host:8787/", "http://host:8787/cudask"),
    ("http://host:8787", "http://host:8787/cudask"),
])
def test_page_link(link: str, page: str) -> None:
    assert page_link(link) == page


def test_page_link_refuses_nothing() -> None:
    with pytest.raises(ValueError, match=r"dashboard_link='': expected the dashboard's address"):
        page_link("")


def test_page_is_one_self_contained_document() -> None:
    html = page_html()
    assert html.startswith("<!DOCTYPE html>") or html.lstrip().startswith("<!DOCTYPE html>")
    assert "<title>cudask: GPU workers</title>" in html
    assert "https://cdn.bokeh.org" not in html and "<script src=" not in html  # inlined: offline
    for url in ("cudask/api/columns.json", "cudask/api/history-columns.json"):
        assert f'"{url}"' in html  # relative: works under a prefix or a proxy
    assert '"/cudask/api/' not in html


# ==================================================================== routes
def test_routes_serve_json_never_cached_under_any_prefix(
    serve: Callable[[list[Any]], Served],
) -> None:
    base = serve(routes(FakeMonitor(3))).url
    for prefix in ("", "/dask", "/user/me/proxy/8787"):
        status, headers, body = get(f"{base}{prefix}/cudask/api/workers.json")
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        assert "no-store" in headers["Cache-Control"]
        assert [r["name"] for r in json.loads(body)["workers"]] == ["gpu-0", "gpu-1", "gpu-2"]
    status, _, body = get(f"{base}/cudask/api/columns.json")
    columns = json.loads(body)
    assert status == 200 and columns["rows"] == 3 and columns["columns"]["name"][2] == "gpu-2"
    assert "3 workers" in columns["status"]
    status, _, body = get(f"{base}/cudask/api/history.json")
    assert status == 200 and len(json.loads(body)["time"]) == 300
    status, _, body = get(f"{base}/cudask/api/history-columns.json")
    assert status == 200 and set(json.loads(body)) == {"spill", "unspill"}
    status, headers, body = get(f"{base}/dask/cudask")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"cudask: GPU workers" in body
    assert get(f"{base}/cudask/")[0] == 200  # redirected to /cudask
    assert get(f"{base}/cudask/api/nothing.json")[0] == 404


def test_json_has_no_nan(serve: Callable[[list[Any]], Served]) -> None:
    class NaNMonitor(FakeMonitor):
        def snapshot(self) -> dict[str, Any]:
            snap = super().snapshot()
            snap["workers"][0]["spill_gbps"] = float("nan")
            snap["workers"][0]["device_bytes"] = float("inf")
            return snap

    base = serve(routes(NaNMonitor(1))).url
    status, _, body = get(f"{base}/cudask/api/workers.json")
    assert status == 200 and json.loads(body)["workers"][0]["spill_gbps"] is None
    status, _, body = get(f"{base}/cudask/api/columns.json")
    assert status == 200 and json.loads(body)["columns"]["spill"] == [""]


# ==================================================================== a real scheduler
MiB = 1 << 20
DEVICE_LIMIT = 32 * MiB
CHUNK = 4 * MiB


def make_chunk(i: int) -> FakeDeviceArray:
    chunk = FakeDeviceArray.empty(CHUNK, "u1")
    chunk.fill(i % 251)
    return chunk


def first_byte(chunk: FakeDeviceArray) -> int:
    return int(chunk.get()[0])


def churn(client: Client, held: list[Any], stop: threading.Event) -> None:
    """Keep the workers spilling and unspilling until `stop`: new chunks push older
    ones off the device, tasks reading the `held` chunks (most of them spilled)
    bring those back."""
    k = 1000
    while not stop.is_set():
        chunks = client.map(make_chunk, range(k, k + 4), pure=False)
        older = [held[(k + 7 * j) % len(held)] for j in range(3)]
        wait(client.map(first_byte, chunks + older, pure=False), timeout=120)
        del chunks
        k += 4
        stop.wait(0.2)


@dataclass
class Running:
    cluster: LocalCluster
    client: Client
    stores: list[TieredStore]
    futures: list[Any]

    @property
    def base(self) -> str:
        return self.cluster.dashboard_link.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    """A scheduler with the MonitorPlugin and two in-process workers whose data
    stores (TieredStore on the fake copy backend, 32 MiB device tier, 16 MiB host
    tier) hold 20 fake device arrays of 4 MiB: some on device, the rest spilled
    to host and disk. The futures are kept, so the data stays."""
    stores: list[TieredStore] = []

    def make_store(worker_local_directory: str) -> TieredStore:
        store = TieredStore(device_memory_limit=DEVICE_LIMIT, memory_limit=16 * MiB,
                            worker_local_directory=worker_local_directory,
                            backend=FakeCopyBackend(),
                            settings=store_settings(DEVICE_LIMIT, 16 * MiB, pinned_preallocate=False,
                                                    pinned_pool_size=128 * MiB,
                                                    pinned_slab_size=8 * MiB))
        stores.append(store)
        return store

    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address=":0", worker_dashboard_address=None,
                      scheduler_kwargs={"plugins": [MonitorPlugin()]}, data=make_store,
                      plugins=(StoreMetrics(),)) as cluster, Client(cluster) as client:
        futures = client.map(make_chunk, range(20))
        wait(futures, timeout=120)
        yield Running(cluster, client, stores, futures)
        client.cancel(futures)
    for store in stores:
        store.close()


def _store_metrics(dask_worker: Any) -> dict[str, float]:
    return dict(dask_worker.data.metrics())


@pytest.mark.timeout(300)
def test_scheduler_serves_the_stores_own_numbers(running: Running) -> None:
    deadline = time.monotonic() + 180
    while True:
        metrics = running.client.run(_store_metrics)
        status, _, body = get(running.base + "/cudask/api/workers.json")
        assert status == 200
        snapshot = json.loads(body)
        rows = {row["address"]: row for row in snapshot["workers"]}
        same = set(rows) == set(metrics) and all(
            rows[a]["device_bytes"] == m["device-bytes"]
            and rows[a]["host_bytes"] == m["host-bytes"]
            and rows[a]["device_limit_bytes"] == m["device-limit-bytes"]
            and rows[a]["spill_gbps"] is not None
            for a, m in metrics.items()
        )
        if same or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(rows) == set(metrics), (rows, metrics)
    for address, m in metrics.items():
        row = rows[address]
        assert row["cudask"] is True
        assert (row["device_bytes"], row["host_bytes"], row["device_limit_bytes"]) == (
            m["device-bytes"], m["host-bytes"], m["device-limit-bytes"]), (row, m)
        assert row["device_limit_bytes"] == DEVICE_LIMIT
        assert row["device_bytes"] <= DEVICE_LIMIT
        assert row["spill_gbps"] is not None
    assert snapshot["reason"] is None and snapshot["cudask_workers"] == 2
    assert sum(r["spilled_bytes_total"] for r in rows.values()) > 0  # 80 MiB > 2 x 32 MiB
    assert sum(r["host_bytes"] + r["disk_bytes"] for r in rows.values()) > 0
    # the page's own columns come from the same snapshot
    status, _, body = get(running.base + "/cudask/api/columns.json")
    columns = json.loads(body)["columns"]
    assert sorted(columns["name"]) == sorted(r["name"] for r in rows.values())
    assert all(text.endswith(" / 32.00 MiB") for text in columns["device"])
    # the address cudask prints for the page
    page = page_link(running.cluster.dashboard_link)
    assert page == running.base + "/cudask"
    status, _, body = get(page)
    assert status == 200 and b"cudask: GPU workers" in body


# ==================================================================== the page in Chromium
@pytest.mark.timeout(300)
def test_browser_shows_every_worker_of_a_running_cluster(
    running: Running, chromium: Chromium, tmp_path: Path,
) -> None:
    names = sorted(str(name) for name in running.cluster.workers)
    stop = threading.Event()
    worker = threading.Thread(target=churn, args=(running.client, running.futures, stop), daemon=True)
    worker.start()
    start = time.monotonic()

    def ready(state: PageState) -> bool:
        # every worker in the table and the bars, both moving data in the charts,
        # and 15 s of those rates for the screenshot
        return (sorted(state.names) == names and state.bar_rows == 2
                and state.spill_worker_lines == 2 and state.unspill_worker_lines >= 1
                and "2 workers" in state.status and time.monotonic() - start > 15)

    path = tmp_path / "two-workers.png"
    try:
        state = chromium.open(page_link(running.cluster.dashboard_link), ready, screenshot=path)
    finally:
        stop.set()
        worker.join(120)
    assert state.errors == []
    assert state.title == "cudask: GPU workers"
    assert sorted(state.names) == names, state
    for row in state.rows:
        assert row[3].endswith(" / 32.00 MiB"), row  # device used / limit
    assert state.bar_rows == 2 and state.spill_total_lines == 1, state
    assert state.overflow_x <= 0, state
    assert state.spill_worker_lines == 2 and state.unspill_worker_lines >= 1, state
    assert "2 workers" in state.status and "no answer" not in state.status, state.status
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_browser_table_follows_new_figures(
    serve: Callable[[list[Any]], Served], chromium: Chromium,
) -> None:
    """The same rows with new figures each second: the table shows the new ones
    (bokeh's DataTable redraws by itself only when the row count changes)."""

    class Counting(FakeMonitor):
        calls = 0

        def snapshot(self) -> dict[str, Any]:
            snapshot = super().snapshot()
            Counting.calls += 1
            for row in snapshot["workers"]:
                row["device_bytes"] = float(Counting.calls * GiB)
            return snapshot

    server = serve(routes(Counting(2)))
    shown: list[str] = []

    def until(state: PageState) -> bool:
        if state.rows:
            shown.append(state.rows[0][3])
        return len(set(shown)) >= 3

    state = chromium.open(server.url + "/cudask", until)
    assert state.errors == []
    assert len(set(shown)) >= 3, shown  # e.g. "1.00 GiB / 64.00 GiB", then 2.00, 3.00


@pytest.mark.timeout(300)
def test_browser_stays_readable_with_64_workers(
    serve: Callable[[list[Any]], Served], chromium: Chromium, tmp_path: Path,
) -> None:
    server = serve(routes(FakeMonitor(64)))

    def ready(state: PageState) -> bool:
        return (len(state.rows) >= 10 and state.bar_rows == 64
                and state.spill_worker_lines == TOP and state.spill_total_lines == 1)

    path = tmp_path / "64-workers.png"
    # 1250 px tall: the whole page at once (Chromium paints plots below the fold
    # when they are scrolled to, so a shorter capture shows them half drawn)
    state = chromium.open(server.url + "/cudask", ready, screenshot=path, size=(1400, 1250))
    assert state.errors == []
    # the table scrolls: it renders the rows in view, the first ones in order
    assert 10 <= len(state.rows) < 64
    assert state.names[:10] == [f"gpu-{i}" for i in range(10)], state.names
    assert state.bar_rows == 64 and state.overflow_x <= 0  # no sideways scrolling
    assert state.spill_worker_lines == TOP and state.spill_total_lines == 1
    assert "64 workers</b> on 8 hosts" in state.status
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_browser_says_why_there_are_no_rows(
    serve: Callable[[list[Any]], Served], chromium: Chromium,
) -> None:
    reason = "no workers are connected to this scheduler"
    server = serve(routes(FakeMonitor(0, reason=reason)))
    state = chromium.open(server.url + "/cudask", lambda s: reason in s.status)
    assert state.errors == []
    assert reason in state.status and state.rows == []


@pytest.mark.timeout(300)
def test_browser_says_when_the_scheduler_stops_answering(
    serve: Callable[[list[Any]], Served], chromium: Chromium,
) -> None:
    server = serve(routes(FakeMonitor(3)))
    stopped: list[bool] = []

    def until(state: PageState) -> bool:
        if not stopped:
            if len(state.rows) == 3:
                server.close()
                stopped.append(True)
            return False
        return "no answer from the scheduler" in state.status

    state = chromium.open(server.url + "/cudask", until)
    assert stopped, state
    assert "no answer from the scheduler" in state.status, state.status


@pytest.mark.timeout(300)
def test_browser_table_sorts_by_value_and_keeps_its_place(
    serve: Callable[[list[Any]], Served], chromium: Chromium,
) -> None:
    """Click "spill GB/s" twice (descending by value, not by text), scroll the
    rows; the order and the scroll survive the updates that follow each second.
    Click "worker": natural order (gpu-2 before gpu-10)."""
    server = serve(routes(FakeMonitor(64)))
    busiest = [f"gpu-{i}" for i in range(64) if i % 9 == 8]  # 37.60 GB/s, see synthetic_row
    updates: list[str] = []

    def sorted_down(state: PageState) -> bool:
        return state.names[: len(busiest)] == busiest

    def still_sorted_after_updates(state: PageState) -> bool:
        updates.append(state.status)
        return len(set(updates)) >= 3 and state.table_scroll > 0 and bool(state.rows)

    state = chromium.open(server.url + "/cudask", lambda s: len(s.rows) >= 10, steps=[
        (click_header("spill GB/s"), lambda s: bool(s.rows) and s.rows[0][8] == "8.00"),
        (click_header("spill GB/s"), sorted_down),
        (scroll_table(8 * 25), lambda s: s.table_scroll > 0),
        ("", still_sorted_after_updates),
    ])
    assert state.errors == []
    assert len(set(updates)) >= 3, updates  # "updated hh:mm:ss" changed: new data came
    assert state.table_scroll >= 8 * 25 - 1, state.table_scroll
    spill = [float(row[8]) for row in state.rows]
    assert spill == sorted(spill, reverse=True), spill
    state = chromium.open(server.url + "/cudask", lambda s: len(s.rows) >= 12, steps=[
        (click_header("worker"), lambda s: s.names[:3] == ["gpu-0", "gpu-1", "gpu-2"]),
    ])
    assert state.names[:12] == [f"gpu-{i}" for i in range(12)], state.names
