"""cudask's worker links an Alias task of a spilled device key in its TieredStore
instead of reading the key back: nothing moves until a task uses the data, the
alias names the source's entry, reads right, and reports the source's size. distributed's Worker, on the same store, reads the key
back for the alias. CPU: a real scheduler and worker, fake device objects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dask._task_spec import Alias
from distributed import Client, Scheduler, Worker, wait
from distributed.core import Status
from distributed.utils_test import async_poll_for
from distributed.worker_state_machine import ExecuteSuccessEvent

from cudask.memory.settings import store_settings
from cudask.memory.store import TieredStore
from cudask.memory.tiers.names import Linked
from cudask.testing.fake_cuda import FakeCopyBackend, FakeDeviceArray
from cudask.worker.gpu_worker import GPUWorker


def make_chunk(i: int) -> FakeDeviceArray:
    a = FakeDeviceArray.empty(1000, "u1")
    a.fill(i)
    return a


def check(a: FakeDeviceArray, i: int) -> bool:
    return type(a) is FakeDeviceArray and bool((a.get() == i).all())


def _read_back(store: TieredStore) -> float:
    return store.cumulative_metrics["host-to-device", "bytes"]


@contextlib.asynccontextmanager
async def _cluster(
    worker_class: type[Worker], device_limit: int
) -> AsyncIterator[tuple[Client, TieredStore, Scheduler, Worker]]:
    """A scheduler, one one-thread worker of `worker_class` on a TieredStore of fake
    device objects at `device_limit` bytes, and a client; both check their state
    machines' invariants after every transition (`validate`)."""
    kwargs = {
        "device_memory_limit": device_limit,
        "memory_limit": 10**6,
        "backend": FakeCopyBackend(),
        "settings": store_settings(
            device_limit, 10**6, pinned_preallocate=False, pinned_pool_size=1 << 16
        ),
    }
    async with (
        Scheduler(dashboard_address=":0", port=0, validate=True) as scheduler,
        worker_class(
            scheduler.address,
            nthreads=1,
            data=(TieredStore, kwargs),
            dashboard_address=":0",
            validate=True,
        ) as worker,
        Client(scheduler.address, asynchronous=True) as client,
    ):
        assert isinstance(worker.data, TieredStore)
        yield client, worker.data, scheduler, worker


async def _alias_of_spilled(worker_class: type[Worker]) -> dict[str, Any]:
    """Persist a chunk, push it off the device, run an Alias task of it, then use the
    alias; what moved and what was read."""
    out: dict[str, Any] = {}
    async with _cluster(worker_class, 3000) as (client, store, scheduler, _):
        source = client.submit(make_chunk, 7, key="source")
        await wait(source)
        others = client.map(make_chunk, range(1, 5), key=[f"other-{i}" for i in range(4)])
        await wait(others)  # 4 kB more at a 3 kB limit: the source (least recent) moved
        assert store.where("source") == "host"
        before = _read_back(store)
        alias = client.get({"alias": Alias("alias", "source")}, "alias", sync=False)
        await wait(alias)
        out["alias_read_back"] = _read_back(store) - before
        out["alias_where"] = store.where("alias")
        out["nbytes"] = scheduler.tasks["alias"].nbytes, scheduler.tasks["source"].nbytes
        out["one_entry"] = store.peek_host_copy("alias") is store.peek_host_copy("source")
        out["used"] = await client.submit(check, alias, 7)
        out["used_read_back"] = _read_back(store) - before
        out["gathered"] = bool(((await alias).get() == 7).all())
        del alias, others, source
        while len(store):
            await asyncio.sleep(0.01)
    return out


@pytest.mark.timeout(90)
def test_an_alias_of_a_spilled_key_is_linked_not_read() -> None:
    linked = asyncio.run(_alias_of_spilled(GPUWorker))
    assert linked["alias_read_back"] == 0 and linked["alias_where"] == "host"
    assert linked["nbytes"][0] == linked["nbytes"][1] > 0  # the source's size
    assert linked["one_entry"] is True  # the alias names the source's entry
    assert linked["used"] is True and linked["gathered"] is True
    assert linked["used_read_back"] == 1000  # read back once, by the task that used it


@pytest.mark.timeout(90)
def test_distributed_worker_reads_the_key_back_for_the_alias() -> None:
    plain = asyncio.run(_alias_of_spilled(Worker))
    assert plain["alias_read_back"] == 1000 and plain["alias_where"] == "device"
    assert plain["used"] is True and plain["gathered"] is True


@pytest.mark.timeout(60)
def test_an_alias_of_a_key_on_the_device_runs_as_usual() -> None:
    async def main() -> None:
        async with _cluster(GPUWorker, 10**5) as (client, store, _, _):
            source = client.submit(make_chunk, 3, key="source")
            await wait(source)
            alias = client.get({"alias": Alias("alias", "source")}, "alias", sync=False)
            await wait(alias)
            assert store.where("alias") == "device" and store["alias"] is store["source"]
            assert store.device_bytes == 1000  # one entry for both keys
            assert await client.submit(check, alias, 3)

    asyncio.run(main())


class _HeldLinkWorker(GPUWorker):
    """Holds back the result of the linked alias `alias` until `go` is set: the keys
    can be freed between the link's check and distributed storing the result."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checked, self.go = asyncio.Event(), asyncio.Event()

    async def execute(self, key: Any, *, stimulus_id: str) -> Any:
        event = await super().execute(key, stimulus_id=stimulus_id)
        if key == "alias":
            self.linked = event.value if isinstance(event, ExecuteSuccessEvent) else None
            self.checked.set()
            await self.go.wait()
        return event


@pytest.mark.timeout(120)
@pytest.mark.parametrize("free_source", [False, True])
def test_keys_freed_while_a_link_is_on_its_way(free_source: bool) -> None:
    """The alias cancelled (and its source released) after the worker chose to link it
    but before distributed stored the result: the worker's state stays valid
    (`validate`), nothing is stored for the alias, and the other keys read right."""

    async def main() -> None:
        async with _cluster(_HeldLinkWorker, 3000) as (client, store, scheduler, worker):
            assert isinstance(worker, _HeldLinkWorker)
            source = client.submit(make_chunk, 7, key="source")
            await wait(source)
            others = client.map(make_chunk, range(1, 5), key=[f"other-{i}" for i in range(4)])
            await wait(others)
            assert store.where("source") == "host"
            alias = client.get({"alias": Alias("alias", "source")}, "alias", sync=False)
            await asyncio.wait_for(worker.checked.wait(), 60)
            assert isinstance(worker.linked, Linked) and worker.linked.target == "source"
            await client.cancel([alias, source] if free_source else [alias])
            await async_poll_for(lambda: "alias" not in scheduler.tasks, timeout=60)
            await async_poll_for(
                lambda: worker.state.tasks["alias"].state == "cancelled", timeout=60
            )
            if free_source:
                await async_poll_for(lambda: "source" not in store, timeout=60)
            worker.go.set()
            await async_poll_for(lambda: "alias" not in worker.state.tasks, timeout=60)
            await async_poll_for(lambda: ("source" in store) != free_source, timeout=60)
            assert "alias" not in store
            assert all(
                await client.gather([client.submit(check, f, i + 1) for i, f in enumerate(others)])
            )
            if not free_source:
                assert await client.submit(check, source, 7)
            assert worker.status == Status.running

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_a_resumed_alias_whose_source_left_still_gets_its_value() -> None:
    """The alias cancelled once linked, its source freed on this worker and computed on
    another, then the alias asked for again here: distributed resumes the task that was
    running, so the link meets a source the store no longer has. The store refuses the
    write, the worker reports the stale run as erred, the scheduler runs the alias again
    (the source fetched from the other worker) and the client gets the value."""

    async def main() -> None:
        async with (
            _cluster(_HeldLinkWorker, 3000) as (client, store, scheduler, a),
            Worker(scheduler.address, nthreads=1, dashboard_address=":0", validate=True) as b,
        ):
            assert isinstance(a, _HeldLinkWorker)
            source = client.submit(make_chunk, 7, key="source", workers=[a.address])
            await wait(source)
            others = client.map(
                make_chunk, range(1, 5), key=[f"other-{i}" for i in range(4)], workers=[a.address]
            )
            await wait(others)
            assert store.where("source") == "host"
            alias = client.get(
                {"alias": Alias("alias", "source")}, "alias", sync=False, workers=[a.address]
            )
            await asyncio.wait_for(a.checked.wait(), 60)
            assert isinstance(a.linked, Linked) and a.linked.target == "source"
            await client.cancel([alias, source])
            await async_poll_for(lambda: a.state.tasks["alias"].state == "cancelled", timeout=60)
            await async_poll_for(lambda: "source" not in store, timeout=60)
            source = client.submit(make_chunk, 7, key="source", workers=[b.address])
            await wait(source)
            alias = client.get(
                {"alias": Alias("alias", "source")}, "alias", sync=False, workers=[a.address]
            )
            await async_poll_for(lambda: a.state.tasks["alias"].state == "executing", timeout=60)
            assert "source" not in store
            a.go.set()
            assert await client.submit(check, alias, 7, workers=[a.address])
            assert check(await alias, 7)
            assert a.status == Status.running
            story = [e[1:3] for e in a.state.story("alias") if e[1:2] == ("executing",)]
            assert ("executing", "error") in story  # the race happened: the link was refused

    asyncio.run(main())
