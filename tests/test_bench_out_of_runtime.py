"""The benchmarks stay out of the runtime: importing cudask (every module of it), building
the specs of a cluster's workers and running any `cudask` command but `cudask bench` never
imports cudask_bench, nor matplotlib. Each case runs in a fresh interpreter and reads its
sys.modules; `cudask bench --help` shows the check would see them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudask
from cudask.testing import real_gpu_count

SRC = Path(cudask.__file__).resolve().parents[1]
FORBIDDEN = ("cudask_bench", "matplotlib")

REPORT = """
import json, sys
print("\\n##modules##" + json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in {forbidden!r})))
"""


def loaded_after(code: str) -> list[str]:
    """The forbidden modules a fresh interpreter holds after running `code`."""
    script = code + REPORT.format(forbidden=set(FORBIDDEN))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    marker = proc.stdout.rfind("##modules##")
    assert marker >= 0, proc.stdout + proc.stderr
    return list(json.loads(proc.stdout[marker + len("##modules##") :]))


IMPORT_EVERYTHING = """
import importlib, pkgutil
import cudask
for module in pkgutil.walk_packages(cudask.__path__, "cudask."):
    try:
        importlib.import_module(module.name)
    except ImportError:  # an optional dependency (dask-kubernetes, ...) not installed here
        pass
"""

WORKER_SPECS = """
import cudask
from cudask.deploy.local import select_devices
from cudask.devices import discover
from cudask.options import resolve
from cudask.testing import FakeBackend
from cudask.worker.spec import gpu_name, nanny_options

cudask.LocalCUDACluster, cudask.CUDAWorker
machine = discover(FakeBackend.dgx(2))
options = resolve({"device_memory_limit": 0.5, "jit_unspill": True}, "cluster")
devices = select_devices(machine, None, None)
specs = [nanny_options(options, devices, i, n_workers=2, name=gpu_name(devices[i]))
         for i in range(2)]
assert specs[1]["env"]["CUDA_VISIBLE_DEVICES"] == "1,0"
"""


def test_no_runtime_module_names_the_benchmarks_in_an_import() -> None:
    """Not even inside a function or under TYPE_CHECKING: `cudask bench` is attached by name."""
    found = []
    for path in sorted((SRC / "cudask").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}:{node.lineno}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert found == []


def test_importing_every_runtime_module_leaves_the_benchmarks_out() -> None:
    assert loaded_after(IMPORT_EVERYTHING) == []


def test_building_worker_specs_leaves_the_benchmarks_out() -> None:
    assert loaded_after(WORKER_SPECS) == []


def command(*args: str) -> str:
    """Run `cudask ARGS` in this interpreter as the console script does (exit caught)."""
    return f"""
from cudask.cli.main import cli
try:
    cli({list(args)!r}, prog_name="cudask")
except SystemExit:
    pass
"""


COMMANDS = [
    ("--help",),
    ("--version",),
    ("info",),
    ("info", "--json"),
    ("options",),
    ("worker", "--help"),
    ("config", "--help"),
    ("config",),
    ("top", "--help"),
    ("demo", "--help"),
    ("kubernetes", "--help"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_commands_other_than_bench_leave_the_benchmarks_out(args: tuple[str, ...]) -> None:
    assert loaded_after(command(*args)) == []


@pytest.mark.skipif(real_gpu_count() > 0, reason="with a GPU this would start a worker")
def test_a_worker_that_cannot_start_leaves_the_benchmarks_out() -> None:
    assert loaded_after(command("worker", "tcp://127.0.0.1:9")) == []


def test_dask_cuda_entry_points_leave_the_benchmarks_out() -> None:
    code = "from cudask.cli import dask_cli\ndask_cli.cuda, dask_cli.cudask\n" + command("--help")
    assert loaded_after(code) == []


def test_cudask_bench_loads_the_benchmarks() -> None:
    """The check sees them where they belong: `cudask bench` imports cudask_bench."""
    assert "cudask_bench.cli" in loaded_after(command("bench", "--help"))
