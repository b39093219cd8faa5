"""Other processes' CUDA contexts on a worker's GPU, said once in its log
(cudask.worker.neighbours), with a fake NVML and a fake /proc."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cudask.testing import FakeBackend, fake_gpu
from cudask.worker import neighbours

MiB = 1 << 20
WORKER, SIBLING, STARTER, OTHER, HIDDEN, CHILD = 100, 101, 10, 555, 777, 102
SPAWNED = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"


@pytest.fixture
def proc(tmp_path: Path) -> str:
    """A /proc with the worker, a sibling worker (same parent, started by
    multiprocessing), their parent, a subprocess of that parent that is no worker
    and an unrelated process; HIDDEN has no entry (another pid namespace, or gone)."""
    for pid, parent, argv in (
        (WORKER, STARTER, SPAWNED),
        (SIBLING, STARTER, SPAWNED),
        (CHILD, STARTER, "python -c import_cupy"),
        (STARTER, 1, "python my_script.py"),
        (OTHER, 1, "python train.py --epochs 10"),
    ):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (python (odd) name) S {parent} {pid} {pid} 0 -1\n")
        (d / "cmdline").write_bytes(argv.replace(" ", "\0").encode() + b"\0")
    return str(tmp_path)


@pytest.fixture
def gpu() -> FakeBackend:
    fake = FakeBackend([fake_gpu(0, cpus=[0])])
    for pid in (WORKER, SIBLING):
        fake.add_context(pid, 0, 600 * MiB)
    return fake


def test_strangers_and_the_starter_are_named_siblings_are_not(gpu: FakeBackend, proc: str) -> None:
    gpu.add_context(STARTER, 0, 1062 * MiB)
    gpu.add_context(OTHER, 0, None)
    gpu.add_context(HIDDEN, 0, 300 * MiB)
    gpu.add_context(CHILD, 0, 300 * MiB)
    uuid = gpu.gpu_list[0].uuid
    found = neighbours.neighbours(uuid, pid=WORKER, backend=gpu, proc=proc)
    assert found is not None
    by_pid = {n.process.pid: n for n in found}
    assert set(by_pid) == {STARTER, OTHER, HIDDEN, CHILD}
    assert by_pid[CHILD].role == "another process"  # same parent, but no worker
    assert by_pid[STARTER].role == neighbours.STARTER
    assert by_pid[OTHER].role == "another process"
    assert by_pid[OTHER].command == "python train.py --epochs 10"
    assert by_pid[HIDDEN].command is None
    found = [n for n in found if n.process.pid != CHILD]
    text = neighbours.describe("0-1", "GPU 0", found)
    assert text.startswith("cudask: worker 0-1: GPU 0 also holds CUDA contexts of 3 other")
    assert (
        f"pid {STARTER} (the process that started this worker, python my_script.py, "
        "1.04 GiB)" in text
    )
    assert f"pid {OTHER} (python train.py --epochs 10, memory not reported)" in text
    assert f"pid {HIDDEN} (300.00 MiB)" in text


def test_alone_or_with_its_siblings_nothing_to_say(gpu: FakeBackend, proc: str) -> None:
    uuid = gpu.gpu_list[0].uuid
    assert neighbours.neighbours(uuid, pid=WORKER, backend=gpu, proc=proc) == []


def test_not_listed_under_its_own_pid_nothing_can_be_told(gpu: FakeBackend, proc: str) -> None:
    # NVML of a container with its own pid namespace: the worker is listed under another pid
    uuid = gpu.gpu_list[0].uuid
    assert neighbours.neighbours(uuid, pid=4, backend=gpu, proc=proc) is None


def test_report_logs_once_and_never_raises(
    gpu: FakeBackend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    gpu.add_context(os.getpid(), 0)
    gpu.add_context(OTHER, 0, 2 * MiB)
    uuid = gpu.gpu_list[0].uuid
    with caplog.at_level(logging.DEBUG, logger="cudask.worker"):
        found = neighbours.report("w", uuid, backend=gpu)
    assert found is not None and OTHER in {n.process.pid for n in found}
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"pid {OTHER}" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="cudask.worker"):
        assert neighbours.report("w", uuid, backend=FakeBackend.no_nvml()) is None
        assert neighbours.report("w", "GPU-unknown", backend=gpu) is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_cuda_context_plugin_reports_once(
    gpu: FakeBackend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os
    import types

    from cudask.worker import plugins

    uuid = gpu.gpu_list[0].uuid
    gpu.add_context(os.getpid(), 0)
    gpu.add_context(OTHER, 0)
    monkeypatch.setattr(plugins, "device0_uuid", lambda: uuid)
    monkeypatch.setattr(neighbours, "default_backend", lambda: gpu)
    plugin = plugins.CUDAContext(uuid)
    plugin.background_imports = ()  # type: ignore[misc]
    worker = types.SimpleNamespace(name="0-1")
    with caplog.at_level(logging.WARNING, logger="cudask.worker"):
        plugin.setup(worker)
        plugin.setup(worker)  # idempotent: said once
    assert plugin.neighbours is not None
    listed = [n.process.pid for n in plugin.neighbours]
    assert OTHER in listed and os.getpid() not in listed
    assert len(caplog.records) == 1 and "worker 0-1" in caplog.records[0].getMessage()
