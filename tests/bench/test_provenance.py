"""Provenance of result files on CPU: the commit from a checkout or a wheel's stamp, the
effective configuration and its overrides, library versions (also in another folder),
cold or warm per figure, and every writer going through it (write_json, wheelhouse)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import dask.config
import pytest

from cudask_bench import provenance, report

ROOT = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(where: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    return subprocess.run(
        ["git", "-C", str(where), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def _checkout(root: Path) -> str:
    """A git checkout at `root` with src/cudask_bench/ and one commit; its commit."""
    (root / "src" / "cudask_bench").mkdir(parents=True)
    (root / "src" / "cudask_bench" / "__init__.py").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "first")
    return _git(root, "rev-parse", "HEAD")


@needs_git
def test_git_source_names_the_commit_and_a_dirty_tree(tmp_path: Path) -> None:
    commit = _checkout(tmp_path)
    clean = provenance.git_source(tmp_path / "src")
    assert clean is not None
    assert (clean["commit"], clean["dirty"], clean["from"]) == (commit, False, "git checkout")
    (tmp_path / "src" / "cudask_bench" / "__init__.py").write_text("x = 1\n")
    dirty = provenance.git_source(tmp_path)
    assert dirty is not None and dirty["dirty"] is True
    assert dirty["changed"] == ["src/cudask_bench/__init__.py"]


def test_outside_a_checkout_the_wheel_stamp_names_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "provpkg").mkdir()
    (tmp_path / "provpkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    stamp = tmp_path / "source.json"
    found = provenance.source(stamp_file=stamp, package="provpkg")
    assert found["commit"] is None and "no source.json stamp" in found["reason"]
    stamp.write_text(json.dumps({"commit": "abc123", "dirty": False}))
    found = provenance.source(stamp_file=stamp, package="provpkg")
    assert found == {"commit": "abc123", "dirty": False, "from": "wheel stamp"}


def _wheelhouse() -> ModuleType:
    path = ROOT / "scripts" / "wheelhouse"
    loader = importlib.machinery.SourceFileLoader("wheelhouse_script", str(path))
    spec = importlib.util.spec_from_loader("wheelhouse_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@needs_git
def test_wheelhouse_stamps_the_build_and_removes_the_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = _checkout(tmp_path)
    wheelhouse = _wheelhouse()
    written = wheelhouse.write_stamp(tmp_path)
    stamp = tmp_path / "src" / "cudask_bench" / "source.json"
    assert json.loads(stamp.read_text())["commit"] == commit == written["commit"]
    assert written["dirty"] is False  # the stamp itself is not part of the tree
    (tmp_path / "elsewhere" / "provpkg").mkdir(parents=True)
    (tmp_path / "elsewhere" / "provpkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    # an untracked package inside a checkout (a venv in it) is read from the stamp, not git
    found = provenance.source(stamp_file=stamp, package="provpkg")
    assert (found["commit"], found["from"]) == (commit, "wheel stamp")
    wheelhouse.remove_stamp(tmp_path)
    assert not stamp.exists()


def test_the_stamp_is_package_data_and_git_ignored() -> None:
    assert 'cudask_bench = ["source.json"]' in (ROOT / "pyproject.toml").read_text()
    assert "/src/cudask_bench/source.json" in (ROOT / ".gitignore").read_text().splitlines()
    assert provenance.STAMP_FILE.parent == Path(provenance.__file__).parent


def test_configuration_names_overrides_and_where_they_were_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DASK_CUDASK__MEMORY__PINNED_POOL_SIZE", "1GiB")
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    with dask.config.set(
        {"cudask.memory.pinned-pool-size": "1GiB", "cudask.memory.spill-target": 0.8}
    ):
        conf = provenance.configuration()
    assert conf["cudask"]["memory"]["pinned-pool-size"] == "1GiB"
    changed = conf["changed"]
    assert changed["cudask.memory.pinned-pool-size"] == {
        "value": "1GiB",
        "origin": "environment variable DASK_CUDASK__MEMORY__PINNED_POOL_SIZE",
    }
    assert (
        changed["cudask.memory.spill-target"]["origin"] == "config key cudask.memory.spill-target"
    )
    assert conf["environment"]["DASK_CUDASK__MEMORY__PINNED_POOL_SIZE"] == "1GiB"
    assert "UNRELATED_VARIABLE" not in conf["environment"]


def test_library_versions_here_and_in_another_folder(tmp_path: Path) -> None:
    here = provenance.library_versions()
    assert set(here) == {"python", *provenance.LIBRARIES}
    assert here["dask"] == dask.__version__
    info = tmp_path / "dask_cuda-26.10.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dask-cuda\nVersion: 26.10.0\n")
    document = {"variants": [{"pythonpath": [str(tmp_path), "/no/such/folder"]}]}
    assert provenance.other_environments(document) == {str(tmp_path): {"dask-cuda": "26.10.0"}}


def _bench_document(mode: str | None, workload: str = "spill") -> dict[str, Any]:
    metrics = {"create": {}, "read_verify": {}, "create_warm": {}, "read_verify_warm": {}}
    parameters = {} if mode is None else {"mode": mode}
    return {
        "format": "cudask-bench/1",
        "workload": workload,
        "parameters": parameters,
        "variants": [{"name": "cudask", "measurements": metrics}],
    }


def test_figures_are_cold_or_warm() -> None:
    cold = provenance.figure_modes(_bench_document("cold"))
    assert cold == {
        "create": "cold",
        "read_verify": "cold",
        "create_warm": "warm",
        "read_verify_warm": "warm",
    }
    assert set(provenance.figure_modes(_bench_document("warm")).values()) == {"warm"}
    assert set(provenance.figure_modes(_bench_document(None)).values()) == {"warm"}  # pre --mode
    assert set(provenance.figure_modes(_bench_document(None, "startup")).values()) == {"cold"}
    transfer = {
        "workload": "transfer",
        "report": {
            "plan": {"n": 1},
            "settings": {
                "ipc": {
                    "point_to_point": {"64": {"cold": {}, "warm_median_GBps": 1.0, "runs": []}},
                    "all_to_all": {},
                    "all_to_all_warm": {},
                    "shuffle": {"tasks": {"cold": {}, "warm": {}}},
                    "ipc": {"w": {"sent": 1}},
                }
            },
        },
    }
    assert provenance.figure_modes(transfer) == {
        "settings.ipc.point_to_point.64.cold": "cold",
        "settings.ipc.point_to_point.64.warm_median_GBps": "warm",
        "settings.ipc.all_to_all": "cold",
        "settings.ipc.all_to_all_warm": "warm",
        "settings.ipc.shuffle.tasks.cold": "cold",
        "settings.ipc.shuffle.tasks.warm": "warm",
    }


def test_write_json_records_provenance(tmp_path: Path) -> None:
    document = _bench_document("cold")
    report.write_json(document, tmp_path / "out" / "spill.json")
    assert "provenance" not in document  # the caller's document is left as it was
    written = json.loads((tmp_path / "out" / "spill.json").read_text())
    record = written["provenance"]
    assert set(record) >= {"written_at", "source", "config", "machine", "versions", "figures"}
    assert record["figures"]["create"] == "cold"
    assert {"kernel", "cpu", "gpus"} <= set(record["machine"])
    if shutil.which("git") and (ROOT / ".git").exists():
        assert record["source"]["from"] == "git checkout"
        assert len(record["source"]["commit"]) == 40


def test_probe_documents_are_stamped_too(tmp_path: Path) -> None:
    provenance.write(tmp_path / "probe.json", {"probe": "ipc-cost", "results": [{"a": 1}]})
    written = json.loads((tmp_path / "probe.json").read_text())
    assert written["results"] == [{"a": 1}]
    assert "figures" not in written["provenance"]  # a probe's keys say what they are
    assert written["provenance"]["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_a_result_file_is_written_whole_or_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "out" / "result.json"
    provenance.write(path, {"workload": "x", "n": 1})
    assert json.loads(path.read_text())["n"] == 1
    with pytest.raises(TypeError):  # fails midway: a key JSON cannot hold
        provenance.write(path, {"workload": "x", "n": 2, (1, 2): "tuple key"})
    assert json.loads(path.read_text())["n"] == 1  # the earlier file, whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]  # no temporary left
