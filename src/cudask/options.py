"""Worker options: reading, checking and writing values of the declared table.

Covers: `resolve`, every option of a surface from the keywords given or the
`cudask.worker` config (canonical values, where a config value was set), the rules
between options shared by LocalCUDACluster, CUDAWorker and the CLI (`check_rules`,
`check_one_worker_options`), the optional libraries and modules they need
(`check_libraries`), a value as `cudask worker` flags (`flag_args`) and the reference
page docs/options.md (`reference`). The table itself is cudask.option_table,
re-exported here. Does not cover: per-device sizes (cudask.worker.spec) or starting
anything.

Threading: pure functions over the table and dask.config; any thread.
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cudask import config
from cudask.errors import (
    MissingDependencyError,
    OptionError,
    ProtocolMismatchError,
    UnknownModuleError,
)
from cudask.option_table import BY_CLUSTER_KEYWORD, BY_NAME, GROUPS, NODE, OPTIONS, options_for
from cudask.option_value import UCX_PROTOCOLS, Option, Surface, coerce
from cudask.sizes import is_off, parse_size


@dataclass
class WorkerOptions(Mapping[str, Any]):
    """Canonical values of every option (by `Option.name`), defaults filled in;
    `origins`: where those taken from a changed config key were set (config.origin);
    `implied`: options set by a rule, and the option that implied them."""

    settings: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    implied: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.settings[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.settings)

    def __len__(self) -> int:
        return len(self.settings)

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["settings"][key]
        except KeyError:
            raise AttributeError(key) from None


def resolve(
    values: Mapping[str, Any], surface: Surface, *, libraries: bool = True
) -> WorkerOptions:
    """Every option of `surface`, from `values` (keyed by the surface's keyword
    names) or, for options not given, the config default; coerced and validated.
    An explicit None keeps its meaning (e.g. device_memory_limit=None: no spilling),
    except for booleans, counts and choices, where it means the default.
    An empty value is refused (but local_directory='' from CUDAWorker's callers, which
    dask-mpi gives every worker class, is not given), and digits are a count only as
    text (a flag, the config), not as a keyword.
    An error in a value from the config names where it was set (config.origin).
    `libraries=False` leaves the optional libraries to a later check_libraries()
    (cudask.deploy.checks.check_input checks every syntax first)."""
    table = (
        BY_CLUSTER_KEYWORD if surface == "cluster" else {o.name: o for o in options_for(surface)}
    )
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise OptionError(
            f"unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(table))}"
        )
    resolved = WorkerOptions()
    for keyword, opt in table.items():
        value = values[keyword] if keyword in values else opt.default_value()
        if keyword not in values and opt.config is not None:
            where = config.origin(f"cudask.worker.{opt.config}")
            if where is not None:
                resolved.origins[opt.name] = where
        if value is None and opt.kind in ("bool", "int", "choice"):
            # no "off" for None to mean here (False, a count, a method): None is the
            # default, as dask-mpi's nthreads=None expects
            value = opt.default_value()
        if surface == "worker" and opt.name == "local_directory" and value == "":
            value = None  # dask-mpi's default, which it hands every worker class
        text = surface == "cli" or keyword not in values  # a flag, or the config's text
        try:
            resolved.settings[opt.name] = (
                coerce(opt, value, text=text) if value is not None else None
            )
        except OptionError as exc:
            error = from_config(exc, resolved.origins, opt.name)
            if keyword != opt.name:  # LocalCUDACluster's name for it (threads_per_worker)
                error = OptionError(
                    str(error).replace(f"{opt.name}=", f"{keyword}="),
                    option=opt.name,
                    origin=error.origin,
                )
            raise error from None
    try:
        check_rules(resolved)
    except OptionError as exc:
        raise from_config(exc, resolved.origins) from None
    if libraries:
        check_libraries(resolved)
    return resolved


def from_config(
    exc: OptionError, origins: Mapping[str, str], option: str | None = None
) -> OptionError:
    """`exc`, naming where the values it names were set when they came from the
    config (an environment variable, a config file): `option`'s as a prefix, those
    of a rule between options as a suffix."""
    if option is not None:
        exc.option = option
        if option not in origins:
            return exc
        out = OptionError(f"{origins[option]}: {exc}")
        out.option, out.origin = option, origins[option]
        return out
    named = [n for n in origins if re.search(rf"\b{n}=", str(exc))]
    if not named:
        return exc
    out = OptionError(f"{exc} ({'; '.join(f'{n} from {origins[n]}' for n in named)})")
    out.origin = origins[named[0]]
    return out


def _library(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # "a.b" without a package "a", or "" or ".a"
        return False


EXTRAS = {
    "rmm": ("rmm", "pip install 'cudask[rmm]'  (rmm-cu13)"),
    "cudf": ("cudf", "pip install cudf-cu13"),
    "ucx": ("distributed_ucxx", "pip install 'cudask[ucx]'  (distributed-ucxx-cu13)"),
    "cupy": ("cupy", "pip install 'cudask[cuda]'  (cupy-cuda13x)"),
}


def require_library(extra: str, needed_for: str) -> None:
    module, install = EXTRAS[extra]
    if not _library(module):
        raise MissingDependencyError(module, needed_for, install)


def check_rules(o: WorkerOptions) -> None:
    """Rules that span options; the same for cluster, CUDAWorker and CLI. Runs
    before any process starts. Sets protocol to 'ucx' when a UCX transport is
    asked for and no protocol given (as dask-cuda does), and says so in
    `o.implied`."""
    v = o.settings
    if v.get("rmm_async") and v.get("rmm_pool_size") is not None:
        warnings.warn(
            f"'rmm_pool_size' is not needed when 'rmm_async' is enabled: the async "
            f"allocator grows its pool as it needs; rmm_pool_size="
            f"{v['rmm_pool_size']!r} sets its initial size, a combination a later "
            "release will refuse (leave rmm_pool_size out)",
            FutureWarning,
            stacklevel=5,
        )
    if v.get("rmm_async") and v.get("rmm_managed_memory"):
        raise OptionError(
            "rmm_async=True and rmm_managed_memory=True cannot be combined; choose one allocator"
        )
    if not is_off(v.get("rmm_release_threshold")) and not v.get("rmm_async"):
        raise OptionError(
            f"rmm_release_threshold={v['rmm_release_threshold']!r} needs "
            "rmm_async=True (it configures the async allocator)"
        )
    if (
        not is_off(v.get("rmm_maximum_pool_size"))
        and is_off(v.get("rmm_pool_size"))
        and not v.get("rmm_async")
    ):
        raise OptionError(
            f"rmm_maximum_pool_size={v['rmm_maximum_pool_size']!r} needs "
            "rmm_pool_size (e.g. rmm_pool_size='20GB') or rmm_async=True"
        )
    _check_pool_sizes(v)
    if v.get("enable_nvlink") and v.get("rmm_managed_memory"):
        raise OptionError(
            "enable_nvlink=True and rmm_managed_memory=True cannot be combined: "
            "CUDA IPC cannot share managed memory"
        )
    if v.get("enable_rdmacm") and not v.get("enable_infiniband"):
        raise OptionError("enable_rdmacm=True needs enable_infiniband=True")
    if v.get("jit_unspill") and v.get("enable_cudf_spill"):
        raise OptionError(
            "jit_unspill=True and enable_cudf_spill=True cannot be combined; "
            "choose one spilling mechanism"
        )
    ucx_asked = [
        k
        for k in ("enable_tcp_over_ucx", "enable_infiniband", "enable_nvlink", "enable_rdmacm")
        if v.get(k)
    ]
    if ucx_asked:
        if v.get("protocol") is None:
            v["protocol"] = "ucx"
            o.implied["protocol"] = ucx_asked[0]
        elif v["protocol"] not in UCX_PROTOCOLS:
            raise ProtocolMismatchError(
                f"{ucx_asked[0]}=True needs protocol='ucx', not protocol={v['protocol']!r}"
            )
    _check_workers_per_gpu(v)
    _check_addresses(v)
    tls = [v.get(k) for k in ("tls_ca_file", "tls_cert", "tls_key")]
    if any(tls) and not all(tls):
        raise OptionError("TLS needs all of tls_ca_file, tls_cert and tls_key")


def _check_addresses(v: Mapping[str, Any]) -> None:
    """listen_address names the address and port a worker binds to: host, interface
    and worker_port name them too. The first words of each message are dask-cuda's."""
    listen = v.get("listen_address")
    if v.get("contact_address") and not listen:
        raise OptionError(
            f"Must specify listen_address when contact_address is provided: "
            f"contact_address={v['contact_address']!r} is what the worker "
            "advertises, listen_address what it binds to (e.g. --listen-address "
            "tcp://0.0.0.0:9000 --contact-address tcp://node1:9000)"
        )
    if listen and (v.get("host") or v.get("interface")):
        given = "host" if v.get("host") else "interface"
        raise OptionError(
            f"Cannot specify listen_address when host or interface is given: "
            f"listen_address={listen!r} and {given}={v[given]!r} both name the "
            "address to bind to; give one of them"
        )
    if listen and v.get("worker_port") not in (None, "", 0, "0"):
        raise OptionError(
            f"Cannot specify worker_port when listen_address is given: "
            f"listen_address={listen!r} names the port too; give one of them"
        )


def check_one_worker_options(v: Mapping[str, Any], workers: int) -> None:
    """Options that bind one worker, and worker_port's range, against how many workers
    a node starts (its visible GPUs times workers_per_gpu), before any GPU is looked for."""
    if workers > 1 and (v.get("listen_address") or v.get("contact_address")):
        given = "listen_address" if v.get("listen_address") else "contact_address"
        raise OptionError(
            f"Cannot specify listen_address or contact_address when using "
            f"multiple GPUs: {given}={v[given]!r} names one worker's address, and "
            f"this node starts {workers}; give --host with a --worker-port range "
            "instead, or one GPU per process (CUDA_VISIBLE_DEVICES)"
        )


def _check_pool_sizes(v: Mapping[str, Any]) -> None:
    """rmm_maximum_pool_size no smaller than rmm_pool_size, where both are bytes or
    both fractions of the GPU (a byte size against a fraction waits for the GPU:
    cudask.worker.sizing.device_sizes)."""
    pool, maximum = v.get("rmm_pool_size"), v.get("rmm_maximum_pool_size")
    if is_off(pool) or is_off(maximum):
        return
    small, large = 1 << 40, 1 << 41  # two GPU sizes: a fraction's bytes differ between them
    sizes = [
        [parse_size(x, total=t, name=name, auto=1.0, default=None) for t in (small, large)]
        for x, name in ((pool, "rmm_pool_size"), (maximum, "rmm_maximum_pool_size"))
    ]
    (pool_small, pool_large), (max_small, max_large) = sizes
    if None in (pool_small, max_small):
        return
    same_kind = (pool_small == pool_large) == (max_small == max_large)
    if same_kind and max_small < pool_small:  # type: ignore[operator]
        raise OptionError(
            f"rmm_maximum_pool_size={maximum!r} is smaller than "
            f"rmm_pool_size={pool!r}, the size the pool starts at; accepted: a "
            "maximum at least as large, or none (the pool grows as needed)"
        )


def _check_workers_per_gpu(v: Mapping[str, Any]) -> None:
    """Options that name one worker process, refused with several workers per GPU."""
    n = v.get("workers_per_gpu") or 1
    if n == 1:
        return
    if v.get("nanny") is False:
        raise OptionError(
            f"workers_per_gpu={n} starts {n} worker processes per GPU, each under "
            "a nanny, but nanny=False (--no-nanny, the default in an MPI rank) runs "
            "one worker in this process; give nanny=True (--nanny) or "
            "workers_per_gpu=1"
        )
    if v.get("listen_address"):
        raise OptionError(
            f"listen_address={v['listen_address']!r} binds one worker, but "
            f"workers_per_gpu={n} starts {n} per GPU; give --host with a "
            "--worker-port range instead, or workers_per_gpu=1"
        )


PRELOAD_ACCEPTED = (
    "a module importable where the workers run, a .py file or an http(s) URL, "
    "e.g. preload='cudask.monitor'"
)


def check_libraries(o: WorkerOptions) -> None:
    """The optional libraries the options need (rmm, cuDF, UCX), and the modules
    of pre_import and preload, found (not imported), before any process starts.
    A need that comes from the config names where it was set."""
    v = o.settings

    def needed_for(name: str, text: str) -> str:
        return f"{o.origins[name]}: {text}" if name in o.origins else text

    rmm = [k for k in ("rmm_managed_memory", "rmm_async", "rmm_track_allocations") if v.get(k)]
    rmm += [
        k
        for k in ("rmm_pool_size", "rmm_log_directory", "rmm_allocator_external_lib_list")
        if not is_off(v.get(k))
    ]
    if rmm:
        require_library("rmm", needed_for(rmm[0], f"{rmm[0]}={v[rmm[0]]!r} (an RMM option)"))
    for lib in v.get("rmm_allocator_external_lib_list") or ():
        if not _library(lib):
            raise MissingDependencyError(
                lib,
                needed_for(
                    "rmm_allocator_external_lib_list", f"rmm_allocator_external_lib_list={lib!r}"
                ),
                f"pip install {'cupy-cuda13x' if lib == 'cupy' else lib}",
            )
    if v.get("enable_cudf_spill"):
        require_library("cudf", needed_for("enable_cudf_spill", "enable_cudf_spill=True"))
    if v.get("protocol") in UCX_PROTOCOLS:
        by = o.implied.get("protocol")
        require_library(
            "ucx",
            needed_for(by, f"{by}=True (a UCX transport, so protocol 'ucx')")
            if by
            else needed_for("protocol", f"protocol={v['protocol']!r}"),
        )
    for module in v.get("pre_import") or ():
        if not _library(module):
            raise UnknownModuleError(
                module,
                "pre_import",
                "a module importable where the workers run, e.g. pre_import='json'",
                origin=o.origins.get("pre_import"),
            )
    for item in v.get("preload") or ():
        if item.startswith(("http://", "https://")):
            continue  # distributed downloads it when the worker starts
        if item.endswith(".py"):
            if not os.path.isfile(item):
                raise OptionError(
                    f"preload={item!r}: no such file; accepted: {PRELOAD_ACCEPTED}",
                    option="preload",
                )
        elif not _library(item):
            raise UnknownModuleError(item, "preload", PRELOAD_ACCEPTED)


def flag_args(opt: Option, value: Any) -> list[str]:
    """The `cudask worker` arguments that give `opt` its canonical `value` (as resolve()
    makes it): the CLI's parsing in reverse, for launchers that write a worker's
    command line (cudask.deploy.kube_spec). No shell quoting."""
    if opt.kind in ("bool", "tristate"):
        if value is None:
            return []
        return [opt.cli_flag if value else str(opt.secondary)]
    if value is None:
        return [opt.cli_flag, "0"] if opt.kind == "size" else []  # "0": off
    if opt.kind == "list":
        if opt.name == "preload":  # a repeatable flag
            return [arg for item in value for arg in (opt.cli_flag, item)]
        return [opt.cli_flag, ",".join(value)]
    if opt.name == "resources" and isinstance(value, Mapping):
        value = ",".join(f"{k}={v}" for k, v in value.items())
    elif opt.name == "worker_class" and isinstance(value, type):
        value = f"{value.__module__}.{value.__qualname__}"
    return [opt.cli_flag, str(value)]


def reference() -> str:
    """The options reference (docs/options.md), generated from OPTIONS."""
    lines = [
        "# Worker options",
        "",
        "Generated from `cudask.options.OPTIONS` by `cudask options --markdown`; do not edit.",
        "Unset options take their default from the `cudask.worker` config namespace",
        "(cudask.yaml), so `DASK_CUDASK__WORKER__<NAME>` environment variables work.",
        "",
        "| keyword (LocalCUDACluster) | CUDAWorker | flag | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for o in OPTIONS:
        kw = f"`{o.cluster_keyword}`" if "cluster" in o.surfaces else "—"
        flag = o.cli_flag + (f" / {o.secondary}" if o.secondary else "")
        flag += "".join(f", {f}" for f in o.extra_flags)
        default = f"config `cudask.worker.{o.config}`" if o.config else repr(o.default)
        lines.append(f"| {kw} | `{o.name}` | `{flag}` | {default} | {o.help} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "BY_CLUSTER_KEYWORD",
    "BY_NAME",
    "GROUPS",
    "NODE",
    "OPTIONS",
    "WorkerOptions",
    "check_libraries",
    "check_one_worker_options",
    "check_rules",
    "flag_args",
    "from_config",
    "options_for",
    "reference",
    "require_library",
    "resolve",
]
