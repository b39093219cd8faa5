"""The cuDF spilling plugin against a stand-in cuDF module (no GPU, no cuDF): the
options it sets and restores, the spill manager made at setup, and the warnings when
that cannot take effect. The real thing runs in tests/memory/test_cudf_gpu.py."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import pytest

from cudask.worker import plugins
from cudask.worker.plugins import CudfSpill


def _fake_cudf(monkeypatch: pytest.MonkeyPatch, manager: Any) -> dict[str, Any]:
    """A `cudf` module with options and a spill manager module; returns the options."""
    options: dict[str, Any] = {
        "spill": False,
        "spill_stats": 0,
        "spill_on_demand": False,
        "spill_device_limit": 123,
    }
    cudf = types.ModuleType("cudf")
    cudf.get_option = options.__getitem__  # type: ignore[attr-defined]
    cudf.set_option = options.__setitem__  # type: ignore[attr-defined]
    made: list[dict[str, Any]] = []

    def get_global_manager() -> Any:
        made.append(dict(options))  # the options cuDF reads when it makes the manager
        if isinstance(manager, Exception):
            raise manager
        return manager

    spill_manager = types.ModuleType("cudf.core.buffer.spill_manager")
    spill_manager.get_global_manager = get_global_manager  # type: ignore[attr-defined]
    for name, module in [
        ("cudf", cudf),
        ("cudf.core", types.ModuleType("cudf.core")),
        ("cudf.core.buffer", types.ModuleType("cudf.core.buffer")),
        ("cudf.core.buffer.spill_manager", spill_manager),
    ]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(plugins.cudf_wire, "register", lambda: 0)
    options["_made"] = made
    return options


def test_spilling_on_failed_allocations_only_and_undone_at_teardown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = _fake_cudf(monkeypatch, manager=object())
    made = options.pop("_made")
    plugin = CudfSpill(enable=True, stats=1)
    plugin.setup(worker=None)
    assert options == {
        "spill": True,
        "spill_stats": 1,
        "spill_on_demand": True,
        "spill_device_limit": None,
    }
    assert made == [options]  # the manager made at setup, with those options
    plugin.setup(worker=None)  # idempotent
    assert len(made) == 1
    plugin.teardown(worker=None)
    assert options == {
        "spill": False,
        "spill_stats": 0,
        "spill_on_demand": False,
        "spill_device_limit": 123,
    }


def test_stats_alone_make_no_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    options = _fake_cudf(monkeypatch, manager=object())
    made = options.pop("_made")
    CudfSpill(enable=False, stats=2).setup(worker=None)
    assert options["spill"] is False and options["spill_stats"] == 2 and made == []


@pytest.mark.parametrize(
    ("manager", "said"),
    [
        (None, "cuDF was used here before the worker started"),
        (
            ValueError(
                "Spill on demand (or another failure callback resource) is already registered"
            ),
            "already registered",
        ),
    ],
)
def test_a_manager_that_cannot_spill_is_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, manager: Any, said: str
) -> None:
    _fake_cudf(monkeypatch, manager=manager)
    with caplog.at_level(logging.WARNING, logger="cudask.worker"):
        CudfSpill(enable=True, stats=0).setup(worker=None)
    assert [r.getMessage() for r in caplog.records if said in r.getMessage()]
