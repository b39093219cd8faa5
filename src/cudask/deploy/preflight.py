"""One TLS handshake with the scheduler before a node's GPU workers start.

Covers: `check_tls(address, security, timeout)`. With a tls:// scheduler
address, `cudask worker` (CUDAWorker) connects once as its workers will; when
the handshake fails on a certificate - the scheduler does not accept this
node's (`--tls-cert` not signed by a CA it trusts), or this node does not trust
the scheduler's (`--tls-ca-file`) - it raises `TLSRefusedError` naming the
address, the files and what to check, instead of starting nannies whose
workers would retry until `--death-timeout` with the reason in their logs.
A scheduler that does not answer yet is left to the workers, which wait for it
as distributed's do.

Does not cover: plain tcp:// or ucx:// schedulers, the certificates' contents.

Threading: `check_tls` is a coroutine; await it on the loop that starts the workers.
"""

from __future__ import annotations

import json
import os
import ssl

from distributed.comm import connect
from distributed.comm.core import FatalCommClosedError
from distributed.security import Security

from cudask.errors import TLSRefusedError

# TLS alerts from the scheduler: it did not accept this node's certificate.
_REFUSED_BY_PEER = (
    "alert unknown ca",
    "alert bad certificate",
    "alert certificate required",
    "alert certificate unknown",
    "alert access denied",
    "alert handshake failure",
)


def scheduler_address(address: str | None, scheduler_file: str | None) -> str | None:
    """The address given, else the one in the scheduler file when it exists."""
    if address:
        return address
    if scheduler_file and os.path.exists(scheduler_file):
        try:
            with open(scheduler_file) as fh:
                return str(json.load(fh).get("address") or "") or None
        except (OSError, ValueError):
            return None
    return None


async def check_tls(
    address: str | None, security: Security | None, timeout: float = 10, attempts: int = 3
) -> None:
    """Raise TLSRefusedError when a TLS handshake with `address` fails on a
    certificate; return otherwise (also when nothing answers yet).

    Under TLS 1.3 the scheduler checks this node's certificate after the client
    side of the handshake is done, so its refusal may come as an alert (named in
    the error) or, when the connection is already being read, as the connection
    closed mid-handshake; the latter is tried again for the alert, up to
    `attempts` times."""
    if not address or not address.startswith("tls://") or security is None:
        return
    closed: BaseException | None = None
    for _ in range(max(attempts, 1)):
        try:
            comm = await connect(address, timeout=timeout, **security.get_connection_args("worker"))
        except FatalCommClosedError as exc:
            raise TLSRefusedError(_explain(address, security, exc)) from None
        except OSError as exc:
            if not _ssl_failure(exc):
                return  # not up yet, or not reachable: the workers wait as distributed's do
            closed = exc
            continue
        comm.abort()
        return
    assert closed is not None
    raise TLSRefusedError(_explain(address, security, closed))


def _ssl_failure(exc: BaseException) -> bool:
    """Whether an SSL error is in the chain of `exc` (the scheduler answered TCP but
    the TLS handshake broke)."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        if isinstance(e, ssl.SSLError):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _explain(address: str, security: Security, exc: BaseException) -> str:
    cert = getattr(security, "tls_worker_cert", None)
    ca = getattr(security, "tls_ca_file", None)
    cause = exc.__cause__ or exc
    detail = str(cause).split("] ", 1)[-1].split(" (_ssl.c")[0]
    text = f"{exc} {cause}".lower()
    if any(alert in text for alert in _REFUSED_BY_PEER):
        return (
            f"the scheduler at {address} refused this worker's certificate ({detail}): "
            f"--tls-cert {cert} must be signed by a CA the scheduler trusts "
            "(its --tls-ca-file)"
        )
    if "certificate verify failed" in text or "does not match" in text:
        return (
            f"this worker does not trust the certificate of the scheduler at {address} "
            f"({detail}): --tls-ca-file {ca} must be the CA that signed the "
            "scheduler's certificate, whose name must match the address"
        )
    if "eof occurred" in text or "closed" in text:
        return (
            f"the scheduler at {address} closed the connection during the TLS handshake "
            f"({detail}): it most likely refused this worker's certificate: --tls-cert "
            f"{cert} must be signed by a CA the scheduler trusts (its --tls-ca-file)"
        )
    return f"the TLS handshake with the scheduler at {address} failed: {detail}"
