"""UCX transport choice (cudask.comm.ucx) and the preload options, as dask-cuda's utils
give them; distributed-ucxx is not needed for the rule."""

from __future__ import annotations

import itertools

import pytest

from cudask.comm.ucx import get_preload_options, transports

CHOICES = (True, False, None)


@pytest.mark.parametrize("tcp, ib, nvlink", list(itertools.product(CHOICES, repeat=3)))
def test_transports(tcp, ib, nvlink):
    got = transports(tcp, ib, nvlink)
    given = {"tcp": tcp, "infiniband": ib, "nvlink": nvlink}
    only_off = any(v is False for v in given.values()) and not any(
        v is True for v in given.values()
    )
    for key, value in given.items():
        # unset stays unset (UCX chooses), unless some were turned off and none on
        assert got[key] is (True if value is None and only_off else value)
    assert got["create-cuda-context"] is True
    assert got["cuda-copy"] is (True if any(got[k] for k in given) else None)


def test_nothing_asked_leaves_every_transport_to_ucx():
    got = transports(None, None, None)
    assert [got[k] for k in ("tcp", "infiniband", "nvlink", "cuda-copy")] == [None] * 4


def test_preload_options():
    assert get_preload_options(protocol="ucx", create_cuda_context=True) == {
        "preload": ["cudask.initialize"],
        "preload_argv": ["--create-cuda-context"],
    }
    argv = get_preload_options(
        protocol="ucx", create_cuda_context=True, enable_tcp_over_ucx=True, enable_nvlink=True
    )["preload_argv"]
    assert argv == ["--create-cuda-context", "--enable-tcp-over-ucx", "--enable-nvlink"]
    assert get_preload_options(protocol="tcp", enable_nvlink=True)["preload_argv"] == []


def test_the_preload_takes_those_flags():
    """distributed runs a click preload as `dask_setup(worker, *preload_argv)`."""
    from cudask.initialize import dask_setup

    ctx = dask_setup.make_context("dask_setup", ["--enable-tcp-over-ucx", "--enable-nvlink"])
    assert ctx.params["create_cuda_context"] is False
    assert ctx.params["enable_tcp_over_ucx"] is True and ctx.params["enable_nvlink"] is True
