"""Host memory for copies to and from the device, made ready ahead of use.

Covers, one module a part, each importing only those above it in this list:

- `faulting`: anonymous huge-page mappings faulted in by threads;
- `slabs`: the pool's slab bookkeeping (free ranges, first fit, idle slabs),
  plain data without CUDA or threads;
- `blocks`: `HostBlock`, one block of host memory a copy goes into or out of;
- `pinning`: the pinning methods ("register", "host-alloc") and the fallback
  from one to the other;
- `fallback`: memory for copies the pool cannot serve, and its warnings;
- `traffic`: whether this process moves device memory now;
- `provision`: `Provisioner`, the pool's slabs reserved ahead and given back;
- `pool`: `PinnedPool`, blocks carved out of the slabs and taken back;
- `transfer`: `TransferEngine`, copies between device memory and pool blocks.

Does not cover: the CUDA calls (`cudask.memory.backend`, below this package)
or which objects are copied and when (the handlers and the store, above it).

Threading: see each module. Importing this package imports none of its
modules and creates no CUDA context.
"""
