"""Run under mpirun by tests/deploy/test_mpi_cpu.py: each rank initializes MPI (as
dask-mpi does), builds CUDAWorker with the keywords dask_mpi.initialize() gives it, on a
fake machine of GPUS GPUs, and writes what it would start (or its error) to OUTDIR/RANK.json.
Nothing is started. Usage: python mpi_probe.py GPUS OUTDIR [WORKER_OPTIONS_JSON]"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import dask.config
from mpi4py import MPI  # initializes MPI, as dask-mpi's command and initialize() do

from cudask.deploy import node
from cudask.devices import discover
from cudask.errors import CudaskError
from cudask.testing import FakeBackend


def main() -> None:
    gpus, outdir = int(sys.argv[1]), Path(sys.argv[2])
    worker_options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    machine = discover(FakeBackend.dgx(gpus, cores=8))
    node.discover = lambda: machine  # the fake machine stands where NVML would
    rank = MPI.COMM_WORLD.Get_rank()

    async def build() -> node.CUDAWorker:  # Nannies are made inside an event loop
        return node.CUDAWorker(
            interface=None,
            protocol=None,
            nthreads=1,
            memory_limit="auto",
            local_directory=None,
            name=rank,
            **{"device_memory_limit": None, "nanny": True, **worker_options},
        )

    out: dict[str, Any] = {"rank": rank}
    try:
        # distributed's NVML monitor stays off: the machine is a fake one
        with dask.config.set(
            {"scheduler-address": "tcp://127.0.0.1:8786", "distributed.diagnostics.nvml": False}
        ):
            worker = asyncio.run(build())
    except CudaskError as exc:
        out["error"] = str(exc)
    else:
        out["gpus"] = [d.gpu.index for d in worker.devices]
        out["names"] = [n.name for n in worker.nannies]
        out["env"] = [n.env["CUDA_VISIBLE_DEVICES"] for n in worker.nannies]
    (outdir / f"{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
