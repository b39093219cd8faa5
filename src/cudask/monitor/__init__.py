"""Watching GPU workers from the scheduler: the dashboard page, Prometheus, `cudask top`.

`MonitorPlugin` (cudask.monitor.state) runs on the scheduler. LocalCUDACluster
installs it; for a scheduler started by hand, preload this module:

    dask scheduler --preload cudask.monitor

`dask_setup` below is that preload's hook. Nothing else happens at import.
Does not cover: the plugin itself (cudask.monitor.state) and the page (.page).

Threading: distributed calls `dask_setup` on the scheduler's event loop.
"""

from __future__ import annotations

from typing import Any

from cudask.monitor.state import NAME, MonitorPlugin, install, snapshot


def dask_setup(scheduler: Any) -> None:
    """Preload hook (`--preload cudask.monitor`): add the MonitorPlugin."""
    if NAME not in scheduler.plugins:
        scheduler.add_plugin(MonitorPlugin())


__all__ = ["NAME", "MonitorPlugin", "dask_setup", "install", "snapshot"]
