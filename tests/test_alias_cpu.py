"""cudask's alias of dask_cuda: installed into a folder, imported by a fresh interpreter,
refused beside a real dask-cuda, removed only where cudask wrote it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cudask import dask_cuda_alias as alias
from cudask.cli.main import cli

IMPORTS = """
import cudask.utils, cudask.initialize, cudask.worker_spec, cudask.deploy.local
import dask_cuda
from dask_cuda import LocalCUDACluster, CUDAWorker
from dask_cuda.utils import get_n_gpus, parse_device_memory_limit
from dask_cuda.initialize import initialize
from dask_cuda.worker_spec import worker_spec
from dask_cuda.local_cuda_cluster import LocalCUDACluster as L
assert dask_cuda.utils is cudask.utils and L is LocalCUDACluster is cudask.LocalCUDACluster
assert initialize is cudask.initialize.initialize and worker_spec is cudask.worker_spec.worker_spec
assert dask_cuda.__version__ == "26.10.00"
try:
    import dask_cuda.proxify_host_file
except ModuleNotFoundError as exc:
    assert "cudask's alias of dask_cuda serves" in str(exc), exc
else:
    raise AssertionError("an internal module was served")
print("served")
"""


def _python(code: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_installed_alias_serves_cudask(tmp_path):
    result = CliRunner().invoke(cli, ["alias", "install", "--target", str(tmp_path)])
    assert result.exit_code == 0, result.output
    done = _python(IMPORTS, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "served"
    status = _python("from cudask.dask_cuda_alias import status; print(status())", tmp_path)
    assert "gets cudask" in status.stdout
    result = CliRunner().invoke(cli, ["alias", "remove", "--target", str(tmp_path)])
    assert result.exit_code == 0 and not (tmp_path / "dask_cuda").exists()


def _fake_dask_cuda_distribution(folder: Path) -> Path:
    info = folder / "dask_cuda-26.10.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dask-cuda\nVersion: 26.10.0\n")
    return folder


def test_refused_beside_a_real_dask_cuda(tmp_path):
    real = _fake_dask_cuda_distribution(tmp_path / "site")
    code = (
        "import sys; from cudask import dask_cuda_alias as alias\n"
        f"try:\n    alias.install({str(tmp_path / 'target')!r})\n"
        "except alias.AliasError as exc:\n    print('refused', exc)\n"
    )
    done = _python(code, real)
    assert done.stdout.startswith("refused dask-cuda is installed"), done.stdout + done.stderr


def test_an_alias_does_not_load_once_dask_cuda_is_installed(tmp_path):
    alias.install(tmp_path / "target")
    real = _fake_dask_cuda_distribution(tmp_path / "site")
    done = _python("import dask_cuda", tmp_path / "target", real)
    assert done.returncode != 0
    assert "would shadow the installed dask-cuda" in done.stderr


def test_remove_leaves_another_dask_cuda_alone(tmp_path):
    package = tmp_path / "dask_cuda"
    package.mkdir()
    (package / "__init__.py").write_text("# someone else's\n")
    with pytest.raises(alias.AliasError, match="not cudask's alias"):
        alias.remove(tmp_path)
    with pytest.raises(alias.AliasError, match="another dask_cuda package"):
        alias.install(tmp_path)
    assert (package / "__init__.py").read_text() == "# someone else's\n"
