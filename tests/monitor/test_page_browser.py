"""The cudask dashboard page (cudask.monitor.page) on a real scheduler whose workers'
stores hold fake device objects: the numbers it serves, and the page as headless
Chromium renders it (its screenshots go to the test's tmp_path). Browser tests are skipped, saying why, where no
Chromium binary exists."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster, wait
from monitor_fakes import FakeMonitor, GiB
from page_helpers import (
    Chromium,
    PageState,
    Served,
    chromium_binary,
    click_header,
    get,
    scroll_table,
)

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.monitor.page import page_link, routes
from cudask.monitor.state import MonitorPlugin
from cudask.monitor.views import TOP
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray
from cudask.worker.metrics import StoreMetrics


@pytest.fixture(scope="session")
def chromium() -> Chromium:
    binary = chromium_binary()
    if binary is None:
        pytest.skip(
            "no Chromium binary (chromium, chromium-browser, google-chrome) on PATH; "
            "install it (Debian: apt-get install -y chromium) to run the browser tests"
        )
    return Chromium(binary)


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
        store = TieredStore(
            device_memory_limit=DEVICE_LIMIT,
            memory_limit=16 * MiB,
            worker_local_directory=worker_local_directory,
            backend=FakeCopyBackend(),
            settings=store_settings(
                DEVICE_LIMIT,
                16 * MiB,
                pinned_preallocate=False,
                pinned_pool_size=128 * MiB,
                pinned_slab_size=8 * MiB,
            ),
        )
        stores.append(store)
        return store

    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            threads_per_worker=1,
            dashboard_address=":0",
            worker_dashboard_address=None,
            scheduler_kwargs={"plugins": [MonitorPlugin()]},
            data=make_store,
            plugins=(StoreMetrics(),),
        ) as cluster,
        Client(cluster) as client,
    ):
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
            m["device-bytes"],
            m["host-bytes"],
            m["device-limit-bytes"],
        ), (row, m)
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
    running: Running,
    chromium: Chromium,
    tmp_path: Path,
) -> None:
    names = sorted(str(name) for name in running.cluster.workers)
    stop = threading.Event()
    worker = threading.Thread(
        target=churn, args=(running.client, running.futures, stop), daemon=True
    )
    worker.start()
    start = time.monotonic()

    def ready(state: PageState) -> bool:
        # every worker in the table and the bars, both moving data in the charts,
        # and 15 s of those rates for the screenshot
        return (
            sorted(state.names) == names
            and state.bar_rows == 2
            and state.spill_worker_lines == 2
            and state.unspill_worker_lines >= 1
            and "2 workers" in state.status
            and time.monotonic() - start > 15
        )

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
    serve: Callable[[list[Any]], Served],
    chromium: Chromium,
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
    serve: Callable[[list[Any]], Served],
    chromium: Chromium,
    tmp_path: Path,
) -> None:
    server = serve(routes(FakeMonitor(64)))

    def ready(state: PageState) -> bool:
        return (
            len(state.rows) >= 10
            and state.bar_rows == 64
            and state.spill_worker_lines == TOP
            and state.spill_total_lines == 1
        )

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
    serve: Callable[[list[Any]], Served],
    chromium: Chromium,
) -> None:
    reason = "no workers are connected to this scheduler"
    server = serve(routes(FakeMonitor(0, reason=reason)))
    state = chromium.open(server.url + "/cudask", lambda s: reason in s.status)
    assert state.errors == []
    assert reason in state.status and state.rows == []


@pytest.mark.timeout(300)
def test_browser_says_when_the_scheduler_stops_answering(
    serve: Callable[[list[Any]], Served],
    chromium: Chromium,
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
    serve: Callable[[list[Any]], Served],
    chromium: Chromium,
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

    state = chromium.open(
        server.url + "/cudask",
        lambda s: len(s.rows) >= 10,
        steps=[
            (click_header("spill GB/s"), lambda s: bool(s.rows) and s.rows[0][8] == "8.00"),
            (click_header("spill GB/s"), sorted_down),
            (scroll_table(8 * 25), lambda s: s.table_scroll > 0),
            ("", still_sorted_after_updates),
        ],
    )
    assert state.errors == []
    assert len(set(updates)) >= 3, updates  # "updated hh:mm:ss" changed: new data came
    assert state.table_scroll >= 8 * 25 - 1, state.table_scroll
    spill = [float(row[8]) for row in state.rows]
    assert spill == sorted(spill, reverse=True), spill
    state = chromium.open(
        server.url + "/cudask",
        lambda s: len(s.rows) >= 12,
        steps=[
            (click_header("worker"), lambda s: s.names[:3] == ["gpu-0", "gpu-1", "gpu-2"]),
        ],
    )
    assert state.names[:12] == [f"gpu-{i}" for i in range(12)], state.names
