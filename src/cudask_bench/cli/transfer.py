"""`cudask bench transfer`: device data between workers of one host.

Covers: the command: its checks, in this order (sizes, protocols, --n against --blocks,
device sizes and pools, shuffle methods and rows against dask-cuDF, UCX, the dask-cuda
environment, the settings named, a GPU and the placement on this machine's GPUs, CuPy),
the plan it builds, the summary lines it prints and the JSON file (with provenance,
rewritten after each case). Does not cover: the measurements (cudask_bench.transfer),
the report (cudask_bench.transfer_report), its options
(cudask_bench.cli.transfer_options). Threading: the command's thread.
"""

from __future__ import annotations

import os
from typing import Any

import click

from cudask.errors import MissingDependencyError, NoGPUError, OptionError
from cudask_bench import environment, targets
from cudask_bench import transfer as transfer_run
from cudask_bench.cli.options import with_options
from cudask_bench.cli.plan import command, size
from cudask_bench.cli.transfer_options import TRANSFER
from cudask_bench.report import write_json
from cudask_bench.shuffle import METHODS as SHUFFLE_METHODS
from cudask_bench.transfer_case import run_case
from cudask_bench.transfer_report import summary


def _sizes(kw: dict[str, Any]) -> tuple[int, ...]:
    from dask.utils import parse_bytes

    sizes = []
    for text in str(kw["sizes"]).split(","):
        try:
            nbytes = parse_bytes(text.strip())
        except (ValueError, TypeError):
            nbytes = 0
        if nbytes < 8:
            raise click.BadParameter(
                f"{text!r}; accepted: sizes of at least 8 bytes such as '512MiB', comma-separated",
                param_hint="--sizes",
            )
        sizes.append(nbytes)
    return tuple(sizes)


def _listed(
    kw: dict[str, Any], key: str, accepted: tuple[str, ...], example: str
) -> tuple[str, ...]:
    """A comma-separated option whose every entry is one of `accepted`."""
    chosen = tuple(p.strip() for p in str(kw[key]).split(",") if p.strip())
    if not chosen or any(p not in accepted for p in chosen):
        raise click.BadParameter(
            f"{kw[key]!r}; accepted: {', '.join(accepted)}, comma-separated{example}",
            param_hint="--" + key.replace("_", "-"),
        )
    return chosen


def _check_device_sizes(kw: dict[str, Any]) -> tuple[str | None, ...]:
    """Check --n, --device-memory-limit and --rmm-pool-size; return the pools (None: no pool)."""
    if kw["side"] % kw["blocks"]:
        raise click.BadParameter(
            f"--n {kw['side']} is not a multiple of --blocks {kw['blocks']}", param_hint="--n"
        )
    pools: list[str | None] = []
    try:
        size(kw["device_memory_limit"], "--device-memory-limit")
        for text in str(kw["rmm_pool_size"] or "none").split(","):
            text = text.strip()
            if text.lower() in ("none", "0", ""):
                pools.append(None)
            else:
                size(text, "--rmm-pool-size")
                pools.append(text)
    except OptionError as exc:
        raise click.UsageError(str(exc)) from None
    if len(set(pools)) < len(pools):
        raise click.BadParameter(
            f"{kw['rmm_pool_size']!r} names a pool twice; accepted: distinct "
            "sizes or 'none', comma-separated, e.g. 'none,40GB'",
            param_hint="--rmm-pool-size",
        )
    return tuple(pools)


def _protocols(kw: dict[str, Any]) -> tuple[str, ...]:
    """--protocols; 'auto': tcp, and ucx where distributed-ucxx is installed."""
    if str(kw["protocols"]).strip() == "auto":
        return ("tcp", "ucx") if environment.has_module("distributed_ucxx") else ("tcp",)
    return _listed(kw, "protocols", transfer_run.PROTOCOLS, ", e.g. 'tcp,ucx' or 'auto'")


def _settings(
    kw: dict[str, Any], protocols: tuple[str, ...], dask_cuda: transfer_run.Setting | None
) -> tuple[transfer_run.Setting, ...]:
    """The settings to run: those the protocols and --against give, or the named ones of them."""
    available = transfer_run.settings(protocols, dask_cuda)
    if not kw["only"]:
        return available
    names = tuple(n.strip() for n in str(kw["only"]).split(",") if n.strip())
    known = [s.name for s in available]
    if not names or any(n not in known for n in names):
        raise click.BadParameter(
            f"{kw['only']!r}; accepted: {', '.join(known)} (with these "
            "--protocols and --against), comma-separated",
            param_hint="--settings",
        )
    return tuple(s for s in available if s.name in names)


def _shuffle_rows(kw: dict[str, Any]) -> int:
    has_dask_cudf = environment.has_module("dask_cudf")
    shuffle_rows: int | None = kw["shuffle_rows"]
    if shuffle_rows is None:
        shuffle_rows = 50_000_000 if has_dask_cudf else 0
    elif shuffle_rows and not has_dask_cudf:
        raise MissingDependencyError(
            "dask_cudf",
            f"--shuffle-rows {shuffle_rows}",
            "pip install dask-cudf-cu13  (or --shuffle-rows 0)",
        )
    if 0 < shuffle_rows < kw["blocks"]:
        raise click.BadParameter(
            f"{shuffle_rows}; accepted: 0 (no shuffle) or at least --blocks ({kw['blocks']}) rows",
            param_hint="--shuffle-rows",
        )
    return shuffle_rows


def _dask_cuda(kw: dict[str, Any], protocols: tuple[str, ...]) -> transfer_run.Setting | None:
    """dask-cuda's setting with --against dask-cuda (its environment checked), else None."""
    if "ucx" in protocols and not environment.has_module("distributed_ucxx"):
        raise MissingDependencyError(
            "distributed_ucxx",
            "--protocols ucx",
            "pip install 'cudask[ucx]'  (distributed-ucxx-cu13)",
        )
    if kw["against"] != "dask-cuda":
        if kw["dask_cuda_python"] or kw["dask_cuda_path"]:
            raise click.UsageError("--dask-cuda-python / --dask-cuda-path need --against dask-cuda")
        return None
    target = targets.resolve_dask_cuda(
        kw["dask_cuda_python"], kw["dask_cuda_path"], jit_unspill=False, array_module="cupy"
    )
    found = (target.probe or {}).get("found", {})
    if "ucx" in protocols and not found.get("distributed_ucxx"):
        raise MissingDependencyError(
            "distributed_ucxx",
            "--protocols ucx against dask-cuda",
            "install distributed-ucxx-cu13 where dask-cuda is",
        )
    return transfer_run.Setting(
        "dask-cuda", "dask-cuda", "tcp", python=target.python, pythonpath=target.pythonpath
    )


def _placement(kw: dict[str, Any]) -> tuple[str, ...]:
    """Each worker process's GPUs ("0,1"), checked against this machine's GPUs."""
    gpus = environment.gpus()
    if not gpus.get("available"):
        raise NoGPUError(
            f"cudask bench transfer needs an NVIDIA GPU and NVML finds none ({gpus.get('reason')})"
        )
    count = len(gpus.get("devices") or [])
    placement = kw["placement"] or ("0+1" if count >= 2 else "0,0")
    entries = [[g.strip() for g in p.split("+")] for p in placement.split(",")]
    indices = [g for entry in entries for g in entry]
    if (
        len(indices) < 2
        or any(not (g.isascii() and g.isdigit()) or int(g) >= count for g in indices)
        or any(len({int(g) for g in entry}) < len(entry) for entry in entries)
    ):
        raise click.BadParameter(
            f"{placement!r}; accepted: two or more GPU indices below {count} "
            "(this machine's GPUs), comma-separated, '+' joining the distinct "
            "GPUs of one process, e.g. '0,0' or '0+1'",
            param_hint="--placement",
        )
    return tuple(",".join(str(int(g)) for g in entry) for entry in entries)


@click.command("transfer")
@with_options(TRANSFER)
@command
def transfer(ctx: click.Context, kw: dict[str, Any]) -> None:
    """Device data between workers of one host: cudask with CUDA IPC
    (cudask.comm.device-ipc) against TCP through host memory, cudask over UCX and
    dask-cuda over TCP and UCX when asked; all-to-all rechunk, point to point and, with
    dask-cuDF, a DataFrame shuffle, each setting (with and without each RMM pool) in a
    fresh cluster of worker processes, cold and warm, in --rounds rounds whose order
    rotates (after --warmup runs left out); then the targets against dask-cuda over UCX."""
    sizes = _sizes(kw)
    protocols = _protocols(kw)
    pools = _check_device_sizes(kw)
    methods = _listed(kw, "shuffle_methods", SHUFFLE_METHODS, "")
    shuffle_rows = _shuffle_rows(kw)
    dask_cuda = _dask_cuda(kw, protocols)
    chosen = _settings(kw, protocols, dask_cuda)
    placement = _placement(kw)
    if not environment.has_module("cupy"):
        raise click.ClickException("cudask bench transfer needs CuPy: pip install 'cudask[cuda]'")
    log_dir = os.path.dirname(os.path.abspath(kw["output"])) if kw["output"] else None
    plan = transfer_run.TransferPlan(
        placement=placement,
        sizes=sizes,
        repeat=kw["repeat"],
        n=kw["side"],
        blocks=kw["blocks"],
        device_memory_limit=kw["device_memory_limit"],
        pools=pools,
        rounds=kw["rounds"],
        warmup=kw["warmup"],
        warm_runs=kw["warm_runs"],
        budget_s=kw["budget"],
        settings=chosen,
        log_dir=log_dir,
        shuffle_rows=shuffle_rows,
        shuffle_methods=methods if shuffle_rows else (),
    )
    machine, versions = environment.machine(), environment.versions()

    def write(report: dict[str, Any]) -> None:  # after each case: a run cut short keeps its figures
        if kw["output"]:
            write_json(
                {
                    "workload": "transfer",
                    "report": report,
                    "machine": machine,
                    "versions": versions,
                },
                kw["output"],
            )

    report = transfer_run.run_transfer(
        plan, run=run_case, progress=write
    )  # each case a process of its own
    write(report)
    for line in summary(report):
        click.echo(line)


__all__ = ["transfer"]
