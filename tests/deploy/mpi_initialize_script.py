"""Run under mpirun by tests/deploy/test_mpi_gpu.py: a dask-mpi program as its users
write one. Rank 0 runs the scheduler, rank 1 this client code, ranks 2.. a
cudask.CUDAWorker each (dask_mpi.initialize). The client writes, for every worker,
its name, the UUID of its CUDA device 0, its CUDA_VISIBLE_DEVICES, its device memory
limit, threads and whether a nanny runs it to OUT, then leaves: dask-mpi then shuts the
cluster down.
Usage: python mpi_initialize_script.py OUT WORKER_OPTIONS_JSON N_WORKERS"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dask_mpi import initialize

initialize(
    worker_class="cudask.CUDAWorker",
    worker_options=json.loads(sys.argv[2]),
    dashboard=False,
    nthreads=1,
)

# only rank 1 (the client) gets here
from distributed import Client

from cudask.testing import current_gpu_uuid, workers_info


def _view(dask_worker: Any) -> dict[str, Any]:
    return {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "limit": getattr(dask_worker.data, "device_memory_limit", None),
        "nthreads": dask_worker.state.nthreads,
        "nanny": dask_worker.nanny is not None,
    }


with Client() as client:
    client.wait_for_workers(int(sys.argv[3]), timeout=180)
    info = workers_info(client)
    uuids = client.run(current_gpu_uuid)
    views = client.run(_view)
    result = {str(w["name"]): {"uuid": uuids[addr], **views[addr]} for addr, w in info.items()}
Path(sys.argv[1]).write_text(json.dumps(result))
