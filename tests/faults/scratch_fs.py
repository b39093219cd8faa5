"""A small filesystem for the fault cases that fill one (the worker's local
directory running out of space while it spills).

Covers: `small_filesystem(where, size)`, a tmpfs of `size` (mount's syntax,
e.g. "256m") that really runs out of space (ENOSPC). It is mounted at `where`
where the process may mount (root with CAP_SYS_ADMIN); else a helper process
mounts it inside a user and mount namespace of its own (no root needed where
unprivileged user namespaces are allowed), and the path given back reaches it
through /proc/PID/root, so processes outside the namespace (the workers) write
to it. Neither: `Unavailable`, saying why each way failed.

Does not cover: loop devices or FUSE; a per-file size limit (RLIMIT_FSIZE),
which fails writes with EFBIG while the filesystem still has room, so it would
not test a full disk.

Threading: none; the helper process ends with the context (or with this
process: it waits on its standard input).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

WAYS = ("mount", "namespace")

# run by `sh -c` inside the new namespaces: $1 the mount point, $2 the size
_HOLD = 'mount -t tmpfs -o size="$2" tmpfs "$1" && echo ready && exec cat'


class Unavailable(Exception):
    """No way to make a small filesystem here; the message says why."""


@contextlib.contextmanager
def small_filesystem(where: Path, size: str, ways: tuple[str, ...] = WAYS) -> Iterator[Path]:
    """Yield a path on a `size` tmpfs (`where` itself, or a path reaching it),
    trying `ways` in order; raise `Unavailable` when none works."""
    where.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for way in ways:
        opened = _mount(where, size) if way == "mount" else _namespace(where, size)
        try:
            path = next(opened)
        except Unavailable as exc:
            failed.append(f"{way}: {exc}")
            continue
        try:
            yield path
        finally:
            opened.close()  # unmounts
        return
    raise Unavailable("; ".join(failed) or "no way was tried")


def _mount(where: Path, size: str) -> Iterator[Path]:
    if shutil.which("mount") is None:
        raise Unavailable("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise Unavailable(_one_line(done.stderr) or f"mount exited {done.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=60)


def _namespace(where: Path, size: str) -> Iterator[Path]:
    if shutil.which("unshare") is None:
        raise Unavailable("no unshare command")
    helper = subprocess.Popen(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            _HOLD,
            "sh",
            str(where),
            size,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert helper.stdin is not None and helper.stdout is not None
    try:
        if helper.stdout.readline().strip() != "ready":
            helper.stdin.close()
            helper.wait(timeout=60)
            err = helper.stderr.read() if helper.stderr is not None else ""
            raise Unavailable(_one_line(err) or f"unshare exited {helper.returncode}")
        yield Path(f"/proc/{helper.pid}/root{where.absolute()}")
    finally:
        if helper.poll() is None:
            helper.stdin.close()  # cat ends, and with the namespace's last process its tmpfs
            try:
                helper.wait(timeout=60)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait(timeout=60)


def _one_line(text: str) -> str:
    return " ".join(text.split())


__all__ = ["WAYS", "Unavailable", "small_filesystem"]
