"""`cudask config` against a live scheduler (CPU: a plain worker, so no GPU fields)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from distributed import Client, LocalCluster

from cudask.cli.main import cli


def test_config_reports_each_worker():
    with LocalCluster(
        n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        result = CliRunner().invoke(cli, ["config", cluster.scheduler_address, "--json"])
        assert result.exit_code == 0, result.output
        reports = json.loads(result.output)
        assert len(reports) == 2
        for address, report in reports.items():
            assert report["address"] == address and report["protocol"] == "inproc"
            assert report["nthreads"] == 1 and report["rmm"] is None
            assert report["gpu"] is None  # no cudask-cuda-context plugin on a plain worker
            assert report["device_ipc"].startswith("off (cudask.comm.device-ipc is false")
        text = CliRunner().invoke(cli, ["config", cluster.scheduler_address]).output
        assert text.count("worker ") == 2 and "RMM              default (no pool)" in text
        assert "device IPC       off" in text


def test_config_says_why_device_ipc_is_off(monkeypatch):
    """A worker whose DeviceIPC plugin stayed off: the reason, as the plugin found it."""
    from cudask.comm import ipc
    from cudask.worker import plugins

    monkeypatch.setattr(ipc, "_state", ipc._State())
    monkeypatch.setattr(plugins, "gpus_without_peer_access", lambda uuid: ["GPU-b"])
    with (
        LocalCluster(
            n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.register_plugin(plugins.DeviceIPC("GPU-a", 1 << 20, map_ahead=False))
        result = CliRunner().invoke(cli, ["config", cluster.scheduler_address, "--json"])
        (report,) = json.loads(result.output).values()
        assert report["device_ipc"] == "off: GPU-a has no peer access to GPU-b"


def test_config_over_tls(tls_files):
    from distributed.security import Security

    cert, key = tls_files
    security = Security(
        tls_ca_file=cert,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_client_cert=cert,
        tls_client_key=key,
        require_encryption=True,
    )
    with LocalCluster(
        n_workers=1,
        processes=False,
        threads_per_worker=1,
        protocol="tls",
        security=security,
        dashboard_address=":0",
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        result = CliRunner().invoke(
            cli,
            [
                "config",
                address,
                "--json",
                "--tls-ca-file",
                cert,
                "--tls-cert",
                cert,
                "--tls-key",
                key,
            ],
        )
        assert result.exit_code == 0, result.output
        (report,) = json.loads(result.output).values()
        assert report["protocol"] == "tls"
        partial = CliRunner().invoke(cli, ["config", address, "--tls-ca-file", cert])
        assert partial.exit_code == 2 and "TLS needs all" in partial.output  # a usage error
