"""cudask.cli: the `cudask` command, `dask cudask` and `dask cuda` (cudask.cli.main wires them).

Covers: one module per command, and how commands report errors and find a scheduler.
Does not cover: `cudask bench` (the cudask_bench package, attached by name). Importing
this package imports nothing. Threading: click runs each command in the calling thread.
"""
