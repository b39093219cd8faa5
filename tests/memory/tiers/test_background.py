"""Background spilling through the store: the device tier is brought below its
spill target by the store's own thread."""

from __future__ import annotations

from collections.abc import Callable

from cudask.memory.store import TieredStore
from cudask.testing.fake_cuda import filled

MakeStore = Callable[..., TieredStore]
WaitFor = Callable[..., bool]


dev = filled  # a fake device array of n elements, each `fill`


def test_background_spilling_keeps_the_tier_below_target(
    make_store: MakeStore, wait_for: WaitFor
) -> None:
    store = make_store(device_memory_limit=1000, spill_target=0.5, background=True)
    for i in range(9):
        store[i] = dev(100, i)  # 900 bytes: below the limit, above the target
    wait_for(lambda: store.device_bytes <= 500)
    assert store.device_bytes <= 500
    assert store._thread is not None and store._thread.name == "cudask-spill"
    for i in range(9):
        assert (store[i].get() == i).all()


def test_background_thread_holds_its_owner_weakly() -> None:
    """The part on its own: steps run while they report more to do, idling in
    between, and the thread ends once the owner is gone or idling says stop."""
    import gc
    import threading

    from cudask.memory.tiers import background

    class Owner:
        def __init__(self) -> None:
            self.steps = 0
            self.stop = threading.Event()

        def step(self) -> bool:
            self.steps += 1
            return self.steps % 3 != 0

        def idle(self) -> bool:
            return not self.stop.wait(0.001)

    owner = Owner()
    thread = background.start(owner, Owner.step, Owner.idle, "test-background")
    assert thread.daemon and thread.name == "test-background"
    while owner.steps < 9:
        threading.Event().wait(0.001)
    owner.stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()

    dropped = Owner()
    thread = background.start(dropped, Owner.step, Owner.idle, "test-background")
    del dropped
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()
