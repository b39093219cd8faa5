"""Every check of user input that needs no GPU, run before any GPU is looked for.

Covers: `check_input`, the one function LocalCUDACluster, CUDAWorker and
`dask cuda worker` call before `discover()`: option types, choices and the form of
sizes and protocols (cudask.options.resolve), the rules between options, worker
ports, resources, death_timeout, worker_class, the form of CUDA_VISIBLE_DEVICES,
n_workers, every `cudask.memory.*` config key, and last the optional libraries.
So a typo ("banana" for a size, "0,,x" for the devices) gets its own error on any
machine, with or without a GPU.

Does not cover: what needs the device — a fraction or byte size against *this*
GPU's memory, device indices or UUIDs that name no GPU, n_workers against the
visible GPUs (cudask.worker.spec.check_devices, cudask.devices.parse_visible_devices).

Threading: no state of its own; call it from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dask.utils import parse_timedelta

from cudask.comm.settings import device_ipc_min_size
from cudask.devices.discovery import check_visible_devices
from cudask.errors import OptionError
from cudask.memory.settings import check_memory_config
from cudask.options import Surface, WorkerOptions, check_libraries, resolve
from cudask.worker.spec import parse_ports, parse_resources, worker_class


def _death_timeout(value: Any) -> None:
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError, AttributeError):
        seconds = None
    if isinstance(value, bool) or seconds is None or seconds < 0:
        raise OptionError(f"death_timeout={value!r} is not a duration; accepted: seconds or a "
                          "string such as '60s' or '5 minutes', e.g. death_timeout=60")


def _resources(value: Any) -> None:
    if not isinstance(value, (str, dict)):
        raise OptionError(f"resources={value!r} is not accepted; accepted: a string of "
                          "NAME=AMOUNT pairs such as 'GPU=1 MEM=10e9', or a dict")
    parse_resources(value)


_NODE_CHECKS: dict[str, Callable[[Any], object]] = {
    "worker_port": lambda v: parse_ports(v, 1),  # the count per GPU is checked once known
    "resources": _resources,
    "death_timeout": _death_timeout,
    "worker_class": worker_class,
}


def check_n_workers(n_workers: Any) -> None:
    if n_workers is None:
        return
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise OptionError(f"n_workers={n_workers!r} is not accepted; accepted: a whole number "
                          "of at least 1 (one worker per GPU), e.g. n_workers=2, or None for "
                          "every visible GPU")


def check_input(
    values: Mapping[str, Any],
    surface: Surface,
    *,
    visible_devices: Any = None,
    n_workers: Any = None,
    libraries: bool = True,
) -> WorkerOptions:
    """The resolved options, once every check that needs no GPU has passed.

    `values` are the surface's keywords (LocalCUDACluster's, CUDAWorker's or the
    CLI's); `visible_devices` is CUDA_VISIBLE_DEVICES (the keyword, or the
    environment variable for a node). Raises OptionError (with `option` set
    where one value is at fault) or MissingDependencyError; never looks at a GPU.
    `libraries=False` leaves out the optional libraries, for options checked on one
    machine for workers that run on another (cudask.deploy.jobqueue).
    """
    options = resolve(values, surface, libraries=False)
    for name, check in _NODE_CHECKS.items():
        value = options.settings.get(name)
        if value is None:
            continue
        try:
            check(value)
        except OptionError as exc:
            exc.option = name
            raise
    check_visible_devices(visible_devices)
    check_n_workers(n_workers)
    check_memory_config()
    device_ipc_min_size()  # the cudask.comm keys
    if libraries:
        check_libraries(options)
    return options
