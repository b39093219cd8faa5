"""Two network namespaces joined by one veth link, and a small PKI, for tests of
nodes that talk only over TLS (root, pyroute2 and openssl needed; callers skip
otherwise). pyroute2 rather than iproute2's `ip`: the GPU machine has no `ip`.

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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("openssl") is None:
        return "needs openssl"
    try:
        from pyroute2 import netns
    except ImportError:
        return "needs pyroute2 (pip install -e '.[test,test-deploy]')"
    probe = f"cdk-probe-{os.getpid()}"
    try:
        netns.create(probe)
    except OSError as e:
        return f"cannot create a network namespace: {e}"
    netns.remove(probe)
    return None


# Runs argv[2:] inside the network namespace named argv[1].
_ENTER = "import os, sys; from pyroute2 import netns; netns.setns(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"


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
        from pyroute2 import IPRoute, NetNS, netns

        s, w = self.scheduler, self.workers
        a, b = f"{self.prefix}a", f"{self.prefix}b"
        netns.create(s)
        netns.create(w)
        with IPRoute() as ip:
            ip.link("add", ifname=a, kind="veth", peer=b)
            ip.link("set", index=ip.link_lookup(ifname=a)[0], net_ns_fd=s)
            ip.link("set", index=ip.link_lookup(ifname=b)[0], net_ns_fd=w)
        for ns, ifname, address in ((s, a, self.scheduler_ip), (w, b, self.worker_ip)):
            with NetNS(ns) as inside:
                index = inside.link_lookup(ifname=ifname)[0]
                inside.addr("add", index=index, address=address, prefixlen=24)
                inside.link("set", index=index, state="up")
                inside.link("set", index=inside.link_lookup(ifname="lo")[0], state="up")

    def delete(self) -> None:
        """Remove both namespaces (the veth pair goes with them); absent ones are skipped."""
        from pyroute2 import netns

        for ns in (self.scheduler, self.workers):
            if ns in netns.listnetns():
                netns.remove(ns)

    def argv(self, ns: str, argv: list[str]) -> list[str]:
        return [sys.executable, "-c", _ENTER, ns, *argv]

    def run(self, ns: str, argv: list[str], timeout: float = 120, **kw: Any) -> Any:
        return subprocess.run(
            self.argv(ns, argv), check=False, capture_output=True, text=True, timeout=timeout, **kw
        )

    def start(self, ns: str, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(ns, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
        )


def make_pki(directory: Path, ip: str) -> dict[str, str]:
    """CA-signed scheduler (for `ip`) and worker certificates, and a rogue CA's one:
    name -> path (ca, sched, sched-key, worker, worker-key, rogue, bad, bad-key)."""

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, cwd=directory)

    for ca in ("ca", "rogue"):
        sh(
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "2",
            "-subj",
            f"/CN=cudask-test-{ca}",
        )
    for name, ca in (("sched", "ca"), ("worker", "ca"), ("bad", "rogue")):
        sh(
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=cudask-test-{name}",
        )
        (directory / f"{name}.ext").write_text(f"subjectAltName=IP:{ip},IP:127.0.0.1\n")
        sh(
            "openssl",
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
        )
    out = {}
    for name in ("ca", "rogue", "sched", "worker", "bad"):
        out[name] = str(directory / f"{name}.pem")
        out[f"{name}-key"] = str(directory / f"{name}.key")
    return out
