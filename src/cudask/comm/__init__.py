"""How device data move between workers (cudask.comm.ipc: GPU to GPU on one node)."""
