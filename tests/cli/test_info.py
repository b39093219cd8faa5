from __future__ import annotations

import json

from click.testing import CliRunner

from cudask.cli import info as info_mod
from cudask.cli.main import cli
from cudask.devices import discover
from cudask.testing import FakeBackend, fake_gpu


def test_render_dgx():
    text = info_mod.render(discover(FakeBackend.dgx(8)))
    lines = text.splitlines()
    assert "8 GPU(s)" in lines[0] and "CUDA 13.0" in lines[0]
    assert len(lines) == 2 + 8
    assert "0-63" in lines[2] and "64-127" in lines[-1] and "mlx5_7" in lines[-1]


def test_render_mig_and_soc():
    m = discover(
        FakeBackend([fake_gpu(0, mig=2, cpus=[0]), fake_gpu(1, memory_total=None, cpus=[0])])
    )
    text = info_mod.render(m)
    assert "0.1" in text and "MIG-" in text and "shared (SoC)" in text


def test_info_without_gpu_exits_zero(monkeypatch):
    monkeypatch.setattr(info_mod, "discover", lambda: discover(FakeBackend.no_nvml()))
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0
    assert "No NVIDIA GPU found" in result.output


def test_info_json(monkeypatch):
    monkeypatch.setattr(info_mod, "discover", lambda: discover(FakeBackend.dgx(2, cores=8)))
    result = CliRunner().invoke(cli, ["info", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["driver_version"] and len(data["gpus"]) == 2
    assert data["gpus"][1]["cpu_affinity"] == [4, 5, 6, 7]
