"""How a command finds and connects to a running scheduler (`cudask config`, `cudask top`).

Covers: the options that name a scheduler, declared once for every command
that connects to one (`scheduler_options`): an address argument (or
DASK_SCHEDULER_ADDRESS), --scheduler-file, --timeout and the TLS files; checking
them; and connecting a Client with one-line errors. Neither or both of an
address and a scheduler file is a usage error (exit 2); a scheduler file that
cannot be read, a scheduler address where nothing listens (at once, from a plain
TCP connection), or a scheduler that does not answer within the timeout, exits 1
with one line naming the file or the address and why.

Does not cover: what commands do once connected, nor `cudask worker`, whose
scheduler options are worker options (cudask.options). Threading: the command's thread.
"""

from __future__ import annotations

import functools
import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from cudask.cli.user_errors import CommandError

if TYPE_CHECKING:
    from distributed import Client
    from distributed.security import Security

ENVVAR = "DASK_SCHEDULER_ADDRESS"


@dataclass(frozen=True)
class SchedulerTarget:
    """Where a command's scheduler is and how to connect to it."""

    address: str
    timeout: float
    security: Security | None = None
    scheduler_file: str | None = None

    def describe(self) -> str:
        """The address, and the file it came from if any (for messages)."""
        if self.scheduler_file is None:
            return self.address
        return f"{self.address} (from {self.scheduler_file})"


def read_scheduler_file(path: str) -> str:
    """The address in a scheduler file (`dask scheduler --scheduler-file`)."""
    try:
        with open(path) as f:
            content = json.load(f)
    except OSError as exc:
        raise CommandError(
            f"cannot read the scheduler file {path}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:
        raise CommandError(f"the scheduler file {path} is not JSON: {exc}") from None
    address = content.get("address") if isinstance(content, dict) else None
    if not isinstance(address, str) or not address:
        raise CommandError(
            f'the scheduler file {path} has no "address"; it should be the file a scheduler '
            'wrote, e.g. {"address": "tcp://10.0.0.1:8786", ...}'
        )
    return address


def _target(
    ctx: click.Context,
    scheduler: str | None,
    scheduler_file: str | None,
    timeout: float,
    tls_ca_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> SchedulerTarget:
    if scheduler is not None and scheduler_file is not None:
        if ctx.get_parameter_source("scheduler") is ParameterSource.ENVIRONMENT:
            scheduler = None  # a file given on the command line beats the environment
        else:
            raise click.UsageError(
                f"give the scheduler's address ({scheduler}) or --scheduler-file "
                f"({scheduler_file}), not both",
                ctx=ctx,
            )
    if scheduler is None and scheduler_file is None:
        raise click.UsageError(
            f"no scheduler: give its address (e.g. `{ctx.command_path} tcp://10.0.0.1:8786`), "
            f"--scheduler-file FILE, or set {ENVVAR}",
            ctx=ctx,
        )
    tls = (tls_ca_file, tls_cert, tls_key)
    if any(tls) and not all(tls):
        raise click.UsageError("TLS needs all of --tls-ca-file, --tls-cert and --tls-key", ctx=ctx)
    security = None
    if all(tls):
        from distributed.security import Security

        security = Security(
            tls_ca_file=tls_ca_file,
            tls_client_cert=tls_cert,
            tls_client_key=tls_key,
            require_encryption=True,
        )
    address = scheduler if scheduler is not None else read_scheduler_file(str(scheduler_file))
    return SchedulerTarget(address, timeout, security, scheduler_file)


def scheduler_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the scheduler's address argument, --scheduler-file, --timeout and the TLS
    options to a click command; the command receives them checked, as one
    `target: SchedulerTarget` keyword argument. Goes between @click.command and
    the command's own options."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        scheduler: str | None,
        scheduler_file: str | None,
        timeout: float,
        tls_ca_file: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        **kwargs: Any,
    ) -> Any:
        target = _target(
            click.get_current_context(),
            scheduler,
            scheduler_file,
            timeout,
            tls_ca_file,
            tls_cert,
            tls_key,
        )
        return command(*args, target=target, **kwargs)

    decorators = (
        click.argument("scheduler", required=False, envvar=ENVVAR),
        click.option(
            "--scheduler-file",
            default=None,
            metavar="FILE",
            help="JSON file the scheduler wrote its address to (instead of an address).",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=10.0,
            show_default=True,
            metavar="SECONDS",
            help="Seconds to wait for the scheduler to answer.",
        ),
        click.option(
            "--tls-ca-file", default=None, help="CA certificate file, for a TLS scheduler."
        ),
        click.option(
            "--tls-cert", default=None, help="Client certificate file, for a TLS scheduler."
        ),
        click.option(
            "--tls-key", default=None, help="Client private key file, for a TLS scheduler."
        ),
    )
    for decorator in reversed(decorators):
        wrapper = decorator(wrapper)
    return wrapper


_LOCATION = re.compile(r"^in <[^>]*>: ")


def failure_reason(exc: BaseException) -> str | None:
    """The most specific reason in an exception chain, on one line, or None (only
    timeouts). distributed wraps a refused connection as `OSError: Timed out trying
    to connect ...` caused by `CommClosedError: in <TCPConnector ...>:
    ConnectionRefusedError: ...`, itself caused by the ConnectionRefusedError."""
    reason = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(_LOCATION.sub("", str(current)).split())
        if text and not text.startswith("Timed out trying to connect"):
            reason = text
        current = current.__cause__ or current.__context__
    return reason


def probe(address: str, timeout: float) -> str | None:
    """Why a plain TCP connection to a tcp:// or tls:// address fails (e.g.
    "Connection refused", "Name or service not known", "timed out"); None when it
    connects or the address is of another protocol."""
    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, location = parse_address(address, strict=False)
    if scheme not in ("tcp", "tls"):
        return None
    try:
        host, port = parse_host_port(location)
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except (OSError, ValueError) as exc:
        return (
            (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
        )


def check_address(address: str) -> None:
    """Raise ValueError for an address distributed cannot connect to (no such
    scheme, no port, another process's inproc address), before a Client is made:
    a Client that fails on one does not close itself."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    scheme, location = parse_address(address, strict=False)
    get_backend(scheme)
    if not location:
        raise ValueError(f"{address!r} names no host")
    if scheme == "inproc":  # only this process's own (a scheduler started in it)
        from distributed.comm.inproc import global_manager

        global_manager.validate_address(location)
    else:
        parse_host_port(location)  # e.g. "missing port number in address '10.0.0.1'"


def connect(target: SchedulerTarget) -> Client:
    """A Client of the target's scheduler (not the process's default client)."""
    from distributed import Client

    try:
        check_address(target.address)
    except ValueError as exc:
        if target.scheduler_file is None:
            raise click.BadParameter(
                str(exc),
                ctx=click.get_current_context(silent=True),
                param_hint=f"scheduler address {target.address!r}",
            ) from None
        raise CommandError(f"{target.describe()} is not a scheduler address: {exc}") from None
    reason = probe(target.address, target.timeout)
    if reason is not None:  # refused or unresolvable: say so now, not after the timeout
        within = f" within {target.timeout:g} s" if "timed out" in reason else ""
        raise CommandError(f"cannot reach the scheduler at {target.describe()}{within}: {reason}")
    try:
        return Client(
            target.address, timeout=target.timeout, security=target.security, set_as_default=False
        )
    except OSError as exc:
        reason = (
            probe(target.address, min(target.timeout, 5.0))
            or failure_reason(exc)
            or "no answer (something listens there, but no dask scheduler answered)"
        )
        raise CommandError(
            f"cannot reach the scheduler at {target.describe()} within "
            f"{target.timeout:g} s: {reason}"
        ) from None


__all__ = [
    "SchedulerTarget",
    "check_address",
    "connect",
    "failure_reason",
    "probe",
    "read_scheduler_file",
    "scheduler_options",
]
