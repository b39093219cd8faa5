"""Helpers of the dashboard page's tests (test_page*.py): a tornado server for
routes in a thread of its own (`Served`; the `serve` fixture is in conftest.py), a
plain GET, and a headless Chromium driven through its DevTools protocol (`Chromium`,
with what the page shows as `PageState` and scripts for a user's clicks and scrolls).

Chromium is driven through its DevTools protocol rather than `--dump-dom`:
bokeh 3 renders its widgets into shadow DOM, which `--dump-dom` leaves out."""

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application
from tornado.websocket import WebSocketClosedError, websocket_connect


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
    return (
        f"(() => {{ {_FIND_JS} const v = find(document, 'slick-viewport'); "
        f"v.scrollTop = {pixels}; v.dispatchEvent(new Event('scroll')); }})()"
    )


#: What the page shows, read in the browser: the table's rendered rows (cell
#: texts), the status line, and the sizes of the sources behind the charts.
_STATE_JS = (
    r"""
(() => {
"""
    + _FIND_JS
    + r"""
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
)


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

    def open(
        self,
        url: str,
        until: Callable[[PageState], bool],
        *,
        timeout: float = 90.0,
        screenshot: Path | None = None,
        size: tuple[int, int] = (1400, 1000),
        steps: Sequence[tuple[str, Callable[[PageState], bool]]] = (),
    ) -> PageState:
        """Load `url`; poll what it shows until `until(state)` holds on two polls in
        a row with the page no wider than the window (layouts settle in steps), or
        `timeout` seconds (then return the last state: the test's assertions say
        what was missing). Then for each (script, condition) of `steps`: run the
        script in the page (a user's click, scroll) and poll until the condition
        holds likewise."""
        with tempfile.TemporaryDirectory(
            prefix="cudask-chromium-", ignore_cleanup_errors=True
        ) as profile:
            # its own session: the browser's helper processes end with it (below)
            process = subprocess.Popen(
                [
                    self.binary,
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--remote-debugging-port=0",
                    f"--user-data-dir={profile}",
                    f"--window-size={size[0]},{size[1]}",
                    "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                return asyncio.run(
                    self._drive(Path(profile), url, until, timeout, screenshot, size, steps)
                )
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

    async def _drive(
        self,
        profile: Path,
        url: str,
        until: Callable[[PageState], bool],
        timeout: float,
        screenshot: Path | None,
        size: tuple[int, int],
        steps: Sequence[tuple[str, Callable[[PageState], bool]]],
    ) -> PageState:
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
                message = await asyncio.wait_for(
                    ws.read_message(), max(deadline - time.monotonic(), 1)
                )
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
                errors.append(
                    "exception: "
                    + str(details.get("exception", {}).get("description") or details.get("text"))
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(
                    "console: "
                    + " ".join(
                        str(a.get("value", a.get("description"))) for a in params.get("args", [])
                    )
                )
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                if entry.get("level") == "error" and "favicon" not in str(entry.get("url")):
                    errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

        try:
            await call("Runtime.enable")
            await call("Log.enable")
            await call("Page.enable")
            await call(
                "Emulation.setDeviceMetricsOverride",
                width=size[0],
                height=size[1],
                deviceScaleFactor=1,
                mobile=False,
            )
            await call("Page.navigate", url=url)
            state = PageState()
            for script, condition in [("", until), *steps]:
                if script:
                    await call("Runtime.evaluate", expression=script)
                settled = 0
                while True:
                    result = await call(
                        "Runtime.evaluate", expression=_STATE_JS, returnByValue=True
                    )
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


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
