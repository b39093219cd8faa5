"""The soak: minutes of random work and worker kills at a small device limit, then every
held key checked byte for byte.

Covers: `SoakPlan`, `run_soak(plan)` (a LocalCUDACluster, one worker per GPU, at the
plan's device and host limits, the host tier `plan.host_fraction` of the host limit so
data reach disk) and `soak_on(client, plan)` (the steps on any cluster with nannies,
e.g. a CPU LocalCluster with host values only). Steps are drawn from a seeded generator
(`STEPS`): create a deterministic value (cudask.testing.integrity) of 1-64 MiB held by
the client; read a held key where it lives and compare its digest with a fresh
computation's; combine two device values; ask a worker to spill device data; delete a
held key; SIGKILL a worker (at most once per `plan.kill_every` seconds; its nanny
restarts it). With `plan.min_kills`, steps go on past `plan.duration`, killing only,
until that many kills happened, for at most `OVERTIME` seconds more. Held data stay
under `plan.max_held` bytes. At the end every held key is digested and compared; the
report counts steps, bytes created and moved between tiers (metrics are read before
each kill), kills, keys checked, lost and changed, and reads that differed.

Does not cover: timing (`cudask bench spill|cupy`), the fault cases one by one
(tests/faults). Threading: the caller's thread drives the client; value functions run
on workers.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from cudask.testing.integrity import check_keys, digest, make_value, settle

MiB = 1 << 20
DEVICE_KINDS = ("f8", "i1", "view", "dict")
KINDS = (*DEVICE_KINDS, "host")
SIZES = (1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
OVERTIME = 600.0  # seconds past plan.duration to reach plan.min_kills
STEPS = {"create": 34, "read": 25, "combine": 10, "spill": 8, "delete": 18, "kill": 5}
MOVED = (
    "spill-device-to-host-bytes",
    "unspill-host-to-device-bytes",
    "spill-host-to-disk-bytes",
    "unspill-disk-to-host-bytes",
)


@dataclass(frozen=True)
class SoakPlan:
    duration: float = 120.0
    device_memory_limit: int = 1 << 30
    memory_limit: int = 4 << 30
    host_fraction: float = 0.25
    max_held: int = 3 << 30
    kill_every: float = 20.0
    min_kills: int = 0
    seed: int = 0
    n_workers: int | None = None
    jit_unspill: bool = False
    kinds: tuple[str, ...] = KINDS

    def __post_init__(self) -> None:
        kills = self.min_kills
        if type(kills) is not int or kills < 0 or (kills and self.kill_every <= 0):
            raise ValueError(
                f"min_kills={kills!r} with kill_every={self.kill_every!r}; "
                "accepted: a whole number >= 0, and 0 unless kill_every > 0"
            )
        if kills * self.kill_every > self.duration + OVERTIME:
            raise ValueError(
                f"min_kills={kills} kills, one at most every {self.kill_every:g} s, "
                f"take longer than duration + {OVERTIME:.0f} s of overtime "
                f"({self.duration + OVERTIME:g} s); accepted: min_kills x "
                "kill_every within that"
            )


def _fresh(spec: tuple[Any, ...]) -> str:
    """Digest of a fresh computation of a created ("make") or combined value."""
    if spec[0] == "make":
        return digest(make_value(*spec[1:]))
    return digest(_combine(make_value(*spec[1]), make_value(*spec[2])))


def _combine(x: Any, y: Any) -> Any:
    import cupy

    from cudask.memory.jit.proxy import unproxy

    parts = []
    for v in (unproxy(x), unproxy(y)):
        v = v["device"] if isinstance(v, dict) else v
        parts.append(cupy.ascontiguousarray(v).reshape(-1).view(cupy.uint8))
    return cupy.concatenate(parts)


def _wait(wait: Any, futures: list[Any], errors: list[str], timeout: float = 600) -> None:
    try:
        wait(futures, timeout=timeout)
    except TimeoutError:
        errors.append(
            f"{sum(f.status == 'pending' for f in futures)} tasks not done after {timeout:.0f} s"
        )


def _spill(nbytes: int, dask_worker: Any = None) -> int:
    spill = getattr(dask_worker.data, "spill_device", None)  # a plain dict cannot
    return int(spill(nbytes)) if spill is not None else 0


def _moved(dask_worker: Any) -> dict[str, float]:
    metrics = getattr(dask_worker.data, "metrics", None)
    m = metrics() if metrics is not None else {}
    return {k: float(m.get(k, 0.0)) for k in MOVED}


def run_soak(plan: SoakPlan, progress: Any = None) -> dict[str, Any]:
    """Run the soak on a fresh LocalCUDACluster; return the report (module docstring)."""
    import dask
    from distributed import Client

    from cudask import LocalCUDACluster

    with (
        dask.config.set({"distributed.worker.memory.target": plan.host_fraction}),
        LocalCUDACluster(
            n_workers=plan.n_workers,
            threads_per_worker=2,
            device_memory_limit=plan.device_memory_limit,
            memory_limit=plan.memory_limit,
            jit_unspill=plan.jit_unspill,
            dashboard_address=":0",
        ) as cluster,
        Client(cluster) as client,
    ):
        return soak_on(client, plan, progress)


@dataclass
class _Soak:
    """The state of one soak: what the client holds, what each held key must digest to,
    the reads to compare, and the counts of the report."""

    client: Any
    plan: SoakPlan
    rng: random.Random
    counts: Counter[str] = field(default_factory=Counter)
    moved: Counter[str] = field(default_factory=Counter)
    held: dict[Any, tuple[tuple[Any, ...], int]] = field(
        default_factory=dict
    )  # future -> (spec, bytes)
    expected: dict[Any, Any] = field(default_factory=dict)  # future -> future of its fresh digest
    reads: list[tuple[Any, Any]] = field(default_factory=list)  # (digest, fresh-digest) futures
    created: int = 0
    next_id: int = 0
    errors: list[str] = field(default_factory=list)
    last_kill: float = field(init=False)
    start: float = field(init=False)

    def __post_init__(self) -> None:
        self.last_kill = time.monotonic()
        self.start = time.monotonic()

    @property
    def kills(self) -> int:
        return self.counts["kill"] - self.counts["kill-missed"]

    def next_step(self) -> str | None:
        """The next step's name; "" when the soak is over, None to look again (waiting
        for the next kill in overtime)."""
        plan = self.plan
        elapsed = time.monotonic() - self.start
        overtime = elapsed >= plan.duration
        if overtime and (self.kills >= plan.min_kills or elapsed >= plan.duration + OVERTIME):
            return ""
        if overtime:  # only kills now, to reach plan.min_kills
            due = plan.kill_every - (time.monotonic() - self.last_kill)
            if due > 0:
                time.sleep(min(due, 1.0))
                return None
            step = "kill"
        else:
            step = self.rng.choices(list(STEPS), weights=list(STEPS.values()))[0]
        made = self.made()
        if step == "create" and sum(n for _, n in self.held.values()) > plan.max_held:
            step = "delete"
        if step in ("read", "delete", "combine") and len(self.held) < 2:
            step = "create"
        if step == "combine" and len(made) < 2:
            step = "create"
        if step == "kill" and (
            not plan.kill_every or time.monotonic() - self.last_kill < plan.kill_every
        ):
            step = "read" if self.held else "create"
        return step

    def made(self) -> list[Any]:
        """Held values created on the device (what `combine` joins)."""
        return [f for f, (s, _) in self.held.items() if s[0] == "make" and s[3] != "host"]

    def hold(self, f: Any, spec: tuple[Any, ...], size: int) -> None:
        self.next_id += 1
        self.held[f] = (spec, size)
        self.expected[f] = self.client.submit(_fresh, spec, pure=False)
        self.created += size

    def create(self) -> None:
        spec: tuple[Any, ...] = (
            "make",
            self.next_id,
            self.rng.choice(SIZES),
            self.rng.choice(self.plan.kinds),
        )
        self.hold(
            self.client.submit(make_value, *spec[1:], key=f"soak-{self.next_id}"), spec, spec[2]
        )

    def read(self) -> None:
        f = self.rng.choice(list(self.held))
        self.reads.append((self.client.submit(digest, f, pure=False), self.expected[f]))

    def combine(self) -> None:
        a, b = self.rng.sample(self.made(), 2)
        spec = ("combine", self.held[a][0][1:], self.held[b][0][1:])
        f = self.client.submit(_combine, a, b, key=f"soak-{self.next_id}")
        self.hold(f, spec, self.held[a][1] + self.held[b][1])

    def spill(self) -> None:
        workers = sorted(self.client.nthreads())
        try:  # a worker being restarted does not answer
            if not workers:
                raise OSError("no worker")
            self.client.run(_spill, self.rng.choice(SIZES) * 4, workers=[self.rng.choice(workers)])
        except OSError:
            self.counts["spill-missed"] += 1

    def delete(self) -> None:
        f = self.rng.choice(list(self.held))
        del self.held[f]
        self.expected.pop(f)

    def kill(self) -> None:
        try:
            pids = self.client.run(os.getpid)
            if not pids:
                raise OSError("no worker")
            address = self.rng.choice(sorted(pids))
            self.moved.update(self.client.run(_moved, workers=[address])[address])
        except OSError:  # a worker being restarted: kill later
            self.counts["kill-missed"] += 1
        else:
            os.kill(pids[address], signal.SIGKILL)
        self.last_kill = time.monotonic()


def soak_on(client: Any, plan: SoakPlan, progress: Any = None) -> dict[str, Any]:
    """The soak's steps on the cluster of `client` (workers with nannies, so killed
    ones come back), values of `plan.kinds`; the device limit, host limit and
    worker count of `plan` are the cluster's business here."""
    from distributed import wait

    soak = _Soak(client, plan, random.Random(plan.seed))
    steps = {
        "create": soak.create,
        "read": soak.read,
        "combine": soak.combine,
        "spill": soak.spill,
        "delete": soak.delete,
        "kill": soak.kill,
    }
    while (step := soak.next_step()) != "":
        if step is None:
            continue
        soak.counts[step] += 1
        steps[step]()
        if sum(soak.counts.values()) % 40 == 0:  # keep the scheduler's queue short
            _wait(
                wait,
                [e for _, e in soak.reads[-40:]] + list(soak.expected.values())[-40:],
                soak.errors,
            )
        if progress is not None:
            progress(time.monotonic() - soak.start, soak.counts)
    return _report(soak, wait)


def _settle_all(soak: _Soak, wait: Any) -> tuple[int, dict[Any, Any]]:
    """Wait for every digest; (reads that differed, {held future: its fresh digest})."""
    plan, errors = soak.plan, soak.errors
    if soak.kills < plan.min_kills:
        errors.append(
            f"{soak.kills} of {plan.min_kills} kills in {plan.duration + OVERTIME:.0f} s "
            f"(one at most every {plan.kill_every:.0f} s)"
        )
    _wait(wait, list(soak.expected.values()) + [d for pair in soak.reads for d in pair], errors)
    differing = 0
    deadline = time.monotonic() + 600
    for got, want in soak.reads:  # settle: results lost with the last kills are recomputed
        got_digest, got_why = settle(got, max(deadline - time.monotonic(), 1.0))
        want_digest, want_why = settle(want, max(deadline - time.monotonic(), 1.0))
        if got_why or want_why:
            errors.append(f"read of {got.key}: {got_why or 'ok'} / {want_why or 'ok'}")
        elif got_digest != want_digest:
            differing += 1
    fresh = {}
    for f, e in soak.expected.items():
        value, why = settle(e, max(deadline - time.monotonic(), 1.0))
        if why is None:
            fresh[f] = value
        else:
            errors.append(f"fresh digest of {f.key}: {why}")
    return differing, fresh


def _report(soak: _Soak, wait: Any) -> dict[str, Any]:
    """Check every held key and count what happened (the module docstring's report)."""
    client = soak.client
    differing, fresh = _settle_all(soak, wait)
    check = check_keys(client, fresh)
    client.wait_for_workers(1, timeout=120)
    for moves in client.run(_moved).values():
        soak.moved.update(moves)
    alive = len(client.nthreads())
    return {
        "plan": asdict(soak.plan),
        "seconds": round(time.monotonic() - soak.start, 1),
        "workers": alive,
        "steps": dict(soak.counts),
        "cycles": sum(soak.counts.values()),
        "kills": soak.kills,
        "bytes_created": soak.created,
        "bytes_moved": {k.removesuffix("-bytes"): int(v) for k, v in soak.moved.items()},
        "keys_checked": check.checked,
        "keys_lost": len(check.lost),
        "keys_changed": len(check.changed),
        "lost": check.lost,
        "reads_checked": len(soak.reads),
        "reads_differing": differing,
        "errors": soak.errors,
        "ok": check.ok and not differing and not soak.errors,
    }
