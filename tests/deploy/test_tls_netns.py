"""Nodes joined over TLS only (issue 15, item 4): a scheduler and workers in
separate network namespaces joined by one link, the scheduler listening on TLS
alone; certificates from a test CA. Needs root (network namespaces); skipped
otherwise.

- CPU: distributed's own worker joins over TLS and a client computes; a plain
  tcp:// worker cannot join; cudask's handshake check (cudask.deploy.preflight)
  names a certificate the scheduler refuses and a scheduler this node does not
  trust, from the workers' namespace.
- GPU: `cudask worker` joins over TLS with its GPU, `cudask config` reports it,
  a client computes on the GPU, and a `cudask worker` with a certificate from
  another CA ends at once with one line saying the scheduler refused it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Namespaces, available, make_pki

PORT = 8786
PY = [sys.executable]
BIN = os.path.dirname(sys.executable)


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    why = available()
    if why:
        pytest.skip(why)
    ns = Namespaces(prefix=f"cdk{os.getpid() % 100000}", subnet=os.getpid() % 250 + 1)
    ns.delete()
    ns.create()
    try:
        yield ns
    finally:
        ns.delete()


@pytest.fixture
def pki(tmp_path: Path, namespaces: Namespaces) -> dict[str, str]:
    return make_pki(tmp_path, namespaces.scheduler_ip)


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")])}


def _scheduler(ns: Namespaces, pki: dict[str, str]) -> subprocess.Popen[str]:
    proc = ns.start(
        ns.scheduler,
        [
            *PY,
            "-m",
            "distributed.cli.dask_scheduler",
            "--protocol",
            "tls",
            "--host",
            ns.scheduler_ip,
            "--port",
            str(PORT),
            "--dashboard-address",
            f"{ns.scheduler_ip}:0",
            "--tls-ca-file",
            pki["ca"],
            "--tls-cert",
            pki["sched"],
            "--tls-key",
            pki["sched-key"],
            "--preload",
            "cudask.monitor",
        ],
        env=_env(),
    )
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:  # "Scheduler at: tls://..." once it listens
        if "Scheduler at" in line:
            return proc
        if time.monotonic() > deadline:
            break
    proc.kill()
    pytest.fail(f"the scheduler did not start: {proc.stdout.read()[-2000:]}")


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def _client_script(ns: Namespaces, pki: dict[str, str], body: str) -> str:
    return f"""
import json, time
from distributed import Client
from distributed.security import Security
sec = Security(tls_ca_file={pki["ca"]!r}, tls_client_cert={pki["worker"]!r},
               tls_client_key={pki["worker-key"]!r}, require_encryption=True)
with Client("tls://{ns.scheduler_ip}:{PORT}", security=sec, timeout=60) as client:
    client.wait_for_workers(1, timeout=120)
{body}
"""


def _preflight(ns: Namespaces, cert: str, key: str, ca: str) -> str:
    code = f"""
import asyncio
from distributed.security import Security
from cudask.deploy.preflight import check_tls
sec = Security(tls_ca_file={ca!r}, tls_worker_cert={cert!r}, tls_worker_key={key!r},
               require_encryption=True)
try:
    asyncio.run(check_tls("tls://{ns.scheduler_ip}:{PORT}", sec, timeout=20))
    print("accepted")
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""
    done = ns.run(ns.workers, [*PY, "-c", code], env=_env())
    return (done.stdout + done.stderr).strip()


def test_tls_only_between_namespaces(namespaces: Namespaces, pki: dict[str, str]) -> None:
    ns = namespaces
    sched = _scheduler(ns, pki)
    tls = ["--tls-ca-file", pki["ca"], "--tls-cert", pki["worker"], "--tls-key", pki["worker-key"]]
    worker = ns.start(
        ns.workers,
        [
            *PY,
            "-m",
            "distributed.cli.dask_worker",
            f"tls://{ns.scheduler_ip}:{PORT}",
            "--nthreads",
            "1",
            "--no-dashboard",
            "--death-timeout",
            "120",
            *tls,
        ],
        env=_env(),
    )
    try:
        body = (
            "    info = client.scheduler_info()['workers']\n"
            "    print(json.dumps({'workers': list(info), 'sum': client.submit(sum, [1, 2]).result()}))"
        )
        done = ns.run(ns.workers, [*PY, "-c", _client_script(ns, pki, body)], env=_env())
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["sum"] == 3
        assert [a.split("://")[0] for a in report["workers"]] == ["tls"]
        assert report["workers"][0].startswith(f"tls://{ns.worker_ip}:")
        # nothing answers plain TCP
        plain = ns.run(
            ns.workers,
            [
                *PY,
                "-c",
                (
                    "import asyncio\nfrom distributed.comm import connect\n"
                    f"asyncio.run(connect('tcp://{ns.scheduler_ip}:{PORT}', timeout=10))"
                ),
            ],
            env=_env(),
        )
        assert plain.returncode != 0
        # the handshake check names which side refuses which certificate
        assert _preflight(ns, pki["worker"], pki["worker-key"], pki["ca"]) == "accepted"
        refused = _preflight(ns, pki["bad"], pki["bad-key"], pki["ca"])
        assert refused.startswith("TLSRefusedError: the scheduler at tls://"), refused
        assert "refused this worker's certificate" in refused and pki["bad"] in refused
        untrusted = _preflight(ns, pki["worker"], pki["worker-key"], pki["rogue"])
        assert "does not trust the certificate of the scheduler" in untrusted, untrusted
        assert pki["rogue"] in untrusted
    finally:
        _stop(worker, sched)


@pytest.mark.gpu
def test_gpu_workers_over_tls_only(namespaces: Namespaces, pki: dict[str, str]) -> None:
    ns = namespaces
    sched = _scheduler(ns, pki)
    address = f"tls://{ns.scheduler_ip}:{PORT}"
    tls = ["--tls-ca-file", pki["ca"], "--tls-cert", pki["worker"], "--tls-key", pki["worker-key"]]
    worker = ns.start(
        ns.workers,
        [
            os.path.join(BIN, "cudask"),
            "worker",
            address,
            *tls,
            "--host",
            ns.worker_ip,
            "--name",
            "tls-node",
            "--device-memory-limit",
            "1GB",
            "--death-timeout",
            "120",
        ],
        env=_env(),
    )
    try:
        body = (
            "    def on_gpu():\n"
            "        import cupy\n"
            "        return float(cupy.arange(1000).sum()), cupy.cuda.Device(0).pci_bus_id\n"
            "    print(json.dumps({'workers': list(client.scheduler_info()['workers']),\n"
            "                      'gpu': client.submit(on_gpu).result()}))"
        )
        done = ns.run(ns.workers, [*PY, "-c", _client_script(ns, pki, body)], env=_env())
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["gpu"][0] == 499500.0
        assert all(a.startswith(f"tls://{ns.worker_ip}:") for a in report["workers"])
        config = ns.run(
            ns.workers,
            [
                os.path.join(BIN, "cudask"),
                "config",
                address,
                "--json",
                "--tls-ca-file",
                pki["ca"],
                "--tls-cert",
                pki["worker"],
                "--tls-key",
                pki["worker-key"],
            ],
            env=_env(),
        )
        assert config.returncode == 0, config.stderr
        workers = json.loads(config.stdout)
        assert len(workers) == len(report["workers"])
        assert all(w["protocol"] == "tls" and w["gpu"] for w in workers.values()), workers
        # a worker whose certificate comes from another CA: one line, at once
        start = time.monotonic()
        rogue = ns.run(
            ns.workers,
            [
                os.path.join(BIN, "cudask"),
                "worker",
                address,
                "--tls-ca-file",
                pki["ca"],
                "--tls-cert",
                pki["bad"],
                "--tls-key",
                pki["bad-key"],
                "--death-timeout",
                "120",
            ],
            env=_env(),
            timeout=150,
        )
        took = time.monotonic() - start
        lines = [line for line in (rogue.stdout + rogue.stderr).splitlines() if line.strip()]
        assert rogue.returncode == 1, lines
        assert len(lines) == 1 and "refused this worker's certificate" in lines[0], lines
        assert "Traceback" not in rogue.stderr and took < 60, took
    finally:
        _stop(worker, sched)
