"""JIT-unspill: a layer above the memory core, where tasks get proxies.

Covers, lowest module first (each imports only those before it and the core):

- `cell`: a proxy's state (`ProxyCell`), the forms of its content, rebuilding a
  host form, and `ProxyHome`, what a cell asks of its store;
- `wire`: a proxy's header and frames on the wire, and the registry of device
  serialization families (the comm layer registers its own there);
- `dask_dispatch`: dask's dispatch registries taught to unwrap proxies;
- `proxy`: `ProxyObject`, `unproxy`, `asproxy`, and its registration with
  distributed's serializers;
- `proxy_store`: `ProxyStore`, a worker's `data=` under JIT-unspill, built on the
  core's `TieredStore`.

`cudask.memory.ProxyObject` and `cudask.memory.ProxyStore` are the public names.

Does not cover: the core (tiered store, tiers, handlers, copies, host memory),
which never imports this package; the transports (cudask.comm), which import
it, never the reverse. Importing the package imports none of its modules.

Threading: see each module.
"""
