"""Which UCX transports a cluster asks for, as distributed-ucxx reads them.

Covers: `transports`, the rule by which the enable_* options choose UCX transports
(unset leaves the choice to UCX; disabling some and enabling none turns the unnamed
ones on; any enabled transport turns on CUDA copies), `get_ucx_config`, the whole
`distributed-ucxx` config section for a client or scheduler process (None where
distributed-ucxx is not installed), and `get_preload_options`, the preload that
gives a plain distributed worker the same set-up. The names and return values are
dask-cuda 26.10's. Does not cover: the comm itself (distributed-ucxx), nor the
workers' own config (cudask.worker.spec uses `transports`).

Threading: `get_ucx_config` reads dask.config (and loads distributed-ucxx's
defaults into it once); the rest are pure functions.
"""

from __future__ import annotations

from typing import Any

import dask.config

#: The UCX transport options, by their distributed-ucxx config names.
TRANSPORTS = ("tcp", "infiniband", "nvlink")
#: The module a worker preloads to get the client side's set-up (cudask.initialize).
PRELOAD = "cudask.initialize"


def transports(
    tcp: bool | None, infiniband: bool | None, nvlink: bool | None, rdmacm: bool | None = None
) -> dict[str, bool | None]:
    """distributed-ucxx's transport keys for the enable_* options."""
    chosen = {"tcp": tcp, "infiniband": infiniband, "nvlink": nvlink}
    if any(v is False for v in chosen.values()) and not any(v is True for v in chosen.values()):
        chosen = {k: True if v is None else v for k, v in chosen.items()}
    return {
        **chosen,
        "rdmacm": rdmacm,
        "create-cuda-context": True,
        "cuda-copy": True if any(chosen.values()) else None,
    }


def get_ucx_config(
    enable_tcp_over_ucx: bool | None = None,
    enable_infiniband: bool | None = None,
    enable_nvlink: bool | None = None,
    enable_rdmacm: bool | None = None,
) -> dict[str, Any] | None:
    """The `distributed-ucxx` config section with these transports; None without
    distributed-ucxx."""
    try:
        import distributed_ucxx.config
    except ImportError:
        return None
    distributed_ucxx.config.setup_config()
    section = dict(dask.config.get("distributed-ucxx"))
    chosen = transports(enable_tcp_over_ucx, enable_infiniband, enable_nvlink, enable_rdmacm)
    for key, value in chosen.items():
        section[dask.config.canonical_name(key, section)] = value
    return section


def get_preload_options(
    protocol: str | None = None,
    create_cuda_context: bool | None = None,
    enable_tcp_over_ucx: bool | None = None,
    enable_infiniband: bool | None = None,
    enable_nvlink: bool | None = None,
    enable_rdmacm: bool | None = None,
) -> dict[str, list[str]]:
    """`preload` and `preload_argv` for a distributed worker: the CUDA context and, for
    protocol "ucx", the transports."""
    argv = ["--create-cuda-context"] if create_cuda_context else []
    if protocol in ("ucx", "ucxx"):
        flags = {
            "--enable-tcp-over-ucx": enable_tcp_over_ucx,
            "--enable-infiniband": enable_infiniband,
            "--enable-nvlink": enable_nvlink,
            "--enable-rdmacm": enable_rdmacm,
        }
        argv += [flag for flag, on in flags.items() if on]
    return {"preload": [PRELOAD], "preload_argv": argv}


__all__ = ["PRELOAD", "TRANSPORTS", "get_preload_options", "get_ucx_config", "transports"]
