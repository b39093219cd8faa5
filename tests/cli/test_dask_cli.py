"""`dask cuda` / `dask cudask` beside dask-cuda (cudask.cli.dask_cli, .dask_cuda_owner).

The subprocess tests install nothing: a temporary folder on PYTHONPATH holds a cudask
dist-info whose entry points are read from pyproject.toml (it shadows the installed one, so
the declaration is what is tested) and, where asked, a fake dask-cuda declaring
`[dask_cli] cuda = dask_cuda.cli:cuda` as the real one does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from click.testing import CliRunner

import cudask
from cudask.cli import dask_cli, dask_cuda_owner
from cudask.cli.main import cli, cuda, dask_cudask

REPO = Path(__file__).resolve().parents[2]
SRC = Path(cudask.__file__).resolve().parents[1]
OVERWRITE = "has been overwritten"


def _dist_info(root: Path, name: str, version: str, eps: dict[str, str]) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = ["[dask_cli]", *(f"{k} = {v}" for k, v in eps.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def cudask_as_declared(root: Path) -> Path:
    """A cudask dist-info with pyproject.toml's `dask_cli` entry points."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    _dist_info(root, "cudask", project["version"], project["entry-points"]["dask_cli"])
    return root


def fake_dask_cuda(root: Path, version: str = "26.10.0") -> Path:
    """Looks like `pip install --target ROOT dask-cuda` to importlib.metadata and to dask's CLI."""
    package = root / "dask_cuda"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (package / "cli.py").write_text(
        "import click\n\n\n@click.group\ndef cuda():\n    '''FAKE dask-cuda group.'''\n\n\n"
        "@cuda.command\ndef worker():\n    click.echo('fake dask-cuda worker')\n"
    )
    _dist_info(root, "dask-cuda", version, {"cuda": "dask_cuda.cli:cuda"})
    return root


def run(path: list[Path], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in [*path, SRC]))
    return subprocess.run(
        [sys.executable, "-W", "default", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    (tmp_path / "cwd").mkdir()
    return tmp_path / "cwd"


def test_without_dask_cuda_both_names_are_cudask(tmp_path: Path, empty: Path) -> None:
    path = [cudask_as_declared(tmp_path / "cudask")]
    help_ = run(path, "-m", "dask", "--help", cwd=empty)
    assert help_.returncode == 0, help_.stderr
    assert OVERWRITE not in help_.stderr and "While registering" not in help_.stderr
    listing = " ".join(help_.stdout.split())  # column widths follow the installed commands
    assert "cuda GPU workers for dask (cudask" in listing
    assert "cudask GPU workers for dask (cudask" in listing
    for group in ("cuda", "cudask"):
        sub = run(path, "-m", "dask", group, "--help", cwd=empty)
        assert sub.returncode == 0 and "worker" in sub.stdout and "top" in sub.stdout
    info = run(path, "-m", "cudask.cli", "info", cwd=empty)
    assert info.returncode == 0
    assert "`dask cuda ...` runs cudask" in info.stdout.splitlines()[-1]


@pytest.mark.parametrize("dask_cuda_first", [True, False])
def test_beside_dask_cuda_no_warning_and_dask_cuda_is_dask_cudas(
    tmp_path: Path, empty: Path, dask_cuda_first: bool
) -> None:
    ours, theirs = cudask_as_declared(tmp_path / "cudask"), fake_dask_cuda(tmp_path / "dc")
    # Either order on sys.path gives the same answer: nothing is left to chance.
    path = [theirs, ours] if dask_cuda_first else [ours, theirs]
    help_ = run(path, "-m", "dask", "--help", cwd=empty)
    assert help_.returncode == 0, help_.stderr
    assert OVERWRITE not in help_.stderr and "While registering" not in help_.stderr
    listing = " ".join(help_.stdout.split())  # column widths follow the installed commands
    assert "cuda FAKE dask-cuda group." in listing
    assert "cudask GPU workers for dask (cudask" in listing
    assert dask_cli.STANDING_ASIDE not in help_.stdout  # hidden

    theirs_worker = run(path, "-m", "dask", "cuda", "worker", cwd=empty)
    assert theirs_worker.stdout.strip() == "fake dask-cuda worker"
    assert OVERWRITE not in theirs_worker.stderr
    ours_worker = run(path, "-m", "dask", "cudask", "worker", "--help", cwd=empty)
    assert ours_worker.returncode == 0 and "--device-memory-limit" in ours_worker.stdout
    assert OVERWRITE not in ours_worker.stderr

    info = run(path, "-m", "cudask.cli", "info", cwd=empty)
    assert info.returncode == 0
    last = info.stdout.splitlines()[-1]
    assert "`dask cuda ...` runs dask-cuda 26.10.0" in last and "`dask cudask ...`" in last
    cudask_worker = run(path, "-m", "cudask.cli", "worker", "--help", cwd=empty)
    assert cudask_worker.returncode == 0 and "--device-memory-limit" in cudask_worker.stdout


def _eps(*pairs: tuple[str, str]) -> list[EntryPoint]:
    return [EntryPoint(name, value, dask_cuda_owner.GROUP) for name, value in pairs]


DISTRIBUTED = ("scheduler", "distributed.cli.dask_scheduler:main")


def test_loaders_follow_what_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = ("cuda", "cudask.cli.dask_cli:cuda")
    monkeypatch.setattr(dask_cuda_owner, "entry_points", lambda group: _eps(DISTRIBUTED, ours))
    assert dask_cli.cuda is cuda and dask_cli.cudask is dask_cudask
    assert cuda.name == "cuda" and dask_cudask.name == "cudask"
    assert dask_cudask.commands == cuda.commands
    assert cuda.commands["worker"] is cli.commands["worker"]
    runs = dask_cuda_owner.dask_cuda_runs()
    assert runs is not None and runs.startswith("cudask")

    monkeypatch.setattr(
        dask_cuda_owner,
        "entry_points",
        lambda group: _eps(DISTRIBUTED, ("cuda", "dask_cuda.cli:cuda"), ours),
    )
    aside = dask_cli.cuda
    assert aside.name == dask_cli.STANDING_ASIDE and aside.hidden
    assert dask_cli.cudask is dask_cudask
    assert dask_cuda_owner.dask_cuda_runs() == "dask_cuda"  # no distribution behind the EntryPoint
    result = CliRunner().invoke(aside, [])
    assert "runs dask_cuda; cudask is `dask cudask ...`" in result.output

    monkeypatch.setattr(dask_cuda_owner, "entry_points", lambda group: _eps(DISTRIBUTED))
    assert dask_cuda_owner.dask_cuda_runs() is None
    assert "`dask cuda` is not installed" in dask_cuda_owner.which_line()
    with pytest.raises(AttributeError):
        dask_cli.nothing  # noqa: B018
