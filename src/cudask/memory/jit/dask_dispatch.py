"""dask's dispatch registries taught to see through proxies.

Covers: `register(proxy_type, unwrap)`, which registers, for the proxy type,
functions that unwrap proxies and dispatch again on the real types: dask.array
(concatenate, tensordot, einsum, divide, take, numel, nannumel, percentile,
to_numpy, to_cupy) and, when it imports, dask.dataframe (make_meta,
meta_nonempty, hash_object, group_split, concat, tolist, grouper,
partd_encode, pyarrow and pandas conversions, ...).

Does not cover: `empty_lookup` and other registries dispatched on a type alone
(there is no proxy to look at), deciding when to register
(cudask.memory.jit.proxy: when the first proxy is made; it passes the proxy
type in, so this module never imports it).

Threading: `register` is not idempotent or locked itself; its caller makes it
run once.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

Unwrap = Callable[[Any], Any]


def _priority(x: Any) -> Any:
    return getattr(x, "__array_priority__", 0)


def _by_type(
    dispatcher: Any, pick: Callable[[tuple[Any, ...]], Any], unwrap: Unwrap
) -> Callable[..., Any]:
    """For registries used as `dispatcher.dispatch(type(x))(*args)`: unwrap the
    arguments and dispatch again on the type `pick` chooses from them."""

    def redispatch(*args: Any, **kwargs: Any) -> Any:
        args = unwrap(args)
        kwargs = unwrap(kwargs)
        return dispatcher.dispatch(type(pick(args)))(*args, **kwargs)

    redispatch.__name__ = f"proxy_{dispatcher.__name__}"
    return redispatch


def _by_call(dispatcher: Any, unwrap: Unwrap) -> Callable[..., Any]:
    """For registries called as `dispatcher(x, *args)`: unwrap and call again."""

    def redispatch(*args: Any, **kwargs: Any) -> Any:
        return dispatcher(*unwrap(args), **unwrap(kwargs))

    redispatch.__name__ = f"proxy_{dispatcher.__name__}"
    return redispatch


def _highest(values: Any) -> Any:
    return max(values, key=_priority)


def register(proxy_type: type, unwrap: Unwrap) -> None:
    """Register `proxy_type` with dask.array's registries, and with
    dask.dataframe's when pandas is installed and dask.dataframe imports."""
    _register_array(proxy_type, unwrap)
    if importlib.util.find_spec("pandas") is not None:
        _register_dataframe(proxy_type, unwrap)


def _register_array(proxy_type: type, unwrap: Unwrap) -> None:
    from dask.array import dispatch as d

    d.concatenate_lookup.register(proxy_type)(
        _by_type(d.concatenate_lookup, lambda a: _highest(a[0]), unwrap)
    )
    d.tensordot_lookup.register(proxy_type)(
        _by_type(d.tensordot_lookup, lambda a: _highest(a[:2]), unwrap)
    )
    d.einsum_lookup.register(proxy_type)(_by_type(d.einsum_lookup, lambda a: a[1], unwrap))
    d.divide_lookup.register(proxy_type)(
        _by_type(d.divide_lookup, lambda a: _highest(a[:2]), unwrap)
    )
    for name in (
        "take_lookup",
        "numel_lookup",
        "nannumel_lookup",
        "percentile_lookup",
        "to_numpy_dispatch",
        "to_cupy_dispatch",
    ):
        registry = getattr(d, name, None)
        if registry is not None:
            registry.register(proxy_type)(_by_call(registry, unwrap))


def _register_dataframe(proxy_type: type, unwrap: Unwrap) -> None:
    try:
        dd = importlib.import_module("dask.dataframe.dispatch")
    except ImportError:
        return
    dd.concat_dispatch.register(proxy_type)(_by_type(dd.concat_dispatch, lambda a: a[0][0], unwrap))
    for name in (
        "make_meta_dispatch",
        "make_meta_obj",
        "meta_nonempty",
        "meta_lib_from_array",
        "hash_object_dispatch",
        "group_split_dispatch",
        "tolist_dispatch",
        "is_categorical_dtype_dispatch",
        "categorical_dtype_dispatch",
        "grouper_dispatch",
        "partd_encode_dispatch",
        "pyarrow_schema_dispatch",
        "to_pyarrow_table_dispatch",
        "to_pandas_dispatch",
        "get_parallel_type",
    ):
        registry = getattr(dd, name, None)
        if registry is not None:
            registry.register(proxy_type)(_by_call(registry, unwrap))


__all__ = ["register"]
