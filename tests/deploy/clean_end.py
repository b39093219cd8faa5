"""Shared by the clean-end tests (test_clean_end_cpu.py, test_clean_end_gpu.py): what
every process of a run logged, and the lines in it that fail a run.

`LogWatch` records what the test process's loggers emit (root, distributed's,
cudask's, tornado's, asyncio's) while it is active; `bad_lines(text)` finds every
ERROR or CRITICAL line and every traceback in a text; `check_clean(sources)` fails
naming each such line and where it came from. The worker and nanny processes write
to the test's stderr, which pytest's `capfd` captures whole (the close included),
once their cudask loggers are given distributed's format (`LOG_ENV`, set before they
start). `cpu_cluster` starts the workers of a GPU cluster on CPU: cudask's Nanny and
worker class, the fake-device store (cudask.testing.stores), the store plugins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from distributed import WorkerPlugin

#: Environment of worker processes whose cudask loggers write in distributed's format
#: (level names included): distributed configures the loggers named under
#: `logging` when it is imported, before the nanny hands its config over.
LOG_ENV = {"DASK_LOGGING__CUDASK": "info"}

_ERROR = re.compile(r"\b(ERROR|CRITICAL)\b")
_WATCHED = (
    "",
    "distributed",
    "distributed.client",
    "cudask",
    "tornado",
    "tornado.application",
    "asyncio",
)


def bad_lines(text: str) -> list[str]:
    """The lines of `text` naming ERROR or CRITICAL, and each traceback's first line."""
    return [line for line in text.splitlines() if _ERROR.search(line) or "Traceback" in line]


class LogWatch(logging.Handler):
    """Every record of the test process's watched loggers, formatted as distributed
    formats them, exceptions included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @contextlib.contextmanager
    def watching(self) -> Iterator[LogWatch]:
        loggers = [logging.getLogger(name) for name in _WATCHED]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.addHandler(self)
            if lg.getEffectiveLevel() > logging.WARNING:
                lg.setLevel(logging.WARNING)
        try:
            yield self
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.removeHandler(self)
                lg.setLevel(level)


def check_clean(sources: Mapping[str, str]) -> None:
    """Fail naming every ERROR line and traceback of `sources` ({where: text}), each
    source's log with it from 5 lines before its first such line (to diagnose)."""
    found = [f"{where}: {line}" for where, text in sources.items() for line in bad_lines(text)]
    context = [_context(where, text) for where, text in sources.items() if bad_lines(text)]
    assert not found, "\n".join(["ERROR lines or tracebacks in the logs:", *found, "", *context])


def _context(where: str, text: str) -> str:
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if bad_lines(line))
    return f"--- {where}, from line {max(first - 5, 0) + 1}:\n" + "\n".join(
        lines[max(first - 5, 0) : first + 60]
    )


def remote_logs(client: Any) -> dict[str, str]:
    """What the scheduler, each worker and each nanny hold in their log deques."""
    out = {"scheduler": "\n".join(line for _, line in client.get_scheduler_logs())}
    for nanny in (False, True):
        for address, logs in client.get_worker_logs(nanny=nanny).items():
            out[f"{'nanny' if nanny else 'worker'} {address}"] = "\n".join(line for _, line in logs)
    return out


def leftovers(directory: os.PathLike[str] | str) -> list[str]:
    """Files and worker directories left under a cluster's local directory (the
    workspace's lock files aside)."""
    out: list[str] = []
    for root, dirs, files in os.walk(directory):
        out += [os.path.join(root, d) for d in dirs if d.startswith("worker-")]
        out += [os.path.join(root, f) for f in files if not f.endswith(".lock")]
    return sorted(out)


@contextlib.contextmanager
def cpu_cluster(
    local_directory: os.PathLike[str] | str,
    *,
    device_memory_limit: int,
    memory_limit: int | None,
    jit_unspill: bool = False,
    n_workers: int = 1,
    close_timeout: float = 60.0,
    plugins: tuple[Any, ...] = (),
) -> Iterator[Any]:
    """A SpecCluster of `n_workers` worker processes as cudask starts them (cudask's
    Nanny with `close_timeout`, cudask's worker class, the store-closing and metrics
    plugins first, then `plugins`), each on a fake-device store with these limits."""
    from distributed import Scheduler, SpecCluster

    from cudask.testing.stores import fake_store
    from cudask.worker.closing import CloseStore, Nanny
    from cudask.worker.gpu_worker import GPUWorker
    from cudask.worker.metrics import StoreMetrics

    store = {
        "device_memory_limit": device_memory_limit,
        "memory_limit": memory_limit,
        "jit_unspill": jit_unspill,
    }
    worker = {
        "cls": Nanny,
        "options": {
            "nthreads": 2,
            "memory_limit": 0,
            "data": (fake_store, store),
            "plugins": [CloseStore(), StoreMetrics(), *plugins],
            "worker_class": GPUWorker,
            "close_timeout": close_timeout,
            "local_directory": os.fspath(local_directory),
            "dashboard_address": ":0",
            "host": "127.0.0.1",
        },
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    with SpecCluster(workers={i: worker for i in range(n_workers)}, scheduler=scheduler) as cluster:
        yield cluster


# --------------------------------------------------------------------------- tasks


def make(i: int, n: int) -> Any:
    """A fake device array of n bytes, each i % 251."""
    from cudask.testing.fake_cuda import filled

    return filled(n, i % 251)


def holds(a: Any, i: int) -> bool:
    """Whether every byte of `a` is i % 251."""
    return bool((a.get() == i % 251).all())


def combine(a: Any, b: Any) -> Any:
    """A new fake device array: the bytes of a and b added, modulo 256."""
    from cudask.testing.fake_cuda import FakeDeviceArray

    return FakeDeviceArray.from_numpy(a.get() + b.get())


def total(a: Any) -> int:
    return int(a.get().astype("u8").sum())


def disk_keys(dask_worker: Any) -> float:
    """Keys the worker's store holds on disk (0 without a disk tier)."""
    return float(dask_worker.data.metrics().get("disk-keys", 0))


def store_keys(dask_worker: Any) -> int:
    return len(dask_worker.data)


class SlowTeardown(WorkerPlugin):
    """A worker plugin whose teardown takes `seconds` (a worker whose close has that
    much to do), then writes `marker`: the file exists only if the worker was not
    killed before."""

    name = "test-slow-teardown"

    def __init__(self, seconds: float, marker: str) -> None:
        self.seconds = seconds
        self.marker = marker

    def setup(self, worker: Any) -> None:
        return None

    def teardown(self, worker: Any) -> None:
        import time

        time.sleep(self.seconds)
        with open(self.marker, "w") as fh:
            fh.write("closed\n")


def log_error(text: str) -> None:
    """Log `text` as an error, with a traceback, on a cudask logger (runs on a worker)."""
    try:
        raise RuntimeError(text)
    except RuntimeError:
        logging.getLogger("cudask.memory").exception("cudask: %s", text)


__all__ = [
    "LOG_ENV",
    "LogWatch",
    "SlowTeardown",
    "bad_lines",
    "check_clean",
    "combine",
    "cpu_cluster",
    "disk_keys",
    "holds",
    "leftovers",
    "log_error",
    "make",
    "remote_logs",
    "store_keys",
    "total",
]
