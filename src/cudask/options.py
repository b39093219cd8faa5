"""Every worker option, declared once.

Covers: the table of options (name, kind, default, help, validation, where it
appears, the `--help` section it is listed in: GROUPS), reading defaults from the
`cudask.worker` config namespace, turning user values into canonical ones, and the
cross-option rules shared by
LocalCUDACluster, CUDAWorker and the CLI. The keyword arguments of
LocalCUDACluster and CUDAWorker, the flags of `dask cuda worker` and the
reference page docs/options.md are all generated from OPTIONS.

Does not cover: per-device sizes (cudask.worker.spec parses those against each
GPU's memory) and starting anything.

Threading: the table is built at import and never changed; the functions only
read it and dask.config, so call them from any thread.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cudask import config
from cudask.errors import MissingDependencyError, OptionError, UnknownModuleError
from cudask.option_value import ALL, UCX_PROTOCOLS, Option, Surface, coerce
from cudask.sizes import is_off, parse_size

NODE: frozenset[Surface] = frozenset({"worker", "cli"})  # one node's workers, not LocalCUDACluster


def _bool(name: str, help: str, cfg: str | None = None, *, on: str | None = None,
          off: str | None = None, group: str = "workers", surfaces: frozenset[Surface] = ALL,
          tristate: bool = False, default: Any = None) -> Option:
    flag = on or "--" + name.replace("_", "-")
    return Option(name, "tristate" if tristate else "bool", help, config=cfg, flag=flag,
                  secondary=off or "--no-" + flag[2:], group=group, surfaces=surfaces,
                  default=default)


OPTIONS: tuple[Option, ...] = (
    # group: the section of `cudask worker --help` (GROUPS)
    Option("nthreads", "int", "Threads of each worker.", config="threads-per-worker",
           cluster_name="threads_per_worker", minimum=1, group="workers"),
    Option("workers_per_gpu", "int", "Workers on each GPU (several for many small tasks, or a "
           "GPU shared by jobs): each gets 1/N of device_memory_limit, of the RMM pool sizes and "
           "release threshold, an even share of 'auto' host memory and of the GPU's CPUs; "
           "LocalCUDACluster names them GPU-K ('0-1'), a named node NAME-0, NAME-1, ... "
           "(docs/workers-per-gpu.md).", config="workers-per-gpu", minimum=1, group="workers"),
    Option("memory_limit", "size", "Host memory of each worker, past which data spills from "
           "host to disk: bytes, a string such as '40GB', a fraction of system memory, 'auto' "
           "(an even share of system memory) or 0/None for no limit.", config="memory-limit",
           group="memory"),
    Option("device_memory_limit", "size", "Device memory each worker keeps data in before it "
           "spills to host: bytes, '40GB', a fraction of the GPU's memory, 'auto' (all of it), "
           "'default' (80%; off on GPUs without dedicated memory) or 0/None for no spilling.",
           config="device-memory-limit", group="memory"),
    Option("local_directory", "path", "Directory for spilled data and worker files; default: "
           "dask's temporary-directory.", config="local-directory", group="memory"),
    Option("log_spilling", "bool", "Log every move of data between device, host and disk (INFO, "
           "in the worker's log: logger distributed.worker.memory).", config="log-spilling",
           flag="--log-spilling", secondary="--no-log-spilling", group="memory"),
    _bool("jit_unspill", "Hand tasks proxies that stay spilled until the task touches them "
          "(JIT-unspill).", "jit-unspill", on="--enable-jit-unspill", off="--disable-jit-unspill",
          group="memory"),
    _bool("gc_freeze", "Once the worker has started and imported CuPy, move the objects it "
          "has so far out of the garbage collector's scans (gc.freeze), so that Python's "
          "full collections, which pause every task, scan only what came later.",
          "gc-freeze", group="workers"),
    Option("protocol", "str", "Protocol: 'tcp', 'tls', 'ucx', ... (default: dask's, tcp).",
           config="protocol", group="network"),
    Option("interface", "str", "Network interface to listen on, such as 'eth0' or 'ib0'.",
           config="interface", group="network"),
    _bool("enable_tcp_over_ucx", "UCX over TCP (protocol 'ucx'); unset leaves the transports "
          "to UCX.", "enable-tcp-over-ucx", on="--enable-tcp-over-ucx",
          off="--disable-tcp-over-ucx", group="ucx", tristate=True),
    _bool("enable_infiniband", "UCX over InfiniBand (protocol 'ucx').", "enable-infiniband",
          on="--enable-infiniband", off="--disable-infiniband", group="ucx", tristate=True),
    _bool("enable_nvlink", "UCX over NVLink / CUDA IPC (protocol 'ucx').", "enable-nvlink",
          on="--enable-nvlink", off="--disable-nvlink", group="ucx", tristate=True),
    _bool("enable_rdmacm", "UCX RDMA connection manager (needs InfiniBand).", "enable-rdmacm",
          on="--enable-rdmacm", off="--disable-rdmacm", group="ucx", tristate=True),
    Option("rmm_pool_size", "size", "RMM pool of each worker: bytes, '20GB' or a fraction of "
           "the GPU's memory; default: no pool.", config="rmm-pool-size", group="rmm"),
    Option("rmm_maximum_pool_size", "size", "Largest size the RMM pool may grow to (needs "
           "rmm_pool_size or rmm_async).", config="rmm-maximum-pool-size", group="rmm"),
    _bool("rmm_managed_memory", "Allocate CUDA managed (unified) memory through RMM.",
          "rmm-managed-memory", group="rmm"),
    _bool("rmm_async", "Allocate through cudaMallocAsync (RMM's CudaAsyncMemoryResource).",
          "rmm-async", group="rmm"),
    Option("rmm_release_threshold", "size", "Memory the async pool holds before it releases "
           "memory to the system (needs rmm_async).", config="rmm-release-threshold",
           group="rmm"),
    Option("rmm_log_directory", "path", "Directory for RMM allocation logs, one file per worker.",
           config="rmm-log-directory", group="rmm"),
    _bool("rmm_track_allocations", "Track RMM allocations (read by `cudask config`).",
          "rmm-track-allocations", group="rmm"),
    Option("rmm_allocator_external_lib_list", "list", "Libraries whose GPU allocations go "
           "through RMM: 'cupy', 'torch' (comma-separated or a list).",
           config="rmm-allocator-external-lib-list", choices=("cupy", "torch"), group="rmm",
           flag="--set-rmm-allocator-for-libs",
           extra_flags=("--rmm-allocator-external-lib-list",)),
    _bool("enable_cudf_spill", "cuDF's own spilling too (needs cuDF): when an allocation "
          "fails, cuDF spills its least recently used buffers; the store still holds "
          "device_memory_limit; results reach any client.",
          "enable-cudf-spill",
          on="--enable-cudf-spill", off="--disable-cudf-spill", group="memory"),
    Option("cudf_spill_stats", "int", "cuDF spill statistics level: 0, 1 or 2.",
           config="cudf-spill-stats", group="memory", minimum=0, maximum=2),
    Option("pre_import", "list", "Modules each worker imports at start; a missing one fails the "
           "start (comma-separated or a list).", config="pre-import", group="workers"),
    # one node's workers (CUDAWorker and the CLI)
    Option("scheduler_file", "path", "JSON file the scheduler wrote its address to.",
           surfaces=NODE, group="scheduler"),
    Option("host", "str", "Address the workers listen on and advertise; default: the "
           "interface's address.", surfaces=NODE, group="network"),
    Option("worker_port", "any", "Port of each worker: a number, or a range FIRST:LAST split "
           "across the GPUs (9000:9003 gives 9000..9003 to 4 workers); default: random.",
           surfaces=NODE, group="network"),
    Option("listen_address", "str", "Address the workers bind to, e.g. tcp://0.0.0.0:9000.",
           surfaces=NODE, group="network"),
    Option("contact_address", "str", "Address the workers advertise to the scheduler.",
           surfaces=NODE, group="network"),
    Option("name", "any", "Worker name (a string, or an int such as dask-mpi's rank): one "
           "worker registers exactly it, several (GPUs x workers_per_gpu) register NAME-0, "
           "NAME-1, ...; default: none (each worker is known by its address, as in distributed).",
           surfaces=NODE, group="workers"),
    Option("resources", "any", "Abstract resources of each worker, e.g. 'GPU=1 MEM=10e9'.",
           surfaces=NODE, group="workers"),
    Option("pid_file", "path", "File to write the process id to.", surfaces=NODE, group="workers"),
    Option("expected_gpus", "int", "GPUs this node must have: with fewer visible, fail at start "
           "naming both numbers (a Kubernetes pod given fewer than its nvidia.com/gpu limit, a "
           "batch job on the wrong nodes); default: none (a worker per GPU visible).",
           surfaces=NODE, group="workers", minimum=1),
    Option("preload", "list", "Modules or scripts each worker preloads (repeatable).",
           surfaces=NODE, group="workers"),
    Option("death_timeout", "any", "Seconds a worker waits for the scheduler before it closes.",
           surfaces=NODE, group="scheduler"),
    _bool("dashboard", "Serve each worker's diagnostics dashboard.", None, surfaces=NODE,
          group="network", default=True),
    Option("dashboard_address", "str", "Address of each worker's dashboard (port 0: random).",
           default=":0", surfaces=NODE, group="network"),
    Option("dashboard_prefix", "str", "URL prefix of the workers' dashboards.", surfaces=NODE,
           group="network"),
    Option("tls_ca_file", "str", "CA certificate file for TLS.", surfaces=NODE, group="scheduler"),
    Option("tls_cert", "str", "Worker certificate file for TLS.", surfaces=NODE, group="scheduler"),
    Option("tls_key", "str", "Worker private key file for TLS.", surfaces=NODE, group="scheduler"),
    Option("multiprocessing_method", "choice", "How worker processes are started.",
           default="spawn", choices=("spawn", "fork", "forkserver"), surfaces=NODE,
           group="workers"),
    _bool("nanny", "Run each worker under a Nanny process (--no-nanny for sites that forbid "
          "forking: workers then run in this process).", None, surfaces=NODE, group="workers",
          default=True),
    Option("worker_class", "any", "Worker class the nanny starts, or a Nanny subclass to start "
           "instead of the Nanny, as dask-cuda accepts (import path on the CLI).",
           surfaces=ALL, group="workers"),
)

#: The sections of `cudask worker --help`, in order: each option's `group` and its title.
GROUPS: dict[str, str] = {
    "scheduler": "Scheduler",
    "workers": "Workers",
    "memory": "Memory and spilling",
    "rmm": "RMM (device memory allocation)",
    "network": "Network and dashboard",
    "ucx": "UCX transports",
}

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
BY_CLUSTER_KEYWORD: dict[str, Option] = {
    o.cluster_keyword: o for o in OPTIONS if "cluster" in o.surfaces
}


def options_for(surface: Surface) -> list[Option]:
    return [o for o in OPTIONS if surface in o.surfaces]


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


def resolve(values: Mapping[str, Any], surface: Surface, *,
            libraries: bool = True) -> WorkerOptions:
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
    table = BY_CLUSTER_KEYWORD if surface == "cluster" else {o.name: o for o in options_for(surface)}
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
            resolved.settings[opt.name] = coerce(opt, value, text=text) \
                if value is not None else None
        except OptionError as exc:
            error = from_config(exc, resolved.origins, opt.name)
            if keyword != opt.name:  # LocalCUDACluster's name for it (threads_per_worker)
                error = OptionError(str(error).replace(f"{opt.name}=", f"{keyword}="),
                                    option=opt.name, origin=error.origin)
            raise error from None
    try:
        check_rules(resolved)
    except OptionError as exc:
        raise from_config(exc, resolved.origins) from None
    if libraries:
        check_libraries(resolved)
    return resolved


def from_config(exc: OptionError, origins: Mapping[str, str],
                 option: str | None = None) -> OptionError:
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
    if v.get("rmm_async") and v.get("rmm_managed_memory"):
        raise OptionError("rmm_async=True and rmm_managed_memory=True cannot be combined; "
                          "choose one allocator")
    if not is_off(v.get("rmm_release_threshold")) and not v.get("rmm_async"):
        raise OptionError(f"rmm_release_threshold={v['rmm_release_threshold']!r} needs "
                          "rmm_async=True (it configures the async allocator)")
    if not is_off(v.get("rmm_maximum_pool_size")) and is_off(v.get("rmm_pool_size")) \
            and not v.get("rmm_async"):
        raise OptionError(f"rmm_maximum_pool_size={v['rmm_maximum_pool_size']!r} needs "
                          "rmm_pool_size (e.g. rmm_pool_size='20GB') or rmm_async=True")
    _check_pool_sizes(v)
    if v.get("enable_nvlink") and v.get("rmm_managed_memory"):
        raise OptionError("enable_nvlink=True and rmm_managed_memory=True cannot be combined: "
                          "CUDA IPC cannot share managed memory")
    if v.get("enable_rdmacm") and not v.get("enable_infiniband"):
        raise OptionError("enable_rdmacm=True needs enable_infiniband=True")
    if v.get("jit_unspill") and v.get("enable_cudf_spill"):
        raise OptionError("jit_unspill=True and enable_cudf_spill=True cannot be combined; "
                          "choose one spilling mechanism")
    ucx_asked = [k for k in ("enable_tcp_over_ucx", "enable_infiniband", "enable_nvlink",
                             "enable_rdmacm") if v.get(k)]
    if ucx_asked:
        if v.get("protocol") is None:
            v["protocol"] = "ucx"
            o.implied["protocol"] = ucx_asked[0]
        elif v["protocol"] not in UCX_PROTOCOLS:
            raise OptionError(f"{ucx_asked[0]}=True needs protocol='ucx', not "
                              f"protocol={v['protocol']!r}")
    _check_workers_per_gpu(v)
    if v.get("contact_address") and not v.get("listen_address"):
        raise OptionError(f"contact_address={v['contact_address']!r} needs listen_address, the "
                          "address the worker binds to (e.g. --listen-address tcp://0.0.0.0:9000 "
                          "--contact-address tcp://node1:9000)")
    if v.get("listen_address") and (v.get("host") or v.get("worker_port")):
        raise OptionError(f"listen_address={v['listen_address']!r} cannot be combined with host "
                          "or worker_port: it names both")
    tls = [v.get(k) for k in ("tls_ca_file", "tls_cert", "tls_key")]
    if any(tls) and not all(tls):
        raise OptionError("TLS needs all of tls_ca_file, tls_cert and tls_key")


def _check_pool_sizes(v: Mapping[str, Any]) -> None:
    """rmm_maximum_pool_size no smaller than rmm_pool_size, where both are bytes or
    both fractions of the GPU (a byte size against a fraction waits for the GPU:
    cudask.worker.spec.device_sizes)."""
    pool, maximum = v.get("rmm_pool_size"), v.get("rmm_maximum_pool_size")
    if is_off(pool) or is_off(maximum):
        return
    small, large = 1 << 40, 1 << 41  # two GPU sizes: a fraction's bytes differ between them
    sizes = [[parse_size(x, total=t, name=name, auto=1.0, default=None) for t in (small, large)]
             for x, name in ((pool, "rmm_pool_size"), (maximum, "rmm_maximum_pool_size"))]
    (pool_small, pool_large), (max_small, max_large) = sizes
    if None in (pool_small, max_small):
        return
    same_kind = (pool_small == pool_large) == (max_small == max_large)
    if same_kind and max_small < pool_small:  # type: ignore[operator]
        raise OptionError(f"rmm_maximum_pool_size={maximum!r} is smaller than "
                          f"rmm_pool_size={pool!r}, the size the pool starts at; accepted: a "
                          "maximum at least as large, or none (the pool grows as needed)")


def _check_workers_per_gpu(v: Mapping[str, Any]) -> None:
    """Options that name one worker process, refused with several workers per GPU."""
    n = v.get("workers_per_gpu") or 1
    if n == 1:
        return
    if v.get("nanny") is False:
        raise OptionError(f"workers_per_gpu={n} starts {n} worker processes per GPU, each under "
                          "a nanny, but nanny=False (--no-nanny, the default in an MPI rank) runs "
                          "one worker in this process; give nanny=True (--nanny) or "
                          "workers_per_gpu=1")
    if v.get("listen_address"):
        raise OptionError(f"listen_address={v['listen_address']!r} binds one worker, but "
                          f"workers_per_gpu={n} starts {n} per GPU; give --host with a "
                          "--worker-port range instead, or workers_per_gpu=1")


PRELOAD_ACCEPTED = ("a module importable where the workers run, a .py file or an http(s) URL, "
                    "e.g. preload='cudask.monitor'")


def check_libraries(o: WorkerOptions) -> None:
    """The optional libraries the options need (rmm, cuDF, UCX), and the modules
    of pre_import and preload, found (not imported), before any process starts.
    A need that comes from the config names where it was set."""
    v = o.settings

    def needed_for(name: str, text: str) -> str:
        return f"{o.origins[name]}: {text}" if name in o.origins else text

    rmm = [k for k in ("rmm_managed_memory", "rmm_async", "rmm_track_allocations")
           if v.get(k)]
    rmm += [k for k in ("rmm_pool_size", "rmm_log_directory", "rmm_allocator_external_lib_list")
            if not is_off(v.get(k))]
    if rmm:
        require_library("rmm", needed_for(rmm[0], f"{rmm[0]}={v[rmm[0]]!r} (an RMM option)"))
    for lib in v.get("rmm_allocator_external_lib_list") or ():
        if not _library(lib):
            raise MissingDependencyError(lib, needed_for("rmm_allocator_external_lib_list",
                                                         f"rmm_allocator_external_lib_list={lib!r}"),
                                         f"pip install {'cupy-cuda13x' if lib == 'cupy' else lib}")
    if v.get("enable_cudf_spill"):
        require_library("cudf", needed_for("enable_cudf_spill", "enable_cudf_spill=True"))
    if v.get("protocol") in UCX_PROTOCOLS:
        by = o.implied.get("protocol")
        require_library("ucx", needed_for(by, f"{by}=True (a UCX transport, so protocol 'ucx')")
                        if by else needed_for("protocol", f"protocol={v['protocol']!r}"))
    for module in v.get("pre_import") or ():
        if not _library(module):
            raise UnknownModuleError(module, "pre_import", "a module importable where the "
                                     "workers run, e.g. pre_import='json'",
                                     origin=o.origins.get("pre_import"))
    for item in v.get("preload") or ():
        if item.startswith(("http://", "https://")):
            continue  # distributed downloads it when the worker starts
        if item.endswith(".py"):
            if not os.path.isfile(item):
                raise OptionError(f"preload={item!r}: no such file; accepted: "
                                  f"{PRELOAD_ACCEPTED}", option="preload")
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
