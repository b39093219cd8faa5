"""cudask.deploy.preflight without a GPU: what counts as a refused certificate, and
that a scheduler not up yet (or a non-TLS address) is left to the workers."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest
from distributed.comm.core import CommClosedError
from distributed.security import Security

from cudask.deploy.preflight import _explain, _ssl_failure, check_tls, scheduler_address
from cudask.errors import TLSRefusedError


def _chain(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def test_ssl_failures_are_told_from_a_scheduler_not_up() -> None:
    eof = _chain(CommClosedError("in <TLS (closed)>: SSLEOFError"), ssl.SSLEOFError(8, "EOF"))
    assert _ssl_failure(_chain(OSError("timed out during handshake"), eof))
    assert not _ssl_failure(_chain(OSError("timed out"), ConnectionRefusedError(111, "refused")))
    security = Security(tls_ca_file="ca.pem", tls_worker_cert="w.pem", tls_worker_key="w.key")
    said = _explain("tls://10.0.0.1:8786", security, eof)
    assert "closed the connection during the TLS handshake" in said and "w.pem" in said


def test_nothing_listening_and_plain_addresses_pass(tmp_path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    security = Security(tls_ca_file="ca.pem", tls_worker_cert="w.pem", tls_worker_key="w.key")
    asyncio.run(check_tls(f"tls://127.0.0.1:{port}", security, timeout=1))
    asyncio.run(check_tls("tcp://127.0.0.1:1", security))
    asyncio.run(check_tls("tls://127.0.0.1:1", None))
    file = tmp_path / "sched.json"
    file.write_text('{"address": "tls://10.0.0.1:8786"}')
    assert scheduler_address(None, str(file)) == "tls://10.0.0.1:8786"
    assert scheduler_address("tcp://a:1", str(file)) == "tcp://a:1"
    assert scheduler_address(None, str(tmp_path / "absent.json")) is None


def test_refusal_error_is_a_cudask_error() -> None:
    from cudask.errors import CudaskError

    assert issubclass(TLSRefusedError, CudaskError)
    with pytest.raises(TLSRefusedError):
        raise TLSRefusedError("x")
