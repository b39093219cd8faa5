"""Files, directories and TLS of a node's workers, checked before anything starts.

Covers: directories the workers write to (`local_directory`, `rmm_log_directory`:
writable, or creatable under a writable parent, as distributed creates them), the
pid file (its directory exists and is writable), the scheduler file (once it exists:
JSON with an address), the TLS files (readable PEM of their kind; the key the
certificate's), and whether TLS, when asked for (protocol 'tls', a tls:// address),
has the certificates it needs: from the TLS options, a `security` object, or the
`distributed.comm.tls` config. Each failing check raises a one-line OptionError
naming the value and what is accepted, with `option` set to the keyword at fault.

Does not cover: whether the scheduler accepts the certificates (cudask.deploy.preflight),
addresses and ports (cudask.deploy.check_network).

Threading: reads the file system and dask.config; call it from any thread.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from distributed.security import Security

from cudask.errors import OptionError

TLS_FILES = ("tls_ca_file", "tls_cert", "tls_key")
_EXAMPLE = {"tls_ca_file": "ca.pem", "tls_cert": "worker.pem", "tls_key": "worker-key.pem"}


def _cannot_write(directory: str) -> str | None:
    """Why nothing can be created in `directory`, or None: a directory is made and
    removed there (os.access says yes to root even on /proc)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".cudask-check-", dir=directory))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def check_directory(option: str, path: str) -> None:
    """A directory the workers write to: writable, or creatable (the nearest
    existing parent is a writable directory)."""
    accepted = (
        f"accepted: a writable directory, or one that can be created, e.g. {option}='/tmp/dask'"
    )
    if os.path.exists(path):
        why = "not a directory" if not os.path.isdir(path) else _cannot_write(path)
        if why:
            raise OptionError(
                f"{option}={path!r} is not writable ({why}); {accepted}", option=option
            )
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    why = "not a directory" if not os.path.isdir(parent) else _cannot_write(parent)
    if why:
        raise OptionError(
            f"{option}={path!r} cannot be created in {parent} ({why}); {accepted}", option=option
        )


def check_pid_file(path: str) -> None:
    """The pid file is written where its directory already is (distributed does not
    create it), and replaces a file there."""
    accepted = "accepted: a file in an existing writable directory, e.g. pid_file='/tmp/worker.pid'"
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OptionError(f"pid_file={path!r} is a directory; {accepted}", option="pid_file")
    if not os.path.isdir(parent):
        raise OptionError(
            f"pid_file={path!r}: there is no directory {parent}; {accepted}", option="pid_file"
        )
    why = _cannot_write(parent)
    if why or os.path.exists(path) and not os.access(path, os.W_OK):
        raise OptionError(
            f"pid_file={path!r} is not writable ({why or 'read-only'}); {accepted}",
            option="pid_file",
        )


_PEM_KINDS = {"tls_ca_file": "CERTIFICATE", "tls_cert": "CERTIFICATE", "tls_key": "PRIVATE KEY"}


def check_tls_files(values: Mapping[str, Any]) -> None:
    """Each TLS file given exists, is readable and holds PEM blocks of its kind (a
    certificate given in memory, with newlines, as distributed.Security accepts, is
    left alone); with all three, the CA loads and the key is the certificate's."""
    for option in TLS_FILES:
        path = values.get(option)
        if not path or "\n" in path:
            continue
        accepted = (
            f"accepted: a readable PEM file, e.g. {option}='/etc/dask/{_EXAMPLE[option]}' "
            "(see docs/tls.md)"
        )
        if not os.path.isfile(path):
            raise OptionError(f"{option}={path!r}: no such file; {accepted}", option=option)
        if not os.access(path, os.R_OK):
            raise OptionError(f"{option}={path!r} is not readable; {accepted}", option=option)
        with open(path, errors="replace") as f:
            text = f.read()
        kind = _PEM_KINDS[option]
        if not re.search(rf"-----BEGIN [A-Z ]*{kind}-----", text):
            raise OptionError(
                f"{option}={path!r} holds no PEM {kind.lower()} (a '-----BEGIN "
                f"...{kind}-----' block); {accepted}",
                option=option,
            )
        if option == "tls_key" and "ENCRYPTED" in text:
            raise OptionError(
                f"tls_key={path!r} is encrypted, and distributed reads keys "
                f"without a password; {accepted}, not encrypted",
                option=option,
            )
    ca, cert, key = (values.get(o) for o in TLS_FILES)
    if ca and cert and key and not any("\n" in p for p in (ca, cert, key)):
        _check_tls_pair(ca, cert, key)


def _check_tls_pair(ca: str, cert: str, key: str) -> None:
    """The CA file loads, and the key belongs to the certificate (as ssl reads them)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise OptionError(
            f"tls_ca_file={ca!r} cannot be read as CA certificates ({exc.reason}); "
            "accepted: a PEM file of CA certificates",
            option="tls_ca_file",
        ) from None
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        raise OptionError(
            f"tls_cert={cert!r} and tls_key={key!r} are not a certificate and its "
            f"key ({exc.reason}); accepted: the worker's certificate and the key "
            "it was made with",
            option="tls_key",
        ) from None


def read_scheduler_file(path: str) -> str | None:
    """The address in a scheduler file that exists (None when it does not yet: the
    workers wait for it, as distributed's do); OptionError when it is not a file a
    scheduler wrote."""
    accepted = (
        "accepted: the JSON file a scheduler wrote with --scheduler-file, e.g. "
        '{"address": "tcp://10.0.0.1:8786", ...}'
    )
    if not os.path.lexists(path):
        return None
    if os.path.isdir(path):
        raise OptionError(
            f"scheduler_file={path!r} is a directory; {accepted}", option="scheduler_file"
        )
    try:
        with open(path) as f:
            content = json.load(f)
    except OSError as exc:
        raise OptionError(
            f"scheduler_file={path!r} cannot be read ({exc.strerror or exc}); {accepted}",
            option="scheduler_file",
        ) from None
    except ValueError as exc:
        raise OptionError(
            f"scheduler_file={path!r} is not JSON ({exc}); {accepted}", option="scheduler_file"
        ) from None
    address = content.get("address") if isinstance(content, dict) else None
    if not isinstance(address, str) or not address:
        raise OptionError(
            f'scheduler_file={path!r} has no "address"; {accepted}', option="scheduler_file"
        )
    return address


def _configured(security: Any, certificates: Iterable[str]) -> bool:
    """Whether `security` (a Security, True for temporary ones, or None for the
    dask config's) has a CA and each of `certificates` (e.g. 'tls_worker_cert')."""
    if security is True:
        return True
    if not isinstance(security, Security):
        security = Security()
    return bool(security.tls_ca_file) and all(getattr(security, c, None) for c in certificates)


def check_tls_needs(
    asked_by: tuple[str, str] | None,
    values: Mapping[str, Any],
    security: Any,
    *,
    cluster: bool = False,
) -> None:
    """TLS asked for by `asked_by` (the option, and its value for the message, e.g.
    ("protocol", "protocol='tls'"); None: not asked) has its certificates: the TLS
    options, `security`, or the distributed.comm.tls config. A cluster's scheduler
    and workers need a certificate each."""
    if asked_by is None or all(values.get(o) for o in TLS_FILES):
        return
    option, text = asked_by
    if cluster:
        if _configured(security, ("tls_scheduler_cert", "tls_worker_cert")):
            return
        raise OptionError(
            f"{text} needs TLS certificates; accepted: security=True "
            "(temporary ones, as LocalCluster makes), a distributed.Security "
            "with a CA and scheduler and worker certificates, or those in "
            "the distributed.comm.tls config",
            option=option,
        )
    if _configured(security, ("tls_worker_cert",)):
        return
    raise OptionError(
        f"{text} needs TLS certificates; accepted: --tls-ca-file, --tls-cert "
        "and --tls-key (tls_ca_file=, tls_cert=, tls_key=), or "
        "distributed.comm.tls.ca-file and distributed.comm.tls.worker.cert in "
        "the dask config",
        option=option,
    )


__all__ = [
    "TLS_FILES",
    "check_directory",
    "check_pid_file",
    "check_tls_files",
    "check_tls_needs",
    "read_scheduler_file",
]
