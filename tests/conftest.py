"""Test-suite wiring: the `gpu` and `multigpu` markers skip themselves where
NVML finds too few GPUs (see cudask.testing.real_gpu_count); the `tls_files`
fixture makes a self-signed certificate for TLS tests; `--fault-table PATH` writes
the fault matrix's rows (tests/faults) as JSON; the session makes its temporary files
in a directory of its own (`session_temp_dir`), removed at the end, and fails when
something cudask made there was left behind."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from cudask.testing import real_gpu_count

NEEDED = {"gpu": 1, "multigpu": 2}


@functools.cache
def _gpus() -> int:
    return real_gpu_count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fault-table",
        default=None,
        metavar="PATH",
        help="write the rows recorded by tests/faults (case, outcome, keys checked, "
        "keys lost, time to recover) to PATH as JSON, with the machine",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, needed in NEEDED.items():
            if item.get_closest_marker(marker) is not None and _gpus() < needed:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs {needed}+ NVIDIA GPU(s); NVML finds {_gpus()}")
                )


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The temporary directory of the session, of its tests and of every process they
    start (TMPDIR): removed at the end, so that the suite leaves nothing in the system's
    temporary directory (pytest's own tmp_path folders aside). An entry named cudask*
    left in it fails the session: what cudask creates there, it must remove."""
    tmp_path_factory.getbasetemp()  # pytest's folders stay where pytest keeps them
    root = tempfile.mkdtemp(prefix="cudask-tests-")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = root
    try:
        yield root
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
        gc.collect()  # what unreferenced objects remove when collected is not left behind
        left = sorted(name for name in os.listdir(root) if name.startswith("cudask"))
        shutil.rmtree(root, ignore_errors=True)
    if left:
        pytest.fail(f"the tests left cudask temporary files behind: {', '.join(left)}")


@pytest.fixture
def tls_files(tmp_path) -> tuple[str, str]:
    """(certificate, key) of a self-signed certificate, also usable as the CA file."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
