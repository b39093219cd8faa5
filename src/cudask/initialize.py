"""The client side of a UCX cluster, and the preload that gives a worker the same set-up.

Covers: `initialize(...)`, with dask-cuda's keywords, which a client (or the process
that starts a scheduler) calls before it connects to UCX workers: it writes the
`distributed-ucxx` config for the enable_* transports and, by default, creates the
CUDA context on this process's first visible GPU; and `dask_setup`, the entry point of
`--preload cudask.initialize` (distributed's preload protocol: a click command taking
the worker), which does the same in a worker process. Does not cover: cudask's own
workers, which get both from their spec (cudask.worker.spec).

Threading: call `initialize` once, from the thread that then creates the Client; it
changes process-wide state (dask.config, the CUDA context).
"""

from __future__ import annotations

import logging
from typing import Any

import click
import dask.config

from cudask.comm.ucx import get_ucx_config
from cudask.worker.context import active_contexts, device0_uuid

logger = logging.getLogger("cudask")


def make_cuda_context() -> str:
    """Create the CUDA context on device 0 of this process, naming a context that was
    there before; the device's UUID."""
    for ordinal, uuid in active_contexts() or ():
        logger.warning(
            "a CUDA context already exists on device %d (%s) in this process: it "
            "was made before cudask.initialize (docs/cuda-contexts.md)",
            ordinal,
            uuid,
        )
    return device0_uuid()


def initialize(
    create_cuda_context: bool = True,
    enable_tcp_over_ucx: bool | None = None,
    enable_infiniband: bool | None = None,
    enable_nvlink: bool | None = None,
    enable_rdmacm: bool | None = None,
) -> None:
    """Configure UCX's transports for this process (None leaves a transport to UCX) and,
    with `create_cuda_context`, create the CUDA context on its first visible GPU."""
    config = get_ucx_config(
        enable_tcp_over_ucx=enable_tcp_over_ucx,
        enable_infiniband=enable_infiniband,
        enable_nvlink=enable_nvlink,
        enable_rdmacm=enable_rdmacm,
    )
    if config is not None:
        dask.config.set({"distributed-ucxx": config})
    if create_cuda_context:
        make_cuda_context()


def _flag(name: str) -> Any:
    return click.option(f"--{name}/--no-{name}", default=None, help=f"UCX: {name}.")


@click.command()
@click.option(
    "--create-cuda-context/--no-create-cuda-context",
    default=False,
    help="Create the CUDA context when the worker starts.",
)
@_flag("enable-tcp-over-ucx")
@_flag("enable-infiniband")
@_flag("enable-nvlink")
@_flag("enable-rdmacm")
def dask_setup(
    worker: Any,
    create_cuda_context: bool,
    enable_tcp_over_ucx: bool | None = None,
    enable_infiniband: bool | None = None,
    enable_nvlink: bool | None = None,
    enable_rdmacm: bool | None = None,
) -> None:
    """`--preload cudask.initialize [--create-cuda-context] [--enable-...]`."""
    initialize(
        create_cuda_context=create_cuda_context,
        enable_tcp_over_ucx=enable_tcp_over_ucx,
        enable_infiniband=enable_infiniband,
        enable_nvlink=enable_nvlink,
        enable_rdmacm=enable_rdmacm,
    )


__all__ = ["dask_setup", "initialize", "make_cuda_context"]
