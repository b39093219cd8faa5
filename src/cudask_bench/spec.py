"""What a benchmark run is made of: workloads, operations, variants, parameters.

Covers: the names the harness accepts (workloads, backends, cupy operations and their
default shapes, the cold/warm measuring modes and their defaults, the metric suffixes
each mode writes), the `Variant` a runner process executes (backend x device limit x
JIT-unspill), building the variant matrix a command asks for, and turning one variant
plus its parameters into the runner's argv. Pure data and validation: nothing here
imports distributed, CuPy or any cluster (dask.utils formats sizes).

Does not cover: running anything (cudask_bench.harness spawns runners,
cudask_bench.run is the runner, cudask_bench.workloads holds the work).
Threading: immutable data and pure functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dask.utils import format_bytes

from cudask.errors import OptionError

WORKLOADS: tuple[str, ...] = ("spill", "cupy", "startup")
BACKENDS: tuple[str, ...] = ("cudask", "dask-cuda", "dict")
ARRAY_MODULES: tuple[str, ...] = ("cupy", "numpy")
JIT_MODES: tuple[str, ...] = ("off", "on", "both")

#: How `spill` and `cupy` measure. cold: every measured repetition is its own fresh
#: runner process and cluster, its first run timed from the first submit (the figure a
#: user who starts a cluster and runs once sees), followed by warm runs in the same
#: cluster. warm: repetitions after warm-ups in one cluster (steady state).
MODES: tuple[str, ...] = ("cold", "warm")
DEFAULT_MODE = "cold"
MODE_DESCRIPTIONS: dict[str, str] = {
    "cold": "first run on a fresh cluster, timed from the first submit",
    "warm": "steady state after warm-ups",
}
#: Cold mode: runs after the first one, in the same cluster, that give the `_warm` figures.
DEFAULT_WARM_RUNS = 2
#: Unmeasured warm-ups when --warmup is not given: cold mode's are whole processes per
#: variant; warm mode's are repetitions inside each process, per workload.
COLD_WARMUP = 1
WARM_WARMUP: dict[str, int] = {"spill": 0, "cupy": 1}

#: Metric name suffixes: `_warm` (steady state, both modes), and in cold cupy runs
#: `_input` (creating and persisting the input) and `_total` (`_input` + the operation).
WARM_SUFFIX = "_warm"
INPUT_SUFFIX = "_input"
TOTAL_SUFFIX = "_total"

#: Line prefix a runner uses on stderr for machine-readable progress events.
PROGRESS_PREFIX = "##cudask-bench## "

#: JSON format tag written into every result file.
RESULT_FORMAT = "cudask-bench/1"

#: The top-level packages whose loaded modules a result lists (`cudask_modules`).
PACKAGES: tuple[str, ...] = ("cudask", "cudask_bench")


@dataclasses.dataclass(frozen=True)
class OperationShape:
    """Default input shape of one cupy operation: (size, size) or (size, second)."""

    size: int
    chunk: int
    second: int | None = None
    description: str = ""


#: The dask.array operations of `cudask bench cupy`, in run order.
CUPY_OPERATIONS: dict[str, OperationShape] = {
    "transpose_sum": OperationShape(40000, 5000, None, "(x + x.T).sum()"),
    "dot": OperationShape(20000, 5000, None, "x.dot(y), result persisted"),
    "svd": OperationShape(
        200000, 20000, 1000, "da.linalg.svd(x) of a tall-skinny (size, second) array"
    ),
    "sum": OperationShape(40000, 5000, None, "x.sum()"),
    "mean": OperationShape(40000, 5000, None, "x.mean()"),
    "slice": OperationShape(40000, 5000, None, "x[::3, ::2], strided views persisted"),
    "map_overlap": OperationShape(
        40000, 5000, None, "5-point stencil through x.map_overlap(depth=1, boundary='reflect')"
    ),
}

#: Largest spill chunk: element values are base + index with index < 2**32.
MAX_SPILL_CHUNK = 8 * 2**32

#: `spill --disk-size` by array module: at least 8 GiB on a GPU machine, so the file
#: outgrows the disk's own cache; a harness check on host memory writes little.
DISK_SIZE: dict[str, str] = {"cupy": "8GiB", "numpy": "64MiB"}


def accepted(values: Iterable[str]) -> str:
    return ", ".join(values)


def check_choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise OptionError(f"{name}={value!r} is not known; accepted: {accepted(choices)}")
    return value


def check_operations(values: Sequence[str]) -> list[str]:
    """Validate cupy operation names; an empty selection means all of them, in order."""
    if not values:
        return list(CUPY_OPERATIONS)
    out: list[str] = []
    for value in values:
        for name in value.split(","):
            name = name.strip()
            if not name:
                continue
            check_choice("--operation", name, list(CUPY_OPERATIONS))
            if name not in out:
                out.append(name)
    if not out:
        raise OptionError(f"--operation is empty; accepted: {accepted(CUPY_OPERATIONS)}")
    return out


def operation_shape(
    name: str, size: int | None, chunk: int | None, second: int | None
) -> dict[str, int | None]:
    """Effective shape of operation `name`, user values overriding its defaults."""
    default = CUPY_OPERATIONS[name]
    shape: dict[str, int | None] = {
        "size": size if size is not None else default.size,
        "chunk": chunk if chunk is not None else default.chunk,
        "second": None,
    }
    if default.second is not None:
        shape["second"] = second if second is not None else default.second
    size, chunk_ = shape["size"], shape["chunk"]
    if chunk_ is not None and size is not None and chunk_ > size:
        raise OptionError(
            f"--chunk-size={chunk_} is larger than --size={size} for {name}; give a chunk "
            "size of at most the array size, e.g. --size 40000 --chunk-size 5000"
        )
    return shape


def process_per_repetition(workload: str, mode: str | None) -> bool:
    """Whether every repetition runs in a fresh runner process (startup, cold mode)."""
    return workload == "startup" or mode == "cold"


def default_warmup(workload: str, mode: str) -> int:
    """Unmeasured warm-ups of `workload` in `mode` when --warmup is not given."""
    check_choice("--mode", mode, MODES)
    return COLD_WARMUP if mode == "cold" else WARM_WARMUP[workload]


def ordered_metrics(variants: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every metric of `variants` in first-seen order, `_warm` metrics after the others."""
    metrics: list[str] = []
    for variant in variants:
        for name in variant.get("measurements") or {}:
            if name not in metrics:
                metrics.append(name)
    return sorted(metrics, key=lambda name: name.endswith(WARM_SUFFIX))


def check_positive(name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise OptionError(f"{name}={value} is too small; accepted: an integer >= {minimum}")


def check_spill_sizes(total: int | None, chunk: int | None) -> tuple[int, int]:
    """Validate the spill workload's total and chunk sizes (bytes)."""
    if total is None:
        raise OptionError('--total is off; give a byte size such as "16GiB"')
    if chunk is None:
        raise OptionError('--chunk-size is off; give a byte size such as "256MiB"')
    if chunk % 8:
        raise OptionError(
            f"--chunk-size={chunk} bytes is not a whole number of 8-byte (uint64) "
            'elements; give a multiple of 8 such as "256MiB"'
        )
    if chunk > MAX_SPILL_CHUNK:
        raise OptionError(
            f"--chunk-size={format_bytes(chunk)} is larger than the "
            f"{format_bytes(MAX_SPILL_CHUNK)} a verifiable chunk may hold"
        )
    if chunk > total:
        raise OptionError(
            f"--chunk-size={format_bytes(chunk)} is larger than --total={format_bytes(total)}; "
            "give a chunk no larger than the total, e.g. --total 16GiB --chunk-size 256MiB"
        )
    return total, chunk


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration a runner process executes.

    `device_memory_limit` is bytes, or None for "no device limit" (passed to
    the backend as 0). When `limit_set` is false the keyword is not passed at
    all and the backend's own default applies (used by `startup`).
    """

    backend: str
    device_memory_limit: int | None = None
    jit_unspill: bool = False
    limit_set: bool = True

    @property
    def name(self) -> str:
        if self.backend == "dict":
            return "dict store"
        if not self.limit_set:
            limit = "default limit"
        elif self.device_memory_limit is None:
            limit = "no limit"
        else:
            limit = format_bytes(self.device_memory_limit).replace(".00 ", " ")
        return f"{self.backend} {limit}" + (" +jit" if self.jit_unspill else "")

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "device_memory_limit": self.device_memory_limit if self.limit_set else "default",
            "jit_unspill": self.jit_unspill,
        }


def jit_flags(mode: str) -> list[bool]:
    check_choice("--jit-unspill", mode, JIT_MODES)
    return {"off": [False], "on": [True], "both": [False, True]}[mode]


def build_variants(
    backends: Sequence[str],
    *,
    device_memory_limit: int | None,
    limit_set: bool,
    jit_mode: str,
    baseline: bool,
    against_jit_mode: str | None = None,
) -> list[Variant]:
    """The variants a command runs, baselines first, then each backend in order.

    The baseline is the plain-dict store (distributed's worker with
    `data=dict`, no spilling) and, when cudask is selected and a device limit
    is set, cudask with no device limit: the pair the "within 5% of a plain
    dict store" target compares. `against_jit_mode` is dask-cuda's JIT-unspill
    mode when it differs from cudask's `jit_mode`.
    """
    for backend in backends:
        check_choice("--backend", backend, BACKENDS)
    flags = {"cudask": jit_flags(jit_mode), "dask-cuda": jit_flags(against_jit_mode or jit_mode)}
    variants: list[Variant] = []

    def add(variant: Variant) -> None:
        if variant not in variants:
            variants.append(variant)

    if baseline or "dict" in backends:
        add(Variant("dict"))
    limited = limit_set and device_memory_limit is not None
    if baseline and "cudask" in backends and (limited or not limit_set):
        add(Variant("cudask", None, False, True))
    for backend in ("cudask", "dask-cuda"):
        if backend in backends:
            for flag in flags[backend]:
                add(Variant(backend, device_memory_limit, flag, limit_set))
    return variants


def runner_argv(
    variant: Variant,
    workload: str,
    *,
    array_module: str,
    device: str,
    memory_limit: str,
    rmm_pool_size: int | None,
    protocol: str,
    repeat: int,
    warmup: int,
    mode: str | None = None,
    warm_runs: int | None = None,
    total: int | None = None,
    chunk_size: int | None = None,
    operations: Sequence[str] = (),
    size: int | None = None,
    array_chunk: int | None = None,
    second_size: int | None = None,
    json_path: str | None = None,
) -> list[str]:
    """Arguments (after `python -m cudask_bench.run`) that run `variant` once.

    `mode` (one of MODES) is required for spill and cupy; `warm_runs` applies to
    cold mode. The harness appends `--json PATH` itself unless `json_path` is given.
    """
    check_choice("workload", workload, WORKLOADS)
    argv = [
        "--backend", variant.backend,
        "--workload", workload,
        "--array-module", array_module,
        "--device", device,
        "--memory-limit", memory_limit,
        "--protocol", protocol,
        "--repeat", str(repeat),
        "--warmup", str(warmup),
    ]  # fmt: skip
    if json_path is not None:
        argv += ["--json", json_path]
    if variant.limit_set:
        limit = variant.device_memory_limit
        argv += ["--device-memory-limit", str(limit) if limit is not None else "0"]
    if variant.jit_unspill:
        argv.append("--jit-unspill")
    if rmm_pool_size is not None and variant.backend != "dict":
        argv += ["--rmm-pool-size", str(rmm_pool_size)]
    if workload in ("spill", "cupy"):
        if mode is None:
            raise OptionError(f"the {workload} workload needs a mode; accepted: {accepted(MODES)}")
        argv += ["--mode", check_choice("--mode", mode, MODES)]
        if mode == "cold":
            argv += ["--warm-runs", str(DEFAULT_WARM_RUNS if warm_runs is None else warm_runs)]
    if workload == "spill":
        if total is None or chunk_size is None:
            raise OptionError("the spill workload needs --total and --chunk-size")
        argv += ["--total", str(total), "--chunk-size", str(chunk_size)]
    elif workload == "cupy":
        for op in operations:
            argv += ["--operation", op]
        if size is not None:
            argv += ["--size", str(size)]
        if array_chunk is not None:
            argv += ["--array-chunk", str(array_chunk)]
        if second_size is not None:
            argv += ["--second-size", str(second_size)]
    return argv


__all__ = [
    "ARRAY_MODULES",
    "BACKENDS",
    "COLD_WARMUP",
    "CUPY_OPERATIONS",
    "DEFAULT_MODE",
    "DEFAULT_WARM_RUNS",
    "DISK_SIZE",
    "INPUT_SUFFIX",
    "JIT_MODES",
    "MAX_SPILL_CHUNK",
    "MODES",
    "MODE_DESCRIPTIONS",
    "PACKAGES",
    "PROGRESS_PREFIX",
    "RESULT_FORMAT",
    "TOTAL_SUFFIX",
    "WARM_SUFFIX",
    "WARM_WARMUP",
    "WORKLOADS",
    "OperationShape",
    "Variant",
    "build_variants",
    "check_choice",
    "check_operations",
    "check_positive",
    "check_spill_sizes",
    "default_warmup",
    "jit_flags",
    "operation_shape",
    "ordered_metrics",
    "process_per_repetition",
    "runner_argv",
]
