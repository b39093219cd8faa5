"""Where a result file's figures came from: code, configuration, machine, libraries.

Covers: the source of the cudask that ran (git commit and whether the checkout was dirty,
read from the checkout the importable `cudask` lives in, else from the stamp that
scripts/wheelhouse writes into the wheels it builds), the effective `cudask.*`
configuration with every key set away from its default (and where) and the DASK_CUDASK__ /
DASK_DISTRIBUTED__ / DASK_ARRAY__ environment variables, the versions of the libraries results depend
on (also in other environments a document names, such as dask-cuda's `--target` folder),
whether each figure of a document is cold or warm, and the machine
(cudask_bench.environment: GPUs, driver, CUDA, CPU, kernel). `stamp(document)` adds all
of it under "provenance"; `write(path, document)` stamps and writes. `cudask bench` and the probe scripts write
their JSON through it.

Does not cover: measuring anything, or the machine description itself
(cudask_bench.environment). Nothing heavy is imported: versions come from package
metadata, dask.config is read only by `configuration`.

Threading: call from one thread; each call runs git and reads NVML itself.
"""

from __future__ import annotations

import copy
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

#: The stamp scripts/wheelhouse writes next to this module before it builds a wheel
#: (git-ignored, package data of cudask_bench): the source of a wheel has no .git.
STAMP_FILE = Path(__file__).with_name("source.json")

#: Libraries a result records: label -> distribution names, first found wins.
LIBRARIES: dict[str, tuple[str, ...]] = {
    "cudask": ("cudask",),
    "dask": ("dask",),
    "distributed": ("distributed",),
    "numpy": ("numpy",),
    "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    "rmm": ("rmm-cu13", "rmm-cu12", "rmm"),
    "cuda-bindings": ("cuda-bindings",),
    "dask-cuda": ("dask-cuda",),
    "ucxx": ("ucxx-cu13", "ucxx-cu12", "ucxx"),
    "distributed-ucxx": ("distributed-ucxx-cu13", "distributed-ucxx-cu12", "distributed-ucxx"),
    "cudf": ("cudf-cu13", "cudf-cu12", "cudf"),
    "dask-cudf": ("dask-cudf-cu13", "dask-cudf-cu12", "dask-cudf"),
    "numba": ("numba",),
    "numba-cuda": ("numba-cuda",),
    "nvidia-ml-py": ("nvidia-ml-py", "pynvml"),
    "zict": ("zict",),
}

#: Environment variables a result records (dask's config overrides).
ENV_PREFIXES: tuple[str, ...] = ("DASK_CUDASK__", "DASK_DISTRIBUTED__", "DASK_ARRAY__")
ENV_NAMES: tuple[str, ...] = ("DASK_CONFIG", "CUDA_VISIBLE_DEVICES")


def _git(directory: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_source(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The commit of the git checkout holding `directory`, and whether any tracked file
    differs from it (`dirty`, with up to 20 `changed` paths); None outside a checkout."""
    where = Path(directory)
    top = _git(where, "rev-parse", "--show-toplevel")
    commit = _git(where, "rev-parse", "HEAD")
    if top is None or commit is None:
        return None
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    changed = [line[3:] for line in (status or "").splitlines() if line.strip()]
    return {
        "commit": commit.strip(),
        "dirty": bool(changed) if status is not None else None,
        "changed": changed[:20],
        "from": "git checkout",
        "checkout": top.strip(),
    }


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent


def source(stamp_file: Path = STAMP_FILE, package: str = "cudask") -> dict[str, Any]:
    """The code that ran: its git checkout, else the wheel's stamp, else why unknown."""
    directory = _package_dir(package)
    tracked = (
        directory is not None
        and _git(directory, "ls-files", "--error-unmatch", "__init__.py") is not None
    )
    found = git_source(directory) if tracked and directory is not None else None
    if found is not None:  # (a package installed inside some checkout is not tracked there)
        return found
    try:
        stamp = json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        where = str(directory) if directory is not None else f"{package} is not importable"
        return {
            "commit": None,
            "dirty": None,
            "from": None,
            "reason": f"not a git checkout and no {stamp_file.name} stamp ({where})",
        }
    return {**stamp, "from": "wheel stamp"}


def make_stamp(root: str | os.PathLike[str]) -> dict[str, Any]:
    """The stamp of checkout `root` for a wheel built from it (scripts/wheelhouse)."""
    found = git_source(root)
    if found is None:
        return {"commit": None, "dirty": None, "built_at": _now()}
    return {
        "commit": found["commit"],
        "dirty": found["dirty"],
        "changed": found["changed"],
        "built_at": _now(),
    }


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _leaves(tree: Mapping[str, Any], prefix: str) -> Iterator[str]:
    for name, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}.{name}")
        else:
            yield f"{prefix}.{name}"


def configuration() -> dict[str, Any]:
    """The effective `cudask` config, each key set away from cudask.yaml with where it
    was set, and the environment variables that override dask's config."""
    import dask.config

    from cudask import config

    effective = copy.deepcopy(dask.config.get("cudask", default={}))
    changed: dict[str, Any] = {}
    for key in _leaves(effective, "cudask") if isinstance(effective, Mapping) else ():
        where = config.origin(key)
        if where is not None:
            changed[key] = {"value": dask.config.get(key, default=None), "origin": where}
    environ = {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES
    }
    return {"cudask": effective, "changed": changed, "environment": environ}


def library_versions(paths: Iterable[str] | None = None) -> dict[str, str | None]:
    """Versions of LIBRARIES (None where absent), from sys.path or only from `paths`."""
    search = None if paths is None else list(paths)
    out: dict[str, str | None] = {"python": platform.python_version()}
    for label, names in LIBRARIES.items():
        out[label] = None
        for name in names:
            where: dict[str, Any] = (
                {"name": name} if search is None else {"name": name, "path": search}
            )
            found = [d.version for d in importlib.metadata.distributions(**where)]
            if found:
                out[label] = found[0]
                break
    return out


def _pythonpaths(tree: Any) -> Iterator[str]:
    """Every entry of a "pythonpath" list anywhere in a document."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            if key == "pythonpath" and isinstance(value, list):
                yield from (str(v) for v in value)
            else:
                yield from _pythonpaths(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _pythonpaths(value)


def other_environments(document: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Libraries found in the extra PYTHONPATH folders a document's runners used."""
    out: dict[str, dict[str, str]] = {}
    for path in dict.fromkeys(_pythonpaths(document)):
        if not Path(path).is_dir():
            continue
        found = {k: v for k, v in library_versions([path]).items() if v and k != "python"}
        if found:
            out[path] = found
    return out


def figure_modes(document: Mapping[str, Any]) -> dict[str, str]:
    """Cold or warm for each figure of a `cudask bench` document (metric names for spill,
    cupy and startup; key paths for transfer and etl)."""
    workload = document.get("workload")
    if workload == "etl":
        return {
            f"results.{fmt}.{name}.{mode}": mode
            for fmt, by_name in (document.get("results") or {}).items()
            for name in by_name
            for mode in ("cold", "warm")
        }
    if workload == "limit":  # each run's phases: cold and warm seconds and peaks
        modes = {
            "cold_s": "cold",
            "peak_bytes": "cold",
            "warm_s": "warm",
            "warm_peak_bytes": "warm",
        }
        runs = (document.get("report") or {}).get("runs") or []
        return {
            f"runs.{i}.phases.{phase}.{key}": mode
            for i, run in enumerate(runs)
            for phase in run.get("phases") or {}
            for key, mode in modes.items()
        }
    if workload == "transfer":
        settings = (document.get("report") or {}).get("settings") or {}
        return {
            path: mode
            for name, tree in settings.items()
            for path, mode in _transfer_modes(tree, f"settings.{name}")
        }
    mode = (document.get("parameters") or {}).get("mode") or "warm"
    metrics: dict[str, None] = {}
    for variant in document.get("variants") or []:
        metrics.update(dict.fromkeys(variant.get("measurements") or {}))
    if workload == "startup":
        return dict.fromkeys(metrics, "cold")
    return {m: "warm" if mode == "warm" or m.endswith("_warm") else "cold" for m in metrics}


def _transfer_modes(tree: Any, prefix: str) -> Iterator[tuple[str, str]]:
    if not isinstance(tree, Mapping):
        return
    for key, value in tree.items():
        path = f"{prefix}.{key}"
        if key in ("cold", "all_to_all"):
            yield path, "cold"
        elif key in ("warm", "warm_median_GBps", "all_to_all_warm"):
            yield path, "warm"
        elif key not in ("runs", "ipc", "store"):  # raw runs and counters
            yield from _transfer_modes(value, path)


#: Workloads whose documents name their figures' modes without the runner's format.
_FIGURED = ("transfer", "limit", "etl")


def stamp(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with a "provenance" entry."""
    from cudask_bench import environment

    record: dict[str, Any] = {
        "written_at": _now(),
        "source": source(),
        "config": configuration(),
        # the one `cudask bench` documents already carry, else probed here
        "machine": document.get("machine") or environment.machine(),
        "versions": library_versions(),
    }
    others = other_environments(document)
    if others:
        record["other_environments"] = others
    if document.get("format") == "cudask-bench/1" or document.get("workload") in _FIGURED:
        record["figures"] = figure_modes(document)
    document["provenance"] = record
    return document


def write(path: str | os.PathLike[str], document: dict[str, Any]) -> None:
    """Stamp `document` and write it as indented JSON to `path`, whole or not at all
    (a temporary file beside it, renamed over it)."""
    stamp(document)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "w") as fh:
            json.dump(document, fh, indent=1, default=str)
            fh.write("\n")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


__all__ = [
    "ENV_NAMES",
    "ENV_PREFIXES",
    "LIBRARIES",
    "STAMP_FILE",
    "configuration",
    "figure_modes",
    "git_source",
    "library_versions",
    "make_stamp",
    "other_environments",
    "source",
    "stamp",
    "write",
]
