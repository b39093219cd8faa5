"""`cudask top`: the view of synthetic snapshots, `--once --json` against a live
scheduler whose workers hold cudask stores (fake device), bad input, and Ctrl-C.

CPU only. No timing is asserted; waits are generous polls.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cudask.cli.main import cli
from cudask.cli.top import COLUMNS, fit, render_text, short_uuid, total_cells
from cudask.testing import wait_for

# ------------------------------------------------------------------ synthetic snapshots
GPU_FIELDS = (
    "gpu_utilization",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "pcie_tx_gbps",
    "pcie_rx_gbps",
    "nvlink_tx_gbps",
    "nvlink_rx_gbps",
)


def row(i: int, **changes: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "name": f"gpu{i:02d}",
        "address": f"tcp://10.0.{i // 8}.1:{40000 + i}",
        "host": f"node{i // 8}",
        "gpu_uuid": f"GPU-{i:08x}-1111-2222-3333-444455556666",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "cudask": True,
        "device_bytes": (10 + i) * 2**30,
        "device_limit_bytes": 64 * 2**30,
        "host_bytes": 3 * 2**30,
        "disk_bytes": 0.0,
        "pinned_reserved_bytes": 2 * 2**30,
        "pinned_in_use_bytes": 2**30,
        "spilled_bytes_total": 5e11,
        "unspilled_bytes_total": 2e11,
        "spill_gbps": 21.5,
        "unspill_gbps": 18.25,
        "gpu_utilization": 87.0,
        "gpu_memory_used_bytes": 70 * 2**30,
        "gpu_memory_total_bytes": 80 * 2**30,
        "pcie_tx_gbps": 12.5,
        "pcie_rx_gbps": 20.0,
        "nvlink_tx_gbps": None,
        "nvlink_rx_gbps": None,
    }
    r.update(changes)
    return r


def snap(
    rows: list[dict[str, Any]], reason: str | None = None, plugin: bool = True
) -> dict[str, Any]:
    return {
        "time": 1.7e9,
        "workers": rows,
        "cudask_workers": sum(r["cudask"] for r in rows),
        "reason": reason,
        "plugin": plugin,
    }


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


@pytest.mark.parametrize("n", [8, 64])
def test_render_one_row_per_gpu_worker_with_totals(n: int) -> None:
    text = render_text(snap([row(i) for i in range(n)]), width=250, interval=1.0)
    lines = lines_of(text)
    body = [line for line in lines if line.startswith("gpu")]
    assert len(body) == n
    first = body[0]
    for cell in (
        "gpu00",
        "node0",
        "GPU-00000000",
        "10.00 GiB / 64.00 GiB",
        "16%",
        "3.00 GiB",
        "2.00 GiB / 1.00 GiB",
        "21.50",
        "18.25",
        "87%",
        "70.00 GiB / 80.00 GiB",
        "12.5 / 20.0",
    ):
        assert cell in first, (cell, first)
    (totals,) = [line for line in lines if line.startswith(f"{n} GPU workers")]
    assert f"{(n + 7) // 8} host" in totals
    assert f"{21.5 * n:.2f}" in totals and "avg 87%" in totals
    assert "scheduler time" in lines[-1] and "every 1 s" in lines[-1]
    assert "hidden" not in text  # 250 columns hold every column


def test_render_unknown_values_are_blank() -> None:
    """A worker without NVML (and no monitor plugin: no rates): GPU columns blank."""
    unknown = dict.fromkeys(("gpu_uuid", "spill_gbps", "unspill_gbps", *GPU_FIELDS))
    text = render_text(snap([row(0, **unknown)], plugin=False), width=250)
    (line,) = [line for line in lines_of(text) if line.startswith("gpu00")]
    assert line.endswith("2.00 GiB / 1.00 GiB")  # pinned is the last column with a value
    assert "GPU-" not in line and "%" in line  # device percentage only
    assert "rates unknown" in text
    cells = total_cells([row(0, **unknown)])
    assert cells[7:] == ["", "", "", "", "", ""]


def test_render_names_are_not_markup() -> None:
    bare = {"name": "[/oops]", "host": "[::1]", "cudask": True, "device_bytes": 1.0}
    text = render_text(snap([bare]), width=150)
    assert "[/oops]" in text and "[::1]" in text and "1 B / no limit" in text


def test_render_no_device_limit() -> None:
    text = render_text(snap([row(0, device_limit_bytes=0.0)]), width=250)
    assert "10.00 GiB / no limit" in text


def test_render_empty_shows_the_reason() -> None:
    reason = "no workers are connected to this scheduler"
    text = render_text(snap([], reason=reason), width=120)
    assert reason in text and "scheduler time" in text
    plain = [row(0, cudask=False, name="cpu-worker")]
    text = render_text(snap(plain, reason="none of the 1 worker(s) reports cudask metrics"))
    assert "reports cudask metrics" in text and "cpu-worker" not in text


def test_render_mixed_shows_gpu_workers_only() -> None:
    text = render_text(snap([row(0), row(1, cudask=False, name="cpu-worker")]), width=250)
    assert "gpu00" in text and "cpu-worker" not in text
    assert "1 worker without cudask metrics not shown" in text


def test_narrow_terminal_hides_columns_by_rank() -> None:
    rows = [row(i) for i in range(4)]
    text = render_text(snap(rows), width=90)
    assert all(len(line) <= 90 for line in lines_of(text))
    assert "hidden: widen the terminal" in text
    assert "gpu00" in text and "21.50" in text and "10.00 GiB / 64.00 GiB" in text
    cells = [["x"] * len(COLUMNS)] * 2
    every = list(range(len(COLUMNS)))
    assert fit(cells, None) == every and fit(cells, 10_000) == every
    core = [i for i, (_, _, rank) in enumerate(COLUMNS) if rank == 0]
    assert fit(cells, 1) == core
    by_rank = sorted((rank, i) for i, (_, _, rank) in enumerate(COLUMNS) if rank)
    one_less = fit(
        cells,
        sum(max(len(x) for x in h.split("\n")) for h, _, _ in COLUMNS) + 2 * (len(COLUMNS) - 1) - 1,
    )
    assert one_less == [i for i in every if i != by_rank[0][1]]


def test_empty_columns_go_first() -> None:
    rows = [row(i) for i in range(2)]  # NVLink unknown everywhere
    full = max(len(line) for line in lines_of(render_text(snap(rows), width=1000)))
    text = render_text(snap(rows), width=full - 1)
    assert "NVLink" not in text and "PCIe" in text and "1 column hidden" in text


def test_short_uuid() -> None:
    assert short_uuid("GPU-8a3b9c1d-1111-2222-3333-444455556666") == "GPU-8a3b9c1d"
    assert short_uuid("MIG-0f1e2d3c-aaaa-bbbb") == "MIG-0f1e2d3c"
    assert short_uuid(None) == "" and short_uuid("") == ""


# ------------------------------------------------------------------ bad input (no scheduler)
def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["top", *args], prog_name="cudask")


def test_json_needs_once() -> None:
    result = invoke("tcp://127.0.0.1:1", "--json")
    assert result.exit_code == 2 and "--json needs --once" in result.output


def test_address_and_file_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke("tcp://127.0.0.1:1", "--scheduler-file", str(tmp_path / "s.json"))
    assert result.exit_code == 2 and "not both" in result.output


def test_no_scheduler_names_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    result = invoke()
    assert result.exit_code == 2
    assert "--scheduler-file" in result.output and "address" in result.output


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read the scheduler file"),
        ("not json", "is not JSON"),
        ('{"id": "x"}', 'has no "address"'),
    ],
)
def test_bad_scheduler_file(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "scheduler.json"
    if content is not None:
        path.write_text(content)
    result = invoke("--scheduler-file", str(path))
    assert result.exit_code == 1, result.output
    assert result.output.startswith("cudask top: ") and message in result.output
    assert str(path) in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize("interval", ["0", "-1"])
def test_interval_must_be_positive(interval: str) -> None:
    result = invoke("tcp://127.0.0.1:1", "--interval", interval)
    assert result.exit_code == 2 and "--interval" in result.output


@pytest.mark.parametrize("address", ["foo://x:1", "127.0.0.1"])
def test_malformed_address_is_a_usage_error(address: str) -> None:
    result = invoke(address)
    assert result.exit_code == 2 and address in result.output


def cudask_command() -> list[str]:
    script = Path(sys.executable).parent / "cudask"
    found = str(script) if script.exists() else shutil.which("cudask")
    if found is None:
        pytest.skip("the cudask console script is not installed")
    return [found]


def test_unreachable_scheduler_one_line_at_once() -> None:
    """A refused connection fails at once, not after --timeout (here 120 s)."""
    started = time.monotonic()
    out = subprocess.run(
        [*cudask_command(), "top", "tcp://127.0.0.1:1", "--once", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [
        ("cudask top: cannot reach the scheduler at tcp://127.0.0.1:1: Connection refused")
    ], out.stderr
    assert out.stdout == ""
    assert elapsed < 60, elapsed  # the process's start included, on a busy machine


# ------------------------------------------------------------------ a live scheduler
@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[Any]]]:
    """Two in-process workers (tcp, so a subprocess can connect) whose data are
    TieredStores on the fake device, 4 MiB device tier each, StoreMetrics
    registered, 6 MiB of fake device arrays on each: 2 MiB of it spilled."""
    from distributed import Client, LocalCluster, wait

    from cudask.memory.settings import store_settings
    from cudask.memory.store import TieredStore
    from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray
    from cudask.worker.metrics import StoreMetrics

    root = tmp_path_factory.mktemp("top")
    stores: list[TieredStore] = []

    def make_store() -> TieredStore:
        store = TieredStore(
            device_memory_limit=4 << 20,
            memory_limit=1 << 30,
            backend=FakeCopyBackend(),
            settings=store_settings(
                4 << 20,
                1 << 30,
                background=False,
                pinned_preallocate=False,
                pinned_pool_size=16 << 20,
                pinned_slab_size=1 << 20,
            ),
            local_directory=str(root / f"spill{len(stores)}"),
        )
        stores.append(store)
        return store

    with (
        LocalCluster(
            n_workers=2,
            processes=False,
            threads_per_worker=1,
            protocol="tcp",
            scheduler_port=0,
            dashboard_address=":0",
            data=make_store,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(StoreMetrics())
        futures = [
            client.submit(
                FakeDeviceArray.empty,
                1 << 20,
                "u1",
                pure=False,
                workers=[address],
                allow_other_workers=False,
            )
            for address in cluster.scheduler.workers
            for _ in range(6)
        ]
        wait(futures)
        assert len(stores) == 2
        yield cluster, stores
        del futures
    for store in stores:
        store.close()


def test_once_json_matches_the_stores(gpu_cluster: tuple[Any, list[Any]]) -> None:
    cluster, stores = gpu_cluster
    by_worker = {w.address: w.data for w in cluster.workers.values()}
    assert sorted(map(id, by_worker.values())) == sorted(map(id, stores))
    expected = {address: store.metrics() for address, store in by_worker.items()}
    assert all(m["host-bytes"] > 0 and m["device-bytes"] <= 4 << 20 for m in expected.values())

    def json_once() -> dict[str, Any]:
        result = invoke(cluster.scheduler_address, "--once", "--json")
        assert result.exit_code == 0, result.output
        return dict(json.loads(result.output))

    def matches(data: dict[str, Any]) -> bool:
        rows = {r["address"]: r for r in data["workers"]}
        return set(rows) == set(expected) and all(
            rows[a]["device_bytes"] == m["device-bytes"]
            and rows[a]["host_bytes"] == m["host-bytes"]
            for a, m in expected.items()
        )

    data = json_once()
    deadline = time.monotonic() + 60  # heartbeats bring the stores' figures
    while not matches(data) and time.monotonic() < deadline:
        time.sleep(0.2)
        data = json_once()
    assert matches(data), (expected, data)
    assert sorted(data) == ["cudask_workers", "plugin", "reason", "time", "workers"]
    assert data["cudask_workers"] == 2 and data["reason"] is None and data["plugin"] is True
    for r in data["workers"]:
        assert r["cudask"] is True and r["device_limit_bytes"] == 4 << 20
        assert r["spilled_bytes_total"] >= 2 << 20  # at least 2 of the 6 MiB spilled
        assert r["gpu_uuid"] is None and r["gpu_utilization"] is None  # no NVML here
    assert "cudask-monitor" in cluster.scheduler.plugins  # installed by top


def test_once_table_and_scheduler_file(gpu_cluster: tuple[Any, list[Any]], tmp_path: Path) -> None:
    cluster, _ = gpu_cluster
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"address": cluster.scheduler_address}))
    result = invoke("--scheduler-file", str(path), "--once")
    assert result.exit_code == 0, result.output
    assert "2 GPU workers" in result.output and "4.00 MiB" in result.output
    for worker in cluster.workers.values():
        assert str(worker.name) in result.output


def test_env_address_yields_to_a_scheduler_file(
    gpu_cluster: tuple[Any, list[Any]], tmp_path: Path
) -> None:
    cluster, _ = gpu_cluster
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"address": cluster.scheduler_address}))
    result = CliRunner().invoke(
        cli,
        ["top", "--scheduler-file", str(path), "--once", "--json"],
        env={"DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:1"},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cudask_workers"] == 2


def test_ctrl_c_exits_zero_without_traceback(
    gpu_cluster: tuple[Any, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster, _ = gpu_cluster
    scheduler = cluster.scheduler
    before = set(scheduler.clients)
    fetches: list[float] = []  # run_on_scheduler calls: the plugin check, then snapshots
    run_function = scheduler.handlers["run_function"]

    def counted(comm: Any, **kwargs: Any) -> Any:  # "comm" first, as distributed looks for
        fetches.append(time.monotonic())
        return run_function(comm, **kwargs)

    monkeypatch.setitem(scheduler.handlers, "run_function", counted)
    env = {**os.environ, "COLUMNS": "250"}
    proc = subprocess.Popen(
        [*cudask_command(), "top", cluster.scheduler_address, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        connected = wait_for(
            lambda: bool(set(scheduler.clients) - before) and "cudask-monitor" in scheduler.plugins,
            timeout=90,
        )
        assert connected and proc.poll() is None, proc.communicate(timeout=30)
        from cudask.monitor.state import snapshot

        # the workers' metrics reached the plugin (heartbeats), then a few refreshes
        reported = wait_for(lambda: snapshot(scheduler).get("cudask_workers") == 2, timeout=90)
        seen = len(fetches)
        refreshed = reported and wait_for(lambda: len(fetches) >= seen + 3, timeout=90)
        assert refreshed and proc.poll() is None, (fetches, proc.communicate(timeout=30))
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    assert "2 GPU workers" in stdout  # the last view stays on the screen


def test_no_cudask_workers_shows_the_reason() -> None:
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        result = invoke(cluster.scheduler_address, "--once", "--json")
        assert result.exit_code == 0, result.output
        data = json.loads(result.output)
        assert data["cudask_workers"] == 0 and "cudask metrics" in data["reason"]
        text = invoke(cluster.scheduler_address, "--once")
        assert text.exit_code == 0 and data["reason"] in " ".join(text.output.split())
