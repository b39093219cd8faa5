"""Serving the cudask dashboard page from the scheduler's HTTP server.

Covers: `routes(plugin)`, the tornado routes that `MonitorPlugin.start` adds to
the scheduler's dashboard server: `/cudask` (the page, `cudask.monitor.document`)
and its JSON API under `/cudask/api/` (`cudask.monitor.views.API`), never
cached. Routes match any path ending in `/cudask...`, so the page is found
under a `--dashboard-prefix` too: the scheduler does not tell its plugins the
prefix, and the page's own links are relative. Also `page_link(dashboard_link)`:
the page's address from a cluster's `dashboard_link`, for `cudask demo` and
LocalCUDACluster to print.

Does not cover: the figures (`cudask.monitor.state`), their JSON
(`cudask.monitor.views`), the document (`cudask.monitor.document`, loaded at
the first request for the page, so bokeh stays out of a scheduler nobody views).
The page is not in distributed's navigation bar, which has no public way to add
one; it is reached by its address and links back to the dashboard's pages.

Threading: the handlers run on the scheduler's event loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tornado.web import RedirectHandler, RequestHandler

from cudask.monitor.views import API, PAGE, MonitorSource, finite


# ------------------------------------------------------------------------- links
def page_link(dashboard_link: str) -> str:
    """The cudask page's address from a cluster's `dashboard_link`:
    "http://host:8787/status" -> "http://host:8787/cudask" (any prefix or proxy
    path before "status" is kept; a link not ending in "/status" gets "/cudask"
    appended to its path)."""
    if not isinstance(dashboard_link, str) or not dashboard_link.strip():
        raise ValueError(
            f"dashboard_link={dashboard_link!r}: expected the dashboard's address, "
            "e.g. 'http://127.0.0.1:8787/status'"
        )
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
        from cudask.monitor.document import page_html  # bokeh, at the first request

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
        self.write(json.dumps(finite(self.view(self.plugin)), allow_nan=False))


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
        out.append(
            (
                f"{any_prefix}{PAGE}/api/{re.escape(name)}",
                JSONHandler,
                {"plugin": plugin, "view": view},
            )
        )
    return out


__all__ = ["JSONHandler", "PageHandler", "page_link", "routes"]
