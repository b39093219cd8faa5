"""Which processes may exchange device memory by CUDA IPC: this host's, alive, not this one.

Covers: `node_identity` (this machine's boot, equal for every process of one running
host), `local_hosts` (the addresses this host listens on), `same_host` (whether a
comm's peer is on this host, from its address), and `identity` / `accepts` /
`accepted`: what a process says of itself before an exchange of IPC offers, and
whether another's may be mapped here (a running process of this host and pid
namespace: a process cannot map its own memory by IPC handle). Does not cover: the
IPC family itself (cudask.comm.ipc), process lifetimes (cudask.comm.lifetimes).

Threading: pure functions (the boot id is read once); any thread.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from typing import Any

from cudask.comm import lifetimes


@functools.cache
def node_identity() -> str:
    """This machine's boot: equal for every process of one running host (read once)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def local_hosts() -> frozenset[str]:
    """The addresses this host listens on (loopback included)."""
    import psutil

    hosts = {"localhost", socket.gethostname()}
    for addrs in psutil.net_if_addrs().values():
        hosts.update(
            a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)
        )
    return frozenset(hosts)


def _host_of(address: str) -> str | None:
    """The host part of a comm address ('tcp://10.0.0.2:8786', 'tls://[::1]:1')."""
    if "://" not in address:
        return None
    scheme, rest = address.split("://", 1)
    if scheme not in ("tcp", "tls", "ws", "wss"):
        return None
    host = rest.rsplit(":", 1)[0].strip("[]")
    return host or None


def same_host(context: dict[str, Any] | None, hosts: frozenset[str]) -> bool:
    """Whether the comm's peer ("recipient" in distributed's serialization
    context) is a process on this host, whose addresses are `hosts`."""
    if not context:
        return False
    recipient = context.get("recipient") or {}
    host = _host_of(str(recipient.get("address", "")))
    if host is None:
        return False
    if host in hosts:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def identity() -> dict[str, Any]:
    """This process as another worker checks it before an exchange of offers
    (`accepts`): its host's boot and its pid, start time and pid namespace."""
    return {"node": node_identity(), "sender": lifetimes.this_process().as_header()}


def accepts(peer: dict[str, Any] | None) -> bool:
    """Whether this process may map what `peer` (an `identity`, or an `offer`)
    offers: another running process of this host and pid namespace (a process
    cannot map its own memory by IPC handle)."""
    return accepted(peer) is not None


def accepted(peer: dict[str, Any] | None) -> lifetimes.Process | None:
    """The process `peer` names if `accepts` holds for it, else None."""
    if not isinstance(peer, dict) or peer.get("node") != node_identity():
        return None
    try:
        sender = lifetimes.keepable(peer.get("sender"))
    except Exception:  # noqa: BLE001 - not an identity: refused
        return None
    if sender is None or sender.pid == os.getpid() or not lifetimes.alive(sender):
        return None
    return sender


__all__ = ["accepted", "accepts", "identity", "local_hosts", "node_identity", "same_host"]
