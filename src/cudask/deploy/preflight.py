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
"""

from __future__ import annotations

import json
import os

from distributed.comm import connect
from distributed.comm.core import FatalCommClosedError
from distributed.security import Security

from cudask.errors import TLSRefusedError

# TLS alerts from the scheduler: it did not accept this node's certificate.
_REFUSED_BY_PEER = ("alert unknown ca", "alert bad certificate", "alert certificate required",
                    "alert certificate unknown", "alert access denied", "alert handshake failure")


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


async def check_tls(address: str | None, security: Security | None, timeout: float = 10) -> None:
    """Raise TLSRefusedError when a TLS handshake with `address` fails on a
    certificate; return otherwise (also when nothing answers yet)."""
    if not address or not address.startswith("tls://") or security is None:
        return
    try:
        comm = await connect(address, timeout=timeout, **security.get_connection_args("worker"))
    except FatalCommClosedError as exc:
        raise TLSRefusedError(_explain(address, security, exc)) from None
    except OSError:
        return  # not up yet, or not reachable: the workers wait as distributed's do
    comm.abort()


def _explain(address: str, security: Security, exc: BaseException) -> str:
    cert = getattr(security, "tls_worker_cert", None)
    ca = getattr(security, "tls_ca_file", None)
    cause = exc.__cause__ or exc
    detail = str(cause).split("] ", 1)[-1].split(" (_ssl.c")[0]
    text = f"{exc} {cause}".lower()
    if any(alert in text for alert in _REFUSED_BY_PEER):
        return (f"the scheduler at {address} refused this worker's certificate ({detail}): "
                f"--tls-cert {cert} must be signed by a CA the scheduler trusts "
                "(its --tls-ca-file)")
    if "certificate verify failed" in text or "does not match" in text:
        return (f"this worker does not trust the certificate of the scheduler at {address} "
                f"({detail}): --tls-ca-file {ca} must be the CA that signed the "
                "scheduler's certificate, whose name must match the address")
    return f"the TLS handshake with the scheduler at {address} failed: {detail}"
