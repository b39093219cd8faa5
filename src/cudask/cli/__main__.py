"""`python -m cudask.cli ...`: the same commands as `cudask ...` (dask-jobqueue's
worker_command). The guard matters: worker processes are spawned, and a spawned
child imports this module again as __mp_main__. Threading: the main thread."""

from cudask.cli.main import main

if __name__ == "__main__":
    main()
