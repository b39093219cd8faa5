"""The cudask dashboard page (cudask.monitor.page, .document): its link, the document
itself, and its routes and JSON, served from a fake monitor. A real scheduler's numbers
and the page in headless Chromium: test_page_browser.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from monitor_fakes import FakeMonitor
from page_helpers import Served, get

from cudask.monitor.document import page_html
from cudask.monitor.page import page_link, routes


@pytest.mark.parametrize(
    ("link", "page"),
    [
        ("http://127.0.0.1:8787/status", "http://127.0.0.1:8787/cudask"),
        (
            "https://hub.example.org/user/me/proxy/8787/status",
            "https://hub.example.org/user/me/proxy/8787/cudask",
        ),
        ("http://host:8787/dask/status?token=x", "http://host:8787/dask/cudask?token=x"),
        ("http://host:8787/", "http://host:8787/cudask"),
        ("http://host:8787", "http://host:8787/cudask"),
    ],
)
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
