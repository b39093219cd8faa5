"""Addresses, ports, interfaces and logging levels, checked before anything starts.

Covers: the form of the scheduler's address (a known scheme, a host and a port,
parsed as distributed parses it: distributed.comm.addressing); the addresses a
node's workers listen on (`host`, `listen_address`: the host must resolve to an
address of this machine) or advertise (`contact_address`: form only); worker and
dashboard ports (0-65535, as distributed's clean_dashboard_address reads a
dashboard address); network interfaces (distributed.utils.get_ip_interface); and
LocalCluster's `silence_logs`. Each failing check raises a one-line OptionError
naming the value and what is accepted, with `option` set to the keyword.

Does not cover: a scheduler that does not answer (the workers wait for it, as
distributed's do), a port already taken (known only when binding), TLS and files
(cudask.deploy.check_files).

Threading: pure functions apart from name resolution and a socket bound to port 0
and closed at once; call them from any thread.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import psutil
from distributed.comm.addressing import parse_address, parse_host_port
from distributed.comm.registry import backends, get_backend
from distributed.utils import clean_dashboard_address, get_ip_interface

from cudask.errors import OptionError
from cudask.options import UCX_PROTOCOLS, require_library
from cudask.worker.spec import MAX_PORT

_HOST_PORT_SCHEMES = ("tcp", "tls", "ucx", "ucxx", "ws", "wss")


def _schemes() -> str:
    return ", ".join(sorted(set(backends) | set(UCX_PROTOCOLS)))


def _parse(
    label: str, value: Any, *, option: str | None, default_port: int | None, example: str
) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an address, as distributed parses it (port None:
    a scheme without ports, such as inproc)."""
    accepted = f"accepted: an address such as {example!r} (schemes: {_schemes()})"
    if not isinstance(value, str) or not value.strip():
        raise OptionError(f"{label}={value!r} is not an address; {accepted}", option=option)
    scheme, location = parse_address(value)
    if scheme in UCX_PROTOCOLS:
        require_library("ucx", f"{label}={value!r}")
    else:
        try:
            get_backend(scheme)
        except ValueError:
            raise OptionError(
                f"{label}={value!r}: unknown scheme {scheme!r}; {accepted}", option=option
            ) from None
    if scheme not in _HOST_PORT_SCHEMES:
        return scheme, location, None
    try:
        host, port = parse_host_port(location, default_port=default_port)
    except ValueError as exc:
        raise OptionError(
            f"{label}={value!r} is not an address: {exc}; {accepted}", option=option
        ) from None
    if not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise OptionError(
            f"{label}={value!r}: port {port!r} is out of range 0-{MAX_PORT}; {accepted}",
            option=option,
        )
    return scheme, host, port


def check_scheduler_address(value: Any, label: str = "scheduler") -> str:
    """The scheme of a scheduler address, which needs a host and a port
    (e.g. 'tcp://10.0.0.1:8786' or '10.0.0.1:8786'). The host is not resolved here:
    a Kubernetes service's name may resolve only later, and the workers wait for it."""
    example = "tcp://10.0.0.1:8786"
    if isinstance(value, str) and value.startswith("-"):
        raise OptionError(
            f"{label}={value!r} looks like a flag, not an address; is an "
            "option misspelt? accepted: an address such as "
            f"{example!r} (see `cudask worker --help`)",
            option=None,
        )
    scheme, host, port = _parse(label, value, option=None, default_port=None, example=example)
    if port is not None and (not host or port == 0):
        raise OptionError(
            f"{label}={value!r} names no {'port' if host else 'host'}; "
            f"accepted: an address such as {example!r}",
            option=None,
        )
    return scheme


def _not_local(host: str) -> str | None:
    """Why this machine cannot listen on `host`, or None when it can."""
    if not host or host in ("0.0.0.0", "::"):
        return None
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return f"host {host!r} does not resolve ({getattr(exc, 'strerror', None) or exc})"
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((sockaddr[0], 0))
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"{sockaddr[0]} is not an address of this machine"
    return None


def _listen(option: str, value: Any, example: str) -> None:
    _, host, _ = _parse(option, value, option=option, default_port=0, example=example)
    why = _not_local(host)
    if why:
        raise OptionError(
            f"{option}={value!r}: {why}; accepted: a name or IP address "
            f"of this machine, e.g. {option}={example!r}, or a network "
            "interface instead (interface)",
            option=option,
        )


def check_host(value: Any) -> None:
    """--host: a host of this machine (with an optional scheme and port)."""
    _listen("host", value, "10.0.0.1")


def check_listen_address(value: Any) -> None:
    _listen("listen_address", value, "tcp://0.0.0.0:9000")


def check_contact_address(value: Any) -> None:
    """Only its form: it names how others reach the worker (a NAT or a service)."""
    _parse(
        "contact_address",
        value,
        option="contact_address",
        default_port=0,
        example="tcp://node1:9000",
    )


def check_interface(value: Any) -> None:
    """A network interface of this machine with an IPv4 address, as distributed
    needs one (distributed.utils.get_ip_interface)."""
    names = sorted(psutil.net_if_addrs())
    if not isinstance(value, str) or value not in names:
        raise OptionError(
            f"interface={value!r} is not a network interface of "
            f"this machine; accepted: one of {', '.join(names)}, "
            f"e.g. interface={next((n for n in names if n != 'lo'), 'eth0')!r}",
            option="interface",
        )
    try:
        get_ip_interface(value)
    except ValueError as exc:
        raise OptionError(
            f"interface={value!r}: {exc}; accepted: an interface "
            f"with an IPv4 address, one of {', '.join(names)}",
            option="interface",
        ) from None


def check_port(label: str, value: Any) -> None:
    """A port number: 0 (any free port) to 65535 (also as digits, as distributed takes it)."""
    port = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise OptionError(
            f"{label}={value!r} is not a port; accepted: a whole number "
            f"from 0 (any free port) to {MAX_PORT}, e.g. {label}=8786",
            option=label,
        )


def check_dashboard_address(label: str, value: Any) -> None:
    """A dashboard address as distributed reads it: a port (8787), ':8787',
    'host:8787', a comma-separated string or a list of them; None: no dashboard."""
    if value is None or value is False:
        return
    accepted = (
        f"accepted: a port such as 8787, an address such as ':8787' or "
        f"'10.0.0.1:8787' (port 0: any free port), e.g. {label}=':8787'"
    )
    items = value if isinstance(value, list) else [value]
    if not items or any(isinstance(i, bool) or not isinstance(i, (str, int)) for i in items):
        raise OptionError(f"{label}={value!r} is not a dashboard address; {accepted}", option=label)
    try:
        addresses = clean_dashboard_address(value)
    except (ValueError, TypeError):
        raise OptionError(
            f"{label}={value!r} is not a dashboard address; {accepted}", option=label
        ) from None
    for address in addresses:
        port = address["port"]
        why = (
            f"port {port} is out of range 0-{MAX_PORT}"
            if not 0 <= port <= MAX_PORT
            else _not_local(address["address"])
        )
        if why:
            raise OptionError(f"{label}={value!r}: {why}; {accepted}", option=label)


def check_silence_logs(value: Any) -> None:
    """LocalCluster's silence_logs: a logging level (number or name), or False/None."""
    if value is None or isinstance(value, bool) or isinstance(value, int) and value >= 0:
        return
    if isinstance(value, str) and value.upper() in logging.getLevelNamesMapping():
        return
    raise OptionError(
        f"silence_logs={value!r} is not a logging level; "
        "accepted: a level such as logging.WARNING (30) or its "
        "name ('debug', 'info', 'warning', 'error', 'critical'), "
        "or False for no change",
        option="silence_logs",
    )


__all__ = [
    "MAX_PORT",
    "check_contact_address",
    "check_dashboard_address",
    "check_host",
    "check_interface",
    "check_listen_address",
    "check_port",
    "check_scheduler_address",
    "check_silence_logs",
]
