"""scripts/dashboard-shot: the dashboard page recorded during a spilling run and drawn again.

On CPU: the whole chain with --simulate (in-process workers whose stores hold fake device
arrays): the recording (the page's JSON each second, phases, the final history,
provenance), and where Chromium is installed the live picture and the replayed one, whose
caption and PNG text chunks say SIMULATED and name the recording. Bad input ends in one
line. On a GPU (gpu mark): a real LocalCUDACluster run records the GPU and its spill.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cudask_bench import pngtext

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "dashboard-shot"


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("dashboard_shot", str(SCRIPT))
    spec = importlib.util.spec_from_loader("dashboard_shot", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


shot = _load()


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def rows(recording: dict[str, Any], phase: str) -> list[dict[str, Any]]:
    return [row for frame in recording["frames"] if frame["phase"] == phase
            for row in frame["snapshot"]["workers"]]


@pytest.mark.timeout(300)
def test_simulated_run_recorded_and_drawn(tmp_path: Path) -> None:
    done = run("record", str(tmp_path), "--simulate", "--rounds", "1", "--hold", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / "dashboard-simulated.json"
    recording = json.loads(path.read_text())
    assert recording["format"] == shot.FORMAT and recording["verified"] is True
    assert "fake device arrays" in recording["simulated"]
    assert recording["provenance"]["machine"] and recording["provenance"]["source"]
    phases = [frame["phase"] for frame in recording["frames"]]
    assert phases[0] == "start" and phases[-1] == "idle"
    for phase in ("hold 1", "delete 1"):
        assert phase in phases, phases
    assert recording["frames"][recording["shot"]]["phase"] == "hold 1"
    held = rows(recording, "hold 1")
    assert {row["name"] for row in held} == {"0", "1"} and all(row["cudask"] for row in held)
    # 96 MiB per worker through a 32 MiB device limit: spilled, held on host and disk
    assert all(row["device_limit_bytes"] == 32 * 2**20 for row in held)
    assert max(row["host_bytes"] + row["disk_bytes"] for row in held) > 0
    # per worker, its counter as the hold's frames show it (heartbeats arrive late on a busy
    # machine, so the first frame of the hold may predate the last spill)
    spilled = {row["name"]: 0.0 for row in held}
    for row in held:
        spilled[row["name"]] = max(spilled[row["name"]], row["spilled_bytes_total"])
    assert min(spilled.values()) >= 64 * 2**20, spilled
    # after the delete the tiers empty
    assert rows(recording, "idle")[-1]["host_bytes"] == 0
    history = recording["history"]
    assert set(history["workers"]) == {"0", "1"} and len(history["time"]) >= len(phases) - 2
    if shutil.which("chromium") is None:
        assert "no Chromium here" in done.stdout
        pytest.skip("no Chromium: the pictures are not drawn (Debian: apt-get install -y chromium)")
    picture = tmp_path / "dashboard-simulated.png"
    text = pngtext.read(picture.read_bytes())
    assert text["Source"] == str(path) and text["Simulated"] == shot.SIMULATED
    assert text["Source-SHA256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert text["Description"].startswith("SIMULATED, not a GPU run")
    assert f"Replayed from {path}, frame {recording['shot']} of {len(phases)} (hold 1" in text[
        "Description"]
    live = pngtext.read((tmp_path / "dashboard-simulated-live.png").read_bytes())
    assert live["Description"].startswith("SIMULATED") and "Live page on" in live["Description"]
    assert "Source" not in live  # the live page was not drawn from the file


def test_the_replayed_history_ends_at_the_frame() -> None:
    history = {"time": [1.0, 2.0, 3.0], "workers": {"a": {"spill_gbps": [None, 1.0, 2.0]}}}
    assert shot.history_until(history, 2.5) == {"time": [1.0, 2.0],
                                               "workers": {"a": {"spill_gbps": [None, 1.0]}}}
    replay = shot.Replay({"workers": []}, history)
    assert replay.snapshot() == {"workers": []} and replay.history() is history


def test_the_shot_frame() -> None:
    frames = [{"phase": p, "snapshot": {"time": float(t)}}
              for t, p in enumerate(["start", "hold 1", "hold 1", "delete 1", "hold 2", "hold 2",
                                     "hold 2", "idle"])]
    assert shot._shot_frame(frames, None) == 5  # one second into the last hold
    assert shot._shot_frame(frames, 6.2) == 6  # nearest the live picture
    assert shot._shot_frame(frames, 7.4) == 6  # captured late, after the hold: still the hold


def test_bad_input_ends_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    done = run("render", str(other))
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert f"{other} is not a recording" in done.stderr
    recording = tmp_path / "r.json"
    recording.write_text(json.dumps({"format": shot.FORMAT, "shot": 0, "frames": [{}]}))
    done = run("render", str(recording), "--frame", "3")
    assert done.returncode == 1 and f"--frame 3: {recording} has frames 0 to 0" in done.stderr
    done = run("record", str(tmp_path), "--simulate", "--limit", "lots")
    assert done.returncode == 1 and done.stderr.strip().count("\n") == 0
    assert "--limit" in done.stderr and "lots" in done.stderr


@pytest.mark.gpu
@pytest.mark.timeout(180)
def test_a_gpu_run_records_the_gpu_and_its_spill(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    done = run("record", str(tmp_path), "--workers", "1", "--per-worker", "2GiB",
               "--limit", "1GB", "--rounds", "1", "--hold", "2", "--tag", "gpu-test",
               timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    recording = json.loads((tmp_path / "dashboard-gpu-test.json").read_text())
    assert recording["simulated"] is None and recording["verified"] is True
    assert recording["provenance"]["machine"]["gpus"]["devices"]
    [row] = recording["frames"][recording["shot"]]["snapshot"]["workers"]
    assert row["cudask"] and row["gpu_uuid"] and row["gpu_name"]
    assert row["gpu_memory_total_bytes"] and row["device_limit_bytes"] == 10**9
    held = rows(recording, "hold 1")
    assert max(r["host_bytes"] for r in held) >= 10**9  # 2 GiB through 1 GB: most on host
    assert max(r["spilled_bytes_total"] for r in held) >= 2**30
    assert max(r["unspilled_bytes_total"] or 0 for r in held) > 0  # read back
