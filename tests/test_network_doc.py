"""docs/network.md cannot drift silently: its table of cudask's network option defaults is
compared with cudask/options.py (and the `cudask.worker` config behind it), every network
option must be in it, and the distributed defaults it relies on are checked too."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import dask.config
from distributed import LocalCluster, Scheduler

from cudask.cli.worker import worker as worker_command
from cudask.options import BY_NAME, OPTIONS

DOC = Path(__file__).resolve().parents[1] / "docs" / "network.md"
#: The options that decide what listens where. A new one in this area must be documented.
NETWORK = {
    "protocol",
    "interface",
    "host",
    "worker_port",
    "listen_address",
    "contact_address",
    "dashboard",
    "dashboard_address",
    "dashboard_prefix",
    "tls_ca_file",
    "tls_cert",
    "tls_key",
}


def documented_defaults() -> dict[str, Any]:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", DOC.read_text(), flags=re.MULTILINE)
    return {name: ast.literal_eval(value) for name, value in rows}


def test_every_network_option_is_documented_with_its_default() -> None:
    documented = documented_defaults()
    assert set(documented) == NETWORK
    for name, value in documented.items():
        assert BY_NAME[name].default_value() == value, (
            f"docs/network.md says {name} defaults to {value!r}, options.py gives "
            f"{BY_NAME[name].default_value()!r}: update the doc"
        )


def test_network_options_still_exist_under_these_names() -> None:
    names = {o.name for o in OPTIONS}
    assert NETWORK <= names
    flags = {p.opts[0] for p in worker_command.params if p.opts}
    for name in ("host", "interface", "worker_port", "listen_address", "dashboard_address"):
        assert BY_NAME[name].cli_flag in flags
    # --dashboard/--no-dashboard, as the doc names them
    assert BY_NAME["dashboard"].cli_flag == "--dashboard"
    assert BY_NAME["dashboard"].secondary == "--no-dashboard"


def test_the_distributed_defaults_the_doc_states() -> None:
    text = DOC.read_text()
    assert Scheduler.default_port == 8786 and "| 8786 |" in text
    local = inspect.signature(LocalCluster.__init__).parameters
    assert local["host"].default is None  # LocalCluster turns that into 127.0.0.1
    assert local["scheduler_port"].default == 0  # random
    assert local["dashboard_address"].default == ":8787"  # all interfaces
    assert local["worker_dashboard_address"].default is None
    # HTTPS on the HTTP ports comes from this config key, not from the comm certificates
    assert "distributed.scheduler.dashboard.tls.cert" in text
    assert dask.config.get("distributed.scheduler.dashboard.tls.cert") is None
