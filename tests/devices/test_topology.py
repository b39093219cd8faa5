from __future__ import annotations

import os

from cudask.devices.topology import format_cpus, nearest_nics, normalize_bus_id, numa_node


def _sysfs(tmp_path):
    """A small PCI tree: root port 00:01.0 -> switch 01:00.0 -> {GPU 02:00.0, NIC 03:00.0};
    root port 00:02.0 -> NIC 05:00.0; a virtual lo with no device."""
    devices = tmp_path / "devices" / "pci0000:00"
    paths = {
        "gpu": devices / "0000:00:01.0" / "0000:01:00.0" / "0000:02:00.0",
        "near": devices / "0000:00:01.0" / "0000:01:00.0" / "0000:03:00.0",
        "far": devices / "0000:00:02.0" / "0000:05:00.0",
    }
    bus = tmp_path / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for key, p in paths.items():
        p.mkdir(parents=True)
        (p / "numa_node").write_text("1\n" if key != "far" else "0\n")
        os.symlink(p, bus / p.name)
    for kind, name, key in [
        ("net", "eth0", "far"),
        ("infiniband", "mlx5_0", "near"),
        ("net", "ib0", "near"),
    ]:
        d = tmp_path / "class" / kind / name
        d.mkdir(parents=True)
        os.symlink(paths[key], d / "device")
    (tmp_path / "class" / "net" / "lo").mkdir()
    return tmp_path


def test_nearest_nics_share_a_bridge(tmp_path):
    sysfs = _sysfs(tmp_path)
    assert nearest_nics("00000000:02:00.0", str(sysfs)) == ("ib0", "mlx5_0")


def test_numa_node_and_missing(tmp_path):
    sysfs = _sysfs(tmp_path)
    assert numa_node("0000:02:00.0", str(sysfs)) == 1
    assert numa_node("0000:99:00.0", str(sysfs)) is None
    assert nearest_nics("0000:99:00.0", str(sysfs)) == ()


def test_normalize_and_format():
    assert normalize_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert format_cpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cpus([]) == ""


def test_numa_node_of_cpus(tmp_path):
    from cudask.devices.topology import numa_node_of_cpus, parse_cpus

    for node, cpus in ((0, "0-7"), (1, "8-15")):
        d = tmp_path / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    assert numa_node_of_cpus((9, 10), str(tmp_path)) == 1
    assert numa_node_of_cpus((0, 1, 2, 9), str(tmp_path)) == 0
    assert numa_node_of_cpus(None, str(tmp_path)) is None
    assert numa_node_of_cpus((99,), str(tmp_path)) is None
    assert parse_cpus("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
