"""Test-suite wiring: the `gpu` and `multigpu` markers skip themselves where
NVML finds too few GPUs (see cudask.testing.real_gpu_count); the `tls_files`
fixture makes a self-signed certificate for TLS tests; `--fault-table PATH` writes
the fault matrix's rows (tests/faults) as JSON."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

from cudask.testing import real_gpu_count

NEEDED = {"gpu": 1, "multigpu": 2}


@functools.cache
def _gpus() -> int:
    return real_gpu_count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fault-table", default=None, metavar="PATH",
                     help="write the rows recorded by tests/faults (case, outcome, keys checked, "
                          "keys lost, time to recover) to PATH as JSON, with the machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, needed in NEEDED.items():
            if item.get_closest_marker(marker) is not None and _gpus() < needed:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {needed}+ NVIDIA GPU(s); NVML finds {_gpus()}")
                )


@pytest.fixture
def tls_files(tmp_path) -> tuple[str, str]:
    """(certificate, key) of a self-signed certificate, also usable as the CA file."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    return cert, key
