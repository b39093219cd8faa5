"""Files, directories and TLS of a node's workers, checked before anything starts.

Covers: directories the workers write to (`local_directory`, `rmm_log_directory`:
writable, or creatable under a writable parent, as distributed creates them), the
pid file (its directory exists and is writable), the TLS files (they exist and
are readable), and whether TLS, when asked for (protocol 'tls', a tls:// address),
has the certificates it needs: from the TLS options, a `security` object, or the
`distributed.comm.tls` config. Each failing check raises a one-line OptionError
naming the value and what is accepted, with `option` set to the keyword at fault.

Does not cover: the certificates' contents and whether the scheduler accepts them
(cudask.deploy.preflight), addresses and ports (cudask.deploy.check_network).

Threading: reads the file system and dask.config; call it from any thread.
"""

from __future__ import annotations

import os
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
    accepted = (f"accepted: a writable directory, or one that can be created, e.g. "
                f"{option}='/tmp/dask'")
    if os.path.exists(path):
        why = "not a directory" if not os.path.isdir(path) else _cannot_write(path)
        if why:
            raise OptionError(f"{option}={path!r} is not writable ({why}); {accepted}", option=option)
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    why = "not a directory" if not os.path.isdir(parent) else _cannot_write(parent)
    if why:
        raise OptionError(f"{option}={path!r} cannot be created in {parent} ({why}); "
                             f"{accepted}", option=option)


def check_pid_file(path: str) -> None:
    """The pid file is written where its directory already is (distributed does not
    create it), and replaces a file there."""
    accepted = "accepted: a file in an existing writable directory, e.g. pid_file='/tmp/worker.pid'"
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OptionError(f"pid_file={path!r} is a directory; {accepted}", option="pid_file")
    if not os.path.isdir(parent):
        raise OptionError(f"pid_file={path!r}: there is no directory {parent}; {accepted}", option="pid_file")
    why = _cannot_write(parent)
    if why or os.path.exists(path) and not os.access(path, os.W_OK):
        raise OptionError(f"pid_file={path!r} is not writable ({why or 'read-only'}); "
                                 f"{accepted}", option="pid_file")


def check_tls_files(values: Mapping[str, Any]) -> None:
    """Each TLS file given exists and is readable (a certificate given in memory,
    with newlines, as distributed.Security accepts, is left alone)."""
    for option in TLS_FILES:
        path = values.get(option)
        if not path or "\n" in path:
            continue
        accepted = f"accepted: a readable PEM file, e.g. {option}='/etc/dask/{_EXAMPLE[option]}'"
        if not os.path.isfile(path):
            raise OptionError(f"{option}={path!r}: no such file; {accepted}", option=option)
        if not os.access(path, os.R_OK):
            raise OptionError(f"{option}={path!r} is not readable; {accepted}", option=option)


def _configured(security: Any, certificates: Iterable[str]) -> bool:
    """Whether `security` (a Security, True for temporary ones, or None for the
    dask config's) has a CA and each of `certificates` (e.g. 'tls_worker_cert')."""
    if security is True:
        return True
    if not isinstance(security, Security):
        security = Security()
    return bool(security.tls_ca_file) and all(getattr(security, c, None) for c in certificates)


def check_tls_needs(asked_by: tuple[str, str] | None, values: Mapping[str, Any],
                    security: Any, *, cluster: bool = False) -> None:
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
        raise OptionError(f"{text} needs TLS certificates; accepted: security=True "
                             "(temporary ones, as LocalCluster makes), a distributed.Security "
                             "with a CA and scheduler and worker certificates, or those in "
                             "the distributed.comm.tls config", option=option)
    if _configured(security, ("tls_worker_cert",)):
        return
    raise OptionError(f"{text} needs TLS certificates; accepted: --tls-ca-file, --tls-cert "
                         "and --tls-key (tls_ca_file=, tls_cert=, tls_key=), or "
                         "distributed.comm.tls.ca-file and distributed.comm.tls.worker.cert in "
                         "the dask config", option=option)


__all__ = ["TLS_FILES", "check_directory", "check_pid_file", "check_tls_files",
           "check_tls_needs"]
