"""Fixtures of the monitor tests: `serve`, tornado routes served on 127.0.0.1 for
the test (page_helpers.Served)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from page_helpers import Served


@pytest.fixture
def serve() -> Iterator[Callable[[list[Any]], Served]]:
    """`serve(routes)`: serve tornado routes (`.url` is the base URL); closed after
    the test."""
    servers: list[Served] = []

    def start(routes: list[Any]) -> Served:
        servers.append(Served(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
