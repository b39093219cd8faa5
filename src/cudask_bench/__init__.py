"""cudask_bench: the benchmarks behind `cudask bench`.

Covers: workloads (spill, cupy dask.array operations, cluster start-up), a
runner that executes one variant in its own process on one backend (cudask,
dask-cuda, or distributed with a plain dict store), and the harness that runs
variants side by side, compares them, and writes JSON and PNG results.

Modules: spec (names, variants, runner argv), environment (machine and
versions), workloads (the work), run (the runner, `python -m
cudask_bench.run`), harness (spawning and reporting), chart (PNG).

Importing this package imports nothing else: the runner must be able to load
it next to dask-cuda without pulling in cudask's cluster.

Does not cover: the click commands (cudask_bench.cli).
"""
