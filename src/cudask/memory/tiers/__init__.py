"""The parts `cudask.memory.store.TieredStore` is composed of.

Covers: `device` (the LRU device tier and its eviction loop), `host` (the
host tier: distributed's SpillBuffer over disk, or an LRU without a host
limit), `inflight` (device -> host copies under way, spilled objects still
alive elsewhere), `engine` (the copy engine created lazily, its warm-up and
the pinning-ahead ramp), `background` (the background spilling thread) and
`metrics` (counters, the `Worker.metrics` snapshot, the store's loggers).

Does not cover: routing keys between the tiers (`cudask.memory.store`), the
copies themselves (`cudask.memory.handlers`, `cudask.memory.host.copy_engine`).

Threading: none of the parts locks; each says what its caller must hold
(the store's lock, as a rule).
"""
