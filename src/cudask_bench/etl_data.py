"""The data of `cudask bench etl`: its plan, settings, files and the answers they must give.

Covers: `EtlPlan` (what every setting runs, as JSON for the child processes) and
`SETTINGS` (floor, dask-cuda, dask-cuda-cudf-spill, cudask, cudask-jit,
cudask-cudf-spill) and `setting_named`, which also takes a cudask setting with
`cudask.*` config values of its own (`cudask@memory.pinned-pool-size=16GiB`); the
files: `files` fact files of `rows_per_file` rows (key int64
drawn from `keys` values, x and y float64, v int32) and a dimension table of one row per
key (key, w float64, cat int32 in `categories` values), written per format (csv,
parquet) under a root directory, from one seed, by cuDF on the GPU where the plan's
frames are cuDF and cuDF is importable, else by pandas; the reference (`reference`):
the answers computed with pandas and NumPy from the files as written (number of
groups, the groupby of a fixed sample of keys, the merge's per-category sums, the
column means), and `compare`, which lists where a setting's answers differ. The child
process `python -m cudask_bench.etl_data --plan JSON --root DIR --json PATH` writes
the files and the reference (a CUDA context of the generator never outlives it).

Does not cover: removing the root (cudask_bench.etl owns it), the runs
(cudask_bench.etl_run, cudask_bench.etl_phases). Threading: the calling thread only;
nothing shared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FORMATS: tuple[str, ...] = ("csv", "parquet")
FRAMES: tuple[str, ...] = ("cudf", "pandas")
FACT_DTYPES: dict[str, str] = {"key": "int64", "x": "float64", "y": "float64", "v": "int32"}
DIM_DTYPES: dict[str, str] = {"key": "int64", "w": "float64", "cat": "int32"}
#: Bytes of one fact row and one dimension row in device memory.
FACT_ROW_BYTES = 28
DIM_ROW_BYTES = 20
#: How many keys the groupby's answer is checked on (spread evenly over the keys).
SAMPLE_SIZE = 64
#: Tolerances of sums and means: the order of float additions differs between readers.
REL_TOL = 1e-9
ABS_TOL = 1e-6


@dataclass(frozen=True)
class Setting:
    """One way to run the cluster: backend, device limit or none, spilling mode."""

    name: str
    backend: str  # "cudask" or "dask-cuda"
    limited: bool  # the plan's device limit is passed (else no limit: 0)
    jit_unspill: bool = False
    cudf_spill: bool = False
    description: str = ""
    config: tuple[tuple[str, Any], ...] = ()  # cudask.* keys (without "cudask.") and values

    def dask_config(self) -> dict[str, Any]:
        """The setting's own config values, as `dask.config.set` takes them."""
        return {f"cudask.{key}": value for key, value in self.config}


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("floor", "cudask", False, description="cudask, no device limit"),
        Setting("dask-cuda", "dask-cuda", True, description="dask-cuda, its default spilling"),
        Setting(
            "dask-cuda-cudf-spill",
            "dask-cuda",
            True,
            cudf_spill=True,
            description="dask-cuda, enable_cudf_spill=True",
        ),
        Setting("cudask", "cudask", True, description="cudask, its store"),
        Setting(
            "cudask-jit", "cudask", True, jit_unspill=True, description="cudask, jit_unspill=True"
        ),
        Setting(
            "cudask-cudf-spill",
            "cudask",
            True,
            cudf_spill=True,
            description="cudask, enable_cudf_spill=True",
        ),
    )
}


_MISSING = object()
#: The config keys a setting may give values of its own: the store's and the allocator's
#: (the cluster's other options are the setting's own: its limit, JIT-unspill, cuDF spilling).
OWN_KEYS = ("memory.", "worker.rmm-")


def setting_named(name: str) -> Setting:
    """A setting of `SETTINGS`, or one of its cudask settings with values of its own for
    `cudask.memory.*` and the allocator's `cudask.worker.rmm-*` keys:
    `BASE@KEY=VALUE[@KEY=VALUE...]`, each KEY without "cudask."
    (`cudask@memory.pinned-pool-size=16GiB`, `floor@worker.rmm-async=true`), each VALUE read
    as YAML, as dask reads environment variables. ValueError names what is wrong."""
    if name in SETTINGS:
        return SETTINGS[name]
    base_name, *pairs = name.split("@")
    base = SETTINGS.get(base_name)
    cudask_names = [s.name for s in SETTINGS.values() if s.backend == "cudask"]
    if base is None or base.backend != "cudask" or not pairs:
        raise ValueError(
            f"{name!r}: accepted: {', '.join(SETTINGS)}, or a cudask setting "
            f"({', '.join(cudask_names)}) with @KEY=VALUE config values, "
            "e.g. 'cudask@memory.pinned-pool-size=16GiB'"
        )
    import dask
    import yaml

    import cudask.config  # noqa: F401 - cudask's defaults, so its keys are known

    config: list[tuple[str, Any]] = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        known = dask.config.get(f"cudask.{key}", _MISSING) if sep and text else _MISSING
        if not key.startswith(OWN_KEYS) or known is _MISSING or isinstance(known, dict):
            raise ValueError(
                f"{name!r}: {pair!r} is not KEY=VALUE with KEY a cudask.memory or "
                "cudask.worker.rmm-* config key without 'cudask.' (e.g. "
                "memory.pinned-pool-size=16GiB, worker.rmm-async=true)"
            )
        config.append((key, yaml.safe_load(text)))
    described = ", ".join(f"{k}={v}" for k, v in config)
    return Setting(
        name,
        base.backend,
        base.limited,
        base.jit_unspill,
        base.cudf_spill,
        f"{base.description}, {described}",
        tuple(config),
    )


@dataclass(frozen=True)
class EtlPlan:
    """What every setting runs."""

    settings: tuple[str, ...] = tuple(SETTINGS)
    formats: tuple[str, ...] = FORMATS
    files: int = 24
    rows_per_file: int = 8_000_000
    device_memory_limit: int = 1_600_000_000
    device: str = "0"
    memory_limit: str = "auto"  # each worker's host memory limit
    repeat: int = 1
    warm_runs: int = 1
    timeout: float = 900.0  # seconds one child process may take
    frames: str = "cudf"  # "pandas": host frames on distributed.LocalCluster (harness check)
    data_dir: str | None = None  # where the temporary data directory is made
    seed: int = 0
    keys: int = 1_000_000
    categories: int = 100
    # compute each phase's `collection.optimize()` (dask-expr's blockwise fusion: one task
    # per partition); False: what compute submits, which Client.compute does not fuse
    # (dask/distributed#8833), so the worker stores every intermediate
    fuse: bool = False
    skipped: dict[str, str] = field(default_factory=dict)  # setting -> why it did not run

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file

    @property
    def device_bytes(self) -> int:
        """The fact table's bytes in device memory."""
        return self.rows * FACT_ROW_BYTES

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EtlPlan:
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
        }
        return cls(**values)


def sample_keys(keys: int) -> list[int]:
    """The keys whose groupby answers are checked: SAMPLE_SIZE of them, evenly spread."""
    step = max(1, keys // SAMPLE_SIZE)
    return list(range(step // 2, keys, step))[:SAMPLE_SIZE]


def fact_files(root: str, fmt: str) -> list[str]:
    folder = os.path.join(root, fmt, "fact")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith("." + fmt))


def dim_file(root: str, fmt: str) -> str:
    return os.path.join(root, fmt, f"dim.{fmt}")


# ------------------------------------------------------------------------ generation


def _columns(xp: Any, seed: int, rows: int, keys: int) -> dict[str, Any]:
    rs = xp.random.RandomState(seed)
    return {
        "key": rs.randint(0, keys, size=rows).astype("int64"),
        "x": rs.random_sample(rows),
        "y": rs.random_sample(rows) * 100.0,
        "v": rs.randint(0, 1000, size=rows).astype("int32"),
    }


def _write(frame: Any, path: str, fmt: str) -> None:
    if fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)


def _generator(frames: str) -> str:
    if frames != "cudf":
        return "pandas"
    try:
        import cudf  # noqa: F401
    except ImportError:
        return "pandas"
    return "cudf"


def generate(plan: EtlPlan, root: str, step: Any = None) -> dict[str, Any]:
    """Write the plan's files under `root` in each of its formats; `step(label)` after
    each file. The dimension table comes from NumPy, the fact files from CuPy (cuDF
    writes them) or NumPy (pandas writes them)."""
    import numpy
    import pandas

    generator = _generator(plan.frames)
    if generator == "cudf":
        import cudf as frames
        import cupy as xp
    else:
        frames, xp = pandas, numpy
    for fmt in plan.formats:
        os.makedirs(os.path.join(root, fmt, "fact"), exist_ok=True)
    rs = numpy.random.RandomState(plan.seed)
    dim = pandas.DataFrame(
        {
            "key": numpy.arange(plan.keys, dtype="int64"),
            "w": rs.random_sample(plan.keys),
            "cat": rs.randint(0, plan.categories, size=plan.keys).astype("int32"),
        }
    )
    for fmt in plan.formats:
        _write(dim, dim_file(root, fmt), fmt)
    for i in range(plan.files):
        frame = frames.DataFrame(_columns(xp, plan.seed + 1 + i, plan.rows_per_file, plan.keys))
        for fmt in plan.formats:
            _write(frame, os.path.join(root, fmt, "fact", f"part-{i:05d}.{fmt}"), fmt)
        del frame
        if step is not None:
            step(f"file {i + 1}/{plan.files} written")
    return {"generator": generator}


# ------------------------------------------------------------------------- reference


def read_columns(path: str, fmt: str, dtypes: Mapping[str, str]) -> dict[str, Any]:
    """The columns of one file as NumPy arrays of `dtypes`, read with pyarrow."""
    import numpy
    import pyarrow

    names = list(dtypes)
    if fmt == "parquet":
        import pyarrow.parquet

        table = pyarrow.parquet.read_table(path, columns=names)
    else:
        import pyarrow.csv

        types = {n: pyarrow.from_numpy_dtype(numpy.dtype(t)) for n, t in dtypes.items()}
        table = pyarrow.csv.read_csv(
            path,
            convert_options=pyarrow.csv.ConvertOptions(column_types=types, include_columns=names),
        )
    return {n: table.column(n).to_numpy().astype(dtypes[n], copy=False) for n in names}


def reference(plan: EtlPlan, root: str, fmt: str) -> dict[str, Any]:
    """The answers of the plan's work on the `fmt` files under `root`, with pandas and
    NumPy: number of groups, the sample keys' groupby, per-category sums, means."""
    import numpy
    import pandas

    dim = read_columns(dim_file(root, fmt), fmt, DIM_DTYPES)
    w_of = numpy.zeros(plan.keys, dtype="float64")
    cat_of = numpy.zeros(plan.keys, dtype="int64")
    w_of[dim["key"]], cat_of[dim["key"]] = dim["w"], dim["cat"]
    counts = numpy.zeros(plan.keys, dtype="int64")
    by_cat = numpy.zeros((3, plan.categories), dtype="float64")
    sums = {"key": 0, "x": 0.0, "y": 0.0, "v": 0}
    parts = []
    keys = numpy.asarray(sample_keys(plan.keys), dtype="int64")
    rows = 0
    for path in fact_files(root, fmt):
        c = read_columns(path, fmt, FACT_DTYPES)
        rows += len(c["key"])
        counts += numpy.bincount(c["key"], minlength=plan.keys)
        chosen = numpy.isin(c["key"], keys, kind="table")
        parts.append(pandas.DataFrame({n: c[n][chosen] for n in FACT_DTYPES}))
        cat = cat_of[c["key"]]
        by_cat[0] += numpy.bincount(cat, weights=c["x"], minlength=plan.categories)
        by_cat[1] += numpy.bincount(cat, weights=w_of[c["key"]], minlength=plan.categories)
        by_cat[2] += numpy.bincount(cat, minlength=plan.categories)
        for name in sums:
            sums[name] += c[name].sum(dtype="int64" if name in ("key", "v") else "float64")
    chosen_rows = (
        pandas.concat(parts)
        if parts
        else pandas.DataFrame({n: numpy.empty(0, dtype=t) for n, t in FACT_DTYPES.items()})
    )
    sample = chosen_rows.groupby("key").agg({"x": "sum", "y": "sum", "v": "count"})
    return {
        "rows": rows,
        "groups": int(numpy.count_nonzero(counts)),
        "sample": sample_answer(sample),
        "by_category": {
            str(c): {"x": float(by_cat[0][c]), "w": float(by_cat[1][c]), "count": int(by_cat[2][c])}
            for c in range(plan.categories)
            if by_cat[2][c]
        },
        "means": {n: float(s) / rows if rows else None for n, s in sums.items()},
    }


# ------------------------------------------------------------------ answers compared


def sample_answer(frame: Any) -> dict[str, dict[str, float]]:
    """A groupby answer (index key; columns x, y sums and v count) as plain data."""
    frame = frame.to_pandas() if hasattr(frame, "to_pandas") else frame
    return {
        str(int(k)): {"x": float(r["x"]), "y": float(r["y"]), "count": int(r["v"])}
        for k, r in frame.sort_index().iterrows()
    }


def category_answer(frame: Any) -> dict[str, dict[str, float]]:
    """The merge's answer (index cat; columns x, w sums and y count) as plain data."""
    frame = frame.to_pandas() if hasattr(frame, "to_pandas") else frame
    return {
        str(int(c)): {"x": float(r["x"]), "w": float(r["w"]), "count": int(r["y"])}
        for c, r in frame.sort_index().iterrows()
    }


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return bool(a == b)


def compare(want: Mapping[str, Any], got: Mapping[str, Any], limit: int = 5) -> list[str]:
    """Where `got` (a run's answers) differs from `want` (the reference): at most
    `limit` lines such as "groups: 999 != 1000"; empty when every answer matches."""
    out: list[str] = []
    for part in ("groups", "sample", "by_category", "means"):
        if part not in got:
            out.append(f"{part}: missing")
            continue
        a, b = got[part], want[part]
        if not isinstance(b, Mapping):
            if a != b:
                out.append(f"{part}: {a} != {b}")
            continue
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key), b.get(key)
            if isinstance(y, Mapping) and isinstance(x, Mapping):
                bad = [f"{n} {x.get(n)} != {v}" for n, v in y.items() if not _close(x.get(n), v)]
            else:
                bad = [] if x is not None and y is not None and _close(x, y) else [f"{x} != {y}"]
            if bad:
                out.append(f"{part}[{key}]: " + ", ".join(bad))
    return out[:limit]


# --------------------------------------------------------------------- child process


def prepare(plan: EtlPlan, root: str, step: Any = None) -> dict[str, Any]:
    """Write the files, then compute each format's reference; the sizes on the way."""
    start = time.perf_counter()
    made = generate(plan, root, step)
    written = time.perf_counter()
    formats: dict[str, Any] = {}
    for fmt in plan.formats:
        paths = [*fact_files(root, fmt), dim_file(root, fmt)]
        formats[fmt] = {
            "disk_bytes": sum(os.path.getsize(p) for p in paths),
            "fact_files": len(paths) - 1,
            "reference": reference(plan, root, fmt),
        }
        if step is not None:
            step(f"{fmt} reference computed")
    return {
        **made,
        "generate_s": written - start,
        "reference_s": time.perf_counter() - written,
        "rows": plan.rows,
        "device_bytes": plan.device_bytes,
        "dim_rows": plan.keys,
        "dim_device_bytes": plan.keys * DIM_ROW_BYTES,
        "formats": formats,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from cudask_bench import stopping
    from cudask_bench.run import Progress

    p = argparse.ArgumentParser(
        prog="python -m cudask_bench.etl_data",
        description="Write the files of `cudask bench etl` and their "
        "reference answers. Normally started by `cudask bench etl`.",
    )
    p.add_argument("--plan", required=True, help="the EtlPlan as JSON")
    p.add_argument("--root", required=True, help="the directory to write under")

    def work(args: argparse.Namespace) -> dict[str, Any]:
        plan = EtlPlan.from_json(args.plan)
        return prepare(plan, args.root, Progress(plan.files + len(plan.formats)))

    return stopping.runner_main(p, work, argv)


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "FACT_DTYPES",
    "FORMATS",
    "FRAMES",
    "SETTINGS",
    "EtlPlan",
    "Setting",
    "category_answer",
    "compare",
    "dim_file",
    "fact_files",
    "generate",
    "prepare",
    "reference",
    "sample_answer",
    "sample_keys",
    "setting_named",
]
