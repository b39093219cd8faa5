"""`python -m cudask.cli ...`: the same commands as `cudask ...`."""

from cudask.cli.main import main

main()
