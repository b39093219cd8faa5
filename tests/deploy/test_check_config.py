"""distributed's own settings against distributed's schema (cudask.deploy.check_config),
beside jsonschema's reading of the same schema: both accept every default; both refuse
values of the wrong type or out of bounds; cudask also takes what distributed reads
although the schema's types do not say so (a duration as seconds, one preload as a
string), and knows the keys of sections the schema leaves out."""

from __future__ import annotations

from typing import Any

import dask.config
import jsonschema
import pytest

from cudask.deploy import check_config
from cudask.errors import OptionError


def _node(key: str) -> dict[str, Any]:
    schema, _ = check_config._files()
    node = schema
    for part in key.split(".")[1:]:
        node = node["properties"][part]
    return node


def _leaves(node: dict[str, Any], defaults: Any, key: str) -> list[tuple[str, Any]]:
    if "properties" not in node:
        return [(key, defaults)]
    return [
        leaf
        for name, child in node["properties"].items()
        if name in defaults
        for leaf in _leaves(child, defaults[name], f"{key}.{name}")
    ]


def test_every_default_is_accepted_by_both() -> None:
    schema, defaults = check_config._files()
    leaves = _leaves(schema, defaults, "distributed")
    assert len(leaves) > 100, len(leaves)  # the loop below checks something
    for key, value in leaves:
        node = _node(key)
        assert check_config._accepts(node, value, check_config._kind(key, value)), (key, value)
        assert jsonschema.Draft7Validator(node).is_valid(value), (key, value)


REFUSED = [
    ("distributed.worker.memory.target", 1.5),
    ("distributed.worker.memory.target", True),
    ("distributed.worker.memory.terminate", 0),
    ("distributed.worker.daemon", "maybe"),
    ("distributed.worker.connections.outgoing", "many"),
    ("distributed.comm.retry.count", -1),
    ("distributed.comm.compression", "zipzap"),
    ("distributed.worker.memory.spill-compression", "gzip"),
    ("distributed.worker.multiprocessing-method", "threads"),
    ("distributed.scheduler.active-memory-manager.measure", "all"),
]


@pytest.mark.parametrize("key, value", REFUSED)
def test_refused_by_both(key: str, value: Any) -> None:
    node = _node(key)
    assert not jsonschema.Draft7Validator(node).is_valid(value)
    with dask.config.set({key: value}), pytest.raises(OptionError) as info:
        check_config.check_distributed_config()
    message = str(info.value)
    assert message.startswith(f"{key}={value!r} is not accepted; accepted: "), message
    assert "\n" not in message and info.value.origin == f"config key {key}"


TAKEN = [
    ("distributed.comm.timeouts.connect", 60),  # a number of seconds (the schema: a string)
    ("distributed.comm.timeouts.connect", "2 minutes"),
    ("distributed.worker.preload", "my_module"),  # distributed takes one as a string
    ("distributed.worker.memory.max-spill", "10GB"),
    ("distributed.worker.memory.target", False),
    ("distributed.comm.ucx.infiniband", True),  # read by distributed-ucxx (and set by cudask)
    ("distributed.logging.distributed", "debug"),  # distributed's logging config
    ("distributed.nanny.environ", {"OMP_NUM_THREADS": 1}),  # free-form in the schema
    ("distributed.worker.lifetime.duration", "1 hour"),
]


@pytest.mark.parametrize("key, value", TAKEN)
def test_what_distributed_reads_is_taken(key: str, value: Any) -> None:
    with dask.config.set({key: value}):
        check_config.check_distributed_config()


@pytest.mark.parametrize(
    "key, value",
    [
        ("distributed.worker.memory.max-spill", "lots"),
        ("distributed.worker.lifetime.duration", "soon"),
        ("distributed.comm.timeouts.tcp", "sometime"),
        ("distributed.comm.timeouts.connect", -5),
    ],
)
def test_durations_and_sizes_are_read_as_distributed_reads_them(key: str, value: Any) -> None:
    """What the schema types as a string (or leaves null) is a duration or a size, as
    the default (or cudask's list) says: a word that is neither is refused."""
    with (
        dask.config.set({key: value}),
        pytest.raises(OptionError, match="accepted: a (duration|size) such as"),
    ):
        check_config.check_distributed_config()


def test_unknown_key_names_the_closest() -> None:
    with (
        dask.config.set({"distributed.scheduler.worker-tll": "5 minutes"}),
        pytest.raises(
            OptionError,
            match="unknown config key distributed.scheduler.worker-tll; "
            "did you mean distributed.scheduler.worker-ttl?",
        ),
    ):
        check_config.check_distributed_config()


def test_a_key_under_a_value_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__DAEMON__WHEN", "always")
    with pytest.raises(OptionError, match="unknown config key distributed.worker.daemon.when"):
        check_config.check_distributed_config()


def test_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "soon")
    with pytest.raises(OptionError) as info:
        check_config.check_distributed_config()
    assert info.value.origin == "environment variable DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"
    assert str(info.value).startswith(f"{info.value.origin}: distributed.comm.timeouts.connect=")
