"""cudask_bench: the benchmarks behind `cudask bench`, a package of the cudask distribution.

Covers: workloads (spill, cupy dask.array operations, cluster start-up, soak, device
transfers between workers), a runner that executes one variant in its own process on
one backend (cudask, dask-cuda, or distributed with a plain dict store), the harness
that runs variants side by side, compares them and writes JSON and PNG results, and the
click commands (cudask_bench.cli). Layers, top down: cli -> harness/soak/transfer ->
report, targets, run -> workloads, cupy_cases, shuffle -> measure, tasks, counters,
chart -> spec, stopping, provenance, pngtext -> environment (docs/design/benchmarks.md).
Every JSON result is written through provenance (commit, configuration, versions, cold or
warm); every chart names its result file (chart, pngtext).

Does not cover: anything the runtime needs. cudask never imports this package: `cudask
bench` is attached by name and loaded only when it runs. Importing this package imports
nothing else: the runner must load it next to dask-cuda without cudask's cluster.
Threading: see each module; none starts threads at import.
"""
