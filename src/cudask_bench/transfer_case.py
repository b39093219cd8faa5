"""One case of `cudask bench transfer` (a setting, with or without a pool, in one round)
in a process of its own.

Covers: `run_case`, the command's side: the case's runner (`python -m
cudask_bench.transfer_case`) started through cudask_bench.harness.spawn_runner (a
process group and a temporary directory of its own; the runner and its workers stopped
past `CASE_TIMEOUT_S` (600 s) or when the command is interrupted), its figures, or its error with the runner's last lines of output;
`main`, the runner: the plan, the setting and the pool from its arguments, the case
measured (cudask_bench.transfer.run_setting), the result written as JSON
(cudask_bench.stopping.record_run).

Why a process per case: the case's scheduler and client live in the runner, so nothing
an earlier case left in a process (dask-cuda's UCX context and its threads, garbage,
imported state) weighs on the next case's cold run. Each cold figure is then the first
work of a fresh scheduler, client and workers.

Does not cover: the measurements (cudask_bench.transfer), the plan's checks
(cudask_bench.cli.transfer). Threading: `run_case` in the command's thread (the runner's
output read by a daemon thread of spawn_runner); `main` in the runner's main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from cudask_bench import harness, stopping
from cudask_bench.targets import Target
from cudask_bench.transfer import Setting, TransferPlan, run_setting

#: Seconds a case's runner may take (start, measure, close) before it is stopped.
CASE_TIMEOUT_S = 600.0


def setting_from(data: Mapping[str, Any]) -> Setting:
    """A Setting from its `asdict` form (lists back to tuples)."""
    return Setting(
        **{
            **data,
            "pythonpath": tuple(data["pythonpath"]),
            "env": tuple((str(k), str(v)) for k, v in data["env"]),
        }
    )


def plan_from(data: Mapping[str, Any]) -> TransferPlan:
    """A TransferPlan from its `asdict` form (lists back to tuples)."""
    return TransferPlan(
        **{
            **data,
            "placement": tuple(data["placement"]),
            "sizes": tuple(data["sizes"]),
            "settings": tuple(setting_from(s) for s in data["settings"]),
            "pools": tuple(data["pools"]),
            "shuffle_methods": tuple(data["shuffle_methods"]),
        }
    )


def run_case(
    setting: Setting, plan: TransferPlan, pool: str | None = None, tag: str = ""
) -> dict[str, Any]:
    """The case measured in a runner process of its own: its figures, or {"error": why}."""
    argv = [
        "--plan",
        json.dumps(asdict(plan)),
        "--setting",
        json.dumps(asdict(setting)),
        "--pool",
        json.dumps(pool),
        f"--tag={tag}",
    ]
    result = harness.spawn_runner(
        Target(sys.executable),
        argv,
        shim=None,
        timeout=CASE_TIMEOUT_S,
        on_progress=lambda done, total, label: None,
        module="cudask_bench.transfer_case",
    )
    if result.get("status") != "ok" or not isinstance(result.get("figures"), dict):
        failed: dict[str, Any] = {
            "error": str(result.get("error") or "the case's runner gave no figures")[:2000]
        }
        if result.get("log_tail"):  # the runner's last lines: its scheduler, client and traceback
            failed["log_tail"] = list(result["log_tail"])[-20:]
        if result.get("traceback"):
            failed["traceback"] = str(result["traceback"])[-4000:]
        return failed
    return dict(result["figures"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cudask_bench.transfer_case",
        description="Measure one case of `cudask bench transfer` and write "
        "a JSON result. Normally started by `cudask bench transfer`.",
    )
    p.add_argument("--plan", required=True, help="the TransferPlan as JSON")
    p.add_argument("--setting", required=True, help="the Setting as JSON")
    p.add_argument("--pool", required=True, help="the RMM pool as JSON (null: none)")
    p.add_argument("--tag", default="", help="added to the case's log directory name")

    def work(args: argparse.Namespace) -> dict[str, Any]:
        setting, plan = setting_from(json.loads(args.setting)), plan_from(json.loads(args.plan))
        return {"figures": run_setting(setting, plan, json.loads(args.pool), args.tag)}

    return stopping.runner_main(p, work, argv)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CASE_TIMEOUT_S", "main", "plan_from", "run_case", "setting_from"]
