"""Two network namespaces joined by one veth link, and a small PKI, for tests of
nodes that talk only over TLS (root and iproute2 needed; callers skip otherwise).

`Namespaces` makes `<prefix>-s` (10.231.N.1, the scheduler's) and `<prefix>-w`
(10.231.N.2, the workers'), each with its loopback up; `run(ns, argv)` and
`start(ns, argv)` run a command inside one. `make_pki(dir, ip)` writes a CA, a
scheduler certificate for the IP, a worker certificate from the same CA and a
"rogue" CA with a certificate of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "openssl"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = f"cdk-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


@dataclass
class Namespaces:
    prefix: str
    subnet: int

    @property
    def scheduler(self) -> str:
        return f"{self.prefix}-s"

    @property
    def workers(self) -> str:
        return f"{self.prefix}-w"

    @property
    def scheduler_ip(self) -> str:
        return f"10.231.{self.subnet}.1"

    @property
    def worker_ip(self) -> str:
        return f"10.231.{self.subnet}.2"

    def create(self) -> None:
        s, w = self.scheduler, self.workers
        a, b = f"{self.prefix}a", f"{self.prefix}b"
        for argv in (["ip", "netns", "add", s], ["ip", "netns", "add", w],
                     ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
                     ["ip", "link", "set", a, "netns", s], ["ip", "link", "set", b, "netns", w],
                     ["ip", "-n", s, "addr", "add", f"{self.scheduler_ip}/24", "dev", a],
                     ["ip", "-n", w, "addr", "add", f"{self.worker_ip}/24", "dev", b],
                     ["ip", "-n", s, "link", "set", a, "up"], ["ip", "-n", w, "link", "set", b, "up"],
                     ["ip", "-n", s, "link", "set", "lo", "up"],
                     ["ip", "-n", w, "link", "set", "lo", "up"]):
            subprocess.run(argv, check=True, capture_output=True, text=True)

    def delete(self) -> None:
        for ns in (self.scheduler, self.workers):
            subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

    def argv(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def run(self, ns: str, argv: list[str], timeout: float = 120, **kw: Any) -> Any:
        return subprocess.run(self.argv(ns, argv), check=False, capture_output=True, text=True,
                              timeout=timeout, **kw)

    def start(self, ns: str, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(ns, argv), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, **kw)


def make_pki(directory: Path, ip: str) -> dict[str, str]:
    """CA-signed scheduler (for `ip`) and worker certificates, and a rogue CA's one:
    name -> path (ca, sched, sched-key, worker, worker-key, rogue, bad, bad-key)."""

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=directory)

    for ca in ("ca", "rogue"):
        sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
           "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=cudask-test-{ca}")
    for name, ca in (("sched", "ca"), ("worker", "ca"), ("bad", "rogue")):
        sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
           "-out", f"{name}.csr", "-subj", f"/CN=cudask-test-{name}")
        (directory / f"{name}.ext").write_text(f"subjectAltName=IP:{ip},IP:127.0.0.1\n")
        sh("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
           f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
           "-extfile", f"{name}.ext")
    out = {}
    for name in ("ca", "rogue", "sched", "worker", "bad"):
        out[name] = str(directory / f"{name}.pem")
        out[f"{name}-key"] = str(directory / f"{name}.key")
    return out
