"""The GPU runners' verdict (scripts/ran-tests, used by scripts/gpu-tests): a run whose GPU tests all skipped proved nothing and fails,
with the reason; a run where tests passed succeeds; a failure fails. And their
check that the installed wheel holds the tree's sources (scripts/wheel-matches-tree)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(tmp_path: pathlib.Path, body: str, marker: str) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_probe.py"
    test.write_text("import pytest\n\n" + body)
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            "--junitxml",
            str(report),
            str(test),
        ],
        cwd=tmp_path,
        check=False,
        capture_output=True,
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ran-tests"), str(report)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_all_skipped_is_a_failure_with_the_reason(tmp_path: pathlib.Path) -> None:
    done = _run(
        tmp_path,
        "@pytest.mark.skip(reason='needs 1+ NVIDIA GPU(s)')\ndef test_gpu():\n    pass\n",
        "not nothing",
    )
    assert done.returncode == 1
    assert "no test ran" in done.stdout and "needs 1+ NVIDIA GPU(s)" in done.stdout


def test_passing_tests_prove_something(tmp_path: pathlib.Path) -> None:
    done = _run(tmp_path, "def test_gpu():\n    assert True\n", "not nothing")
    assert done.returncode == 0 and "1 passed" in done.stdout


def test_a_failure_fails(tmp_path: pathlib.Path) -> None:
    done = _run(
        tmp_path, "def test_a():\n    pass\n\ndef test_b():\n    assert False\n", "not nothing"
    )
    assert done.returncode == 1 and "1 failed" in done.stdout


def test_no_report_fails(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ran-tests"), str(tmp_path / "missing.xml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "nothing was proven" in done.stdout


def _matches(installed: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """scripts/wheel-matches-tree run by an interpreter that imports cudask from `installed`."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheel-matches-tree"), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_the_runners_refuse_a_wheel_built_from_other_sources(tmp_path: pathlib.Path) -> None:
    installed = tmp_path / "site"
    for package in ("cudask", "cudask_bench"):
        shutil.copytree(
            ROOT / "src" / package,
            installed / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (installed / "cudask_bench" / "source.json").write_text("{}")  # the wheel's stamp: not a module
    assert _matches(installed).returncode == 0
    module = installed / "cudask" / "comm" / "ipc.py"
    module.write_text(module.read_text() + "# changed\n")
    (installed / "cudask" / "gone.py").write_text("")
    done = _matches(installed)
    assert done.returncode == 2 and done.stdout.count("\n") == 1, done.stdout
    assert "cudask/comm/ipc.py, cudask/gone.py (not in the tree) differ" in done.stdout
    assert "rebuild the wheelhouse with scripts/wheelhouse" in done.stdout
