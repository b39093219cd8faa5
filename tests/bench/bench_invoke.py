"""Shared by the `cudask bench` CLI tests (test_bench_cli*.py): the options of a CPU
run (plain-dict backend, NumPy), the CLI invoked in-process, and its one-line error."""

from __future__ import annotations

from click.testing import CliRunner

from cudask_bench.cli import bench

CPU = ["--backend", "dict", "--array-module", "numpy"]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(bench, list(args), prog_name="cudask bench")
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"traceback instead of an error message: {result.exception!r}"
    return result.exit_code, result.output


def one_line_error(code: int, output: str) -> str:
    assert code != 0, output
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, output
    assert "Traceback" not in output
    return errors[0]
