"""Every check of user input that needs no GPU, run before any GPU is looked for.

Covers: `check_input`, the one function LocalCUDACluster, CUDAWorker and
`dask cuda worker` call before `discover()`: keys under `cudask.` that cudask.yaml
does not know, distributed's own settings (cudask.deploy.check_config), option
types, choices and the form of sizes and protocols (cudask.options.resolve), the
rules between options, the scheduler's address or file, addresses, ports,
interfaces (cudask.deploy.check_network), directories, dask's temporary-directory,
the pid file and TLS (cudask.deploy.check_files), the host memory limit against
this machine's, resources, durations, worker_class, the name, security, the form of
CUDA_VISIBLE_DEVICES, n_workers, LocalCluster's keywords and those it hands to
distributed's workers, every `cudask.memory.*` and `cudask.comm.*` key, and last the
optional libraries and the modules to preload. A value from the config names where
it was set.

Does not cover: what needs the device — a fraction or byte size against *this*
GPU's memory, device indices or UUIDs that name no GPU, n_workers against the
visible GPUs (cudask.worker.sizing.check_devices, cudask.devices.parse_visible_devices).

Threading: no state of its own; call it from any thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import dask.config
from dask.utils import format_bytes, parse_timedelta
from distributed.security import Security
from distributed.system import MEMORY_LIMIT

from cudask import config
from cudask.comm.ipc_settings import (
    device_ipc_lease,
    device_ipc_min_size,
    device_ipc_staging,
    map_ahead,
)
from cudask.deploy import check_files as files
from cudask.deploy import check_network as net
from cudask.deploy.check_config import check_distributed_config
from cudask.devices.discovery import check_visible_devices
from cudask.errors import OptionError
from cudask.memory.settings import check_memory_config
from cudask.options import (
    Surface,
    WorkerOptions,
    check_libraries,
    check_one_worker_options,
    from_config,
    resolve,
)
from cudask.sizes import parse_size
from cudask.worker.spec import parse_ports, parse_resources, worker_class


def _seconds(value: Any) -> float | None:
    """`value` in seconds as dask reads a duration (also a negative one), or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().startswith("-"):
        positive = _seconds(value.strip()[1:])
        return None if positive is None else -positive
    try:
        return float(parse_timedelta(value, default="seconds"))
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _duration(name: str, example: str = "60") -> Callable[[Any], None]:
    """A check of a duration keyword (death_timeout, lifetime, ...): seconds, 0 or more."""

    def check(value: Any) -> None:
        seconds = None if isinstance(value, bool) else _seconds(value)
        accepted = (
            "accepted: seconds (0 or more) or a string such as '60s' or '5 minutes', "
            f"e.g. {name}={example}"
        )
        if seconds is None or math.isnan(seconds):
            raise OptionError(f"{name}={value!r} is not a duration; {accepted}", option=name)
        if seconds < 0:
            raise OptionError(f"{name}={value!r} is negative; {accepted}", option=name)

    return check


_death_timeout = _duration("death_timeout")
_RESOURCES_ACCEPTED = (
    "accepted: a string of NAME=AMOUNT pairs such as 'GPU=1 MEM=10e9', or a "
    "dict of names to amounts of 0 or more, e.g. {'GPU': 1}"
)


def _resources(value: Any) -> None:
    if not isinstance(value, (str, dict)):
        raise OptionError(f"resources={value!r} is not accepted; {_RESOURCES_ACCEPTED}")
    amounts = parse_resources(value) or {}
    for name, amount in amounts.items():
        number = isinstance(amount, (int, float)) and not isinstance(amount, bool)
        if not isinstance(name, str) or not number or not amount >= 0:
            raise OptionError(
                f"resources={value!r}: {name!r} has the amount {amount!r}; {_RESOURCES_ACCEPTED}"
            )


def _name(value: Any) -> None:
    accepted = (
        "accepted: a worker name such as 'node1' (several GPUs: node1-0, node1-1, ...) "
        "or an int, e.g. name='node1'"
    )
    if isinstance(value, str) and not value.strip():
        raise OptionError(f"name={value!r} is empty; {accepted}")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise OptionError(f"name={value!r} is not a string or an int; {accepted}")


def _host_memory(value: Any) -> None:
    """memory_limit as bytes no more than this machine has (distributed would ignore it,
    with a warning, once each worker starts)."""
    if isinstance(value, float) and value > 1 and value.is_integer():
        nbytes: int | None = int(value)
    else:
        nbytes = parse_size(value, total=MEMORY_LIMIT, name="memory_limit")
    if nbytes is not None and nbytes > MEMORY_LIMIT:
        raise OptionError(
            f"memory_limit={value!r} is {format_bytes(nbytes)}, more than this "
            f"machine's {format_bytes(MEMORY_LIMIT)} of memory; accepted: at most "
            f"{format_bytes(MEMORY_LIMIT)}, a fraction such as 0.5, or 'auto' "
            "(an even share)",
            option="memory_limit",
        )


def _scheduler_file(path: str) -> None:
    """A scheduler file that exists is one a scheduler wrote (one not yet written is
    waited for, as distributed's workers wait)."""
    address = files.read_scheduler_file(path)
    if address is None:
        return
    try:
        net.check_scheduler_address(address)
    except OptionError as exc:
        raise OptionError(
            f"scheduler_file={path!r} holds the address {address!r}, which is not one: {exc}",
            option="scheduler_file",
        ) from None


def _security(value: Any, cluster: bool) -> None:
    if value is None or isinstance(value, Security) or cluster and isinstance(value, bool):
        return
    accepted = (
        "a distributed.Security, True (temporary certificates, as LocalCluster makes) or None"
        if cluster
        else "a distributed.Security or None"
    )
    raise OptionError(
        f"security={value!r} is not accepted; accepted: {accepted}", option="security"
    )


def _no_nthreads(value: Any) -> None:
    raise OptionError(
        f"nthreads={value!r}: LocalCUDACluster's keyword for the threads of each "
        "worker is threads_per_worker, as LocalCluster's; accepted: "
        f"threads_per_worker, e.g. threads_per_worker={value!r}",
        option="nthreads",
    )


def _mapping(name: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise OptionError(
                f"{name}={value!r} is not a dict; accepted: a dict of keywords, e.g. {name}={{}}",
                option=name,
            )

    return check


_OPTION_CHECKS: dict[str, Callable[[Any], object]] = {
    "worker_port": lambda v: parse_ports(v, 1),  # the count per GPU is checked once known
    "resources": _resources,
    "death_timeout": _death_timeout,
    "worker_class": worker_class,
    "name": _name,
    "host": net.check_host,
    "listen_address": net.check_listen_address,
    "contact_address": net.check_contact_address,
    "dashboard_address": lambda v: net.check_dashboard_address("dashboard_address", v),
    "interface": net.check_interface,
    "local_directory": lambda v: files.check_directory("local_directory", v),
    "rmm_log_directory": lambda v: files.check_directory("rmm_log_directory", v),
    "pid_file": files.check_pid_file,
    "scheduler_file": _scheduler_file,
    "memory_limit": _host_memory,
}

# Checks of a value's form alone, also for workers that run on another machine
# (the others look at this machine: its addresses, interfaces, files).
_FORM_ONLY = (
    "worker_port",
    "resources",
    "death_timeout",
    "worker_class",
    "name",
    "contact_address",
)

_CLUSTER_CHECKS: dict[str, Callable[[Any], object]] = {
    "host": net.check_host,
    "scheduler_port": lambda v: net.check_port("scheduler_port", v),
    "dashboard_address": lambda v: net.check_dashboard_address("dashboard_address", v),
    "worker_dashboard_address": lambda v: net.check_dashboard_address(
        "worker_dashboard_address", v
    ),
    "silence_logs": net.check_silence_logs,
    # distributed.Worker's and Nanny's keywords, which LocalCluster hands on
    "death_timeout": _death_timeout,
    "lifetime": _duration("lifetime", "'1 hour'"),
    "lifetime_stagger": _duration("lifetime_stagger", "'5 minutes'"),
    "heartbeat_interval": _duration("heartbeat_interval", "'1s'"),
    "resources": _resources,
    "security": lambda v: _security(v, cluster=True),
    "scheduler_kwargs": _mapping("scheduler_kwargs"),
    "nthreads": _no_nthreads,
}


def check_n_workers(n_workers: Any) -> None:
    if n_workers is None:
        return
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise OptionError(
            f"n_workers={n_workers!r} is not accepted; accepted: a whole number "
            "of at least 1 (one worker per GPU), e.g. n_workers=2, or None for "
            "every visible GPU"
        )


def check_config_keys() -> None:
    """No key under `cudask.` that cudask.yaml does not know (a typo is not ignored)."""
    for key, close in config.unknown_keys():
        where = config.origin(key, config.user_value(key)) or f"config key {key}"
        key = key.replace("_", "-")
        if key in config.REMOVED:
            raise OptionError(
                f"{where}: {key} is no longer a setting ({config.REMOVED[key]}); remove it",
                origin=where,
            )
        accepted = f"accepted: the keys of cudask.yaml ({config.DEFAULTS_FILE})"
        if close and close.startswith(key + "."):
            raise OptionError(
                f"{where}: {key} is a section of keys such as {close}, not a value; {accepted}",
                origin=where,
            )
        hint = f"did you mean {close}?" if close else "no known key is close"
        raise OptionError(f"{where}: unknown config key {key}; {hint} ({accepted})", origin=where)


def _config_origin(check: Callable[[], object]) -> None:
    """Run a check of `cudask.*` keys; its error names where the key was set."""
    try:
        check()
    except OptionError as exc:
        key = re.match(r"(cudask\.[\w.-]+)=", str(exc))
        where = config.origin(key.group(1)) if key else None
        if where is None:
            raise
        raise OptionError(
            str(exc) if where.startswith("config key ") else f"{where}: {exc}", origin=where
        ) from None


def _check_temporary_directory() -> None:
    """dask's temporary-directory, where the workers write without a local_directory."""
    path = dask.config.get("temporary-directory", None)
    if not path:
        return
    try:
        files.check_directory("temporary-directory", path)
    except OptionError as exc:
        where = config.origin("temporary-directory") or "config key temporary-directory"
        text = f"{exc}, or give local_directory (--local-directory) another"
        raise OptionError(
            text if where.startswith("config key ") else f"{where}: {text}", origin=where
        ) from None


def _check_scheduler(options: WorkerOptions, scheduler: Any, origin: str | None) -> str | None:
    """The scheduler's address (and its scheme), or a scheduler file, not both."""
    if scheduler is None:
        return None
    if options.scheduler_file is not None:
        raise OptionError(
            f"give the scheduler's address ({scheduler}) or scheduler_file "
            f"({options.scheduler_file}), not both",
            option="scheduler_file",
        )
    try:
        return net.check_scheduler_address(scheduler)
    except OptionError as exc:
        exc.option = "scheduler"
        if origin is None:
            raise
        raise OptionError(f"{origin}: {exc}", option="scheduler", origin=origin) from None


def _tls_asked(
    options: WorkerOptions, scheduler: Any, scheme: str | None, host: Any
) -> tuple[str, str] | None:
    """The option that asks for TLS and its value (for the message), or None."""
    if options.protocol == "tls":
        return "protocol", "protocol='tls'"
    if scheme == "tls":
        return "scheduler", f"scheduler={scheduler!r}"
    for name, value in (("listen_address", options.get("listen_address")), ("host", host)):
        if isinstance(value, str) and value.startswith("tls://"):
            return name, f"{name}={value!r}"
    return None


def _check_options(
    options: WorkerOptions, checks: Mapping[str, Callable[[Any], object]], values: Mapping[str, Any]
) -> None:
    for name, check in checks.items():
        value = values.get(name)
        if value is None:
            continue
        try:
            check(value)
        except OptionError as exc:
            raise from_config(exc, options.origins, name) from None


def _check_node_workers(options: WorkerOptions, visible_devices: Any) -> None:
    """A node's options against the workers its CUDA_VISIBLE_DEVICES will start, when it
    is set (unset: every GPU, counted once they are found)."""
    entries = (
        visible_devices.split(",")
        if isinstance(visible_devices, str)
        else [visible_devices]
        if isinstance(visible_devices, int)
        else visible_devices
    )
    workers = len(entries) * (options.workers_per_gpu or 1)
    check_one_worker_options(options.settings, workers)
    try:
        parse_ports(options.worker_port, workers)
    except OptionError as exc:
        raise from_config(exc, options.origins, "worker_port") from None


def check_input(
    values: Mapping[str, Any],
    surface: Surface,
    *,
    visible_devices: Any = None,
    visible_origin: str | None = None,
    n_workers: Any = None,
    libraries: bool = True,
    scheduler: Any = None,
    scheduler_origin: str | None = None,
    security: Any = None,
    cluster: Mapping[str, Any] | None = None,
) -> WorkerOptions:
    """The resolved options, once every check that needs no GPU has passed.

    `values` are the surface's keywords (LocalCUDACluster's, CUDAWorker's or the
    CLI's); `visible_devices` is CUDA_VISIBLE_DEVICES (the keyword, or the
    environment variable: `visible_origin` then says so); `scheduler` the scheduler's address and
    `scheduler_origin` where it came from when not an argument (e.g. "environment
    variable DASK_SCHEDULER_ADDRESS"); `security` a distributed.Security given
    beside the options; `cluster` LocalCluster's own keywords. Raises OptionError
    (with `option` set where one value is at fault, `origin` where it came from the
    config) or MissingDependencyError; never looks at a GPU. `libraries=False`
    leaves out the optional libraries, the modules to preload and the files, for
    options checked on one machine for workers that run on another
    (cudask.deploy.jobqueue, cudask.deploy.kube_checks).
    """
    check_config_keys()
    if libraries:  # distributed's settings of this machine, where its workers read them
        check_distributed_config()
    options = resolve(values, surface, libraries=False)
    local = {k: v for k, v in _OPTION_CHECKS.items() if libraries or k in _FORM_ONLY}
    _check_options(options, local, options.settings)
    if cluster is not None:
        _check_options(options, _CLUSTER_CHECKS, cluster)
    elif security is not None:
        _check_options(
            options, {"security": lambda v: _security(v, cluster=False)}, {"security": security}
        )
    if libraries and options.local_directory is None:
        _check_temporary_directory()
    scheme = _check_scheduler(options, scheduler, scheduler_origin)
    if libraries:
        files.check_tls_files(options.settings)
        host = (cluster or {}).get("host", options.get("host"))
        files.check_tls_needs(
            _tls_asked(options, scheduler, scheme, host),
            options.settings,
            (cluster or {}).get("security", security),
            cluster=cluster is not None,
        )
    try:
        check_visible_devices(visible_devices)
    except OptionError as exc:
        if visible_origin is None:
            raise
        raise OptionError(
            f"{visible_origin}: {exc}", option=exc.option, origin=visible_origin
        ) from None
    if surface != "cluster" and visible_devices is not None:
        _check_node_workers(options, visible_devices)
    check_n_workers(n_workers)
    _config_origin(check_memory_config)
    _config_origin(device_ipc_min_size)  # the cudask.comm keys
    _config_origin(device_ipc_lease)
    _config_origin(map_ahead)
    _config_origin(device_ipc_staging)
    if libraries:
        check_libraries(options)
    return options
