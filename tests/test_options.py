from __future__ import annotations

import dask.config
import pytest

from cudask import options
from cudask.errors import MissingDependencyError, OptionError
from cudask.options import OPTIONS, resolve


def test_every_configured_option_has_a_config_key_and_back():
    keys = {o.config for o in OPTIONS if o.config}
    assert keys == set(dask.config.get("cudask.worker"))


def test_defaults_come_from_config():
    with dask.config.set(
        {"cudask.worker.device-memory-limit": "10GB", "cudask.worker.threads-per-worker": 4}
    ):
        o = resolve({}, "cluster")
    assert o.device_memory_limit == "10GB" and o.nthreads == 4


def test_cluster_keyword_names_and_node_only_options():
    o = resolve({"threads_per_worker": 2}, "cluster")
    assert o.nthreads == 2
    with pytest.raises(OptionError, match="unknown option"):
        resolve({"nthreads": 2}, "cluster")
    with pytest.raises(OptionError, match="unknown option"):
        resolve({"scheduler_file": "x"}, "cluster")
    assert resolve({"scheduler_file": "x"}, "worker").scheduler_file == "x"


@pytest.mark.parametrize(
    "values, match",
    [
        ({"rmm_async": True, "rmm_managed_memory": True}, "cannot be combined"),
        ({"rmm_release_threshold": "1GB"}, "needs rmm_async"),
        ({"rmm_maximum_pool_size": "2GB"}, "needs rmm_pool_size"),
        ({"enable_nvlink": True, "rmm_managed_memory": True}, "CUDA IPC"),
        ({"enable_rdmacm": True}, "needs enable_infiniband"),
        ({"jit_unspill": True, "enable_cudf_spill": True}, "choose one spilling"),
        ({"enable_infiniband": True, "protocol": "tcp"}, "needs protocol='ucx'"),
        ({"threads_per_worker": 0}, "at least 1"),
        ({"threads_per_worker": "many"}, "not an integer"),
        ({"rmm_allocator_external_lib_list": "cupy,tensorflow"}, "'tensorflow' not accepted"),
        ({"rmm_async": "perhaps"}, "true or false"),
    ],
)
def test_rules(values, match):
    with pytest.raises(OptionError, match=match):
        resolve(values, "cluster")


def test_ucx_transport_implies_protocol(monkeypatch):
    monkeypatch.setattr(options, "_library", lambda m: True)
    assert resolve({"enable_nvlink": True}, "cluster").protocol == "ucx"


@pytest.mark.parametrize(
    "values, library",
    [
        ({"rmm_pool_size": "1GB"}, "rmm"),
        ({"enable_cudf_spill": True}, "cudf"),
        ({"protocol": "ucx"}, "distributed_ucxx"),
        ({"pre_import": "surely_not_a_module_xyz"}, "surely_not_a_module_xyz"),
    ],
)
def test_missing_optional_library_is_named(monkeypatch, values, library):
    real = options._library
    monkeypatch.setattr(options, "_library", lambda m: False if m == library else real(m))
    with pytest.raises(MissingDependencyError) as err:
        resolve(values, "cluster")
    assert (
        library in str(err.value) and "pip install" in str(err.value) or "install" in str(err.value)
    )


def test_lists_accept_strings_and_lists(monkeypatch):
    monkeypatch.setattr(options, "_library", lambda m: True)
    assert resolve({"pre_import": "os, json"}, "cluster").pre_import == ["os", "json"]
    assert resolve({"pre_import": ["os", "json,sys"]}, "cluster").pre_import == [
        "os",
        "json",
        "sys",
    ]


def test_reference_lists_every_option():
    text = options.reference()
    assert len(OPTIONS) >= 40  # the loop below checks something
    for o in OPTIONS:
        assert o.cli_flag in text


def test_docs_options_md_is_current():
    import pathlib

    doc = pathlib.Path(__file__).parent.parent / "docs" / "options.md"
    assert doc.read_text() == options.reference(), (
        "regenerate: cudask options --markdown > docs/options.md"
    )


def test_paths_accept_pathlike_and_refuse_others(tmp_path):
    o = resolve({"local_directory": tmp_path}, "cluster")
    assert o.local_directory == str(tmp_path)
    with pytest.raises(OptionError, match="is not a path"):
        resolve({"local_directory": 5}, "cluster")
    assert resolve({"resources": {"GPU": 1}}, "worker").resources == {"GPU": 1}


def test_none_means_the_default_for_counts_choices_and_booleans():
    o = options.resolve({"threads_per_worker": None, "log_spilling": None}, "cluster")
    assert o.nthreads == 1 and o.log_spilling is False
    w = options.resolve(
        {"nthreads": None, "multiprocessing_method": None, "device_memory_limit": None}, "worker"
    )
    assert w.nthreads == 1 and w.multiprocessing_method == "spawn"
    assert w.device_memory_limit is None  # a size: None is "off"


@pytest.mark.parametrize(
    "word, meaning",
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("true", True),
        ("False", False),
        ("yes", True),
        ("NO", False),
        ("on", True),
        ("Off", False),
        ("1", True),
        ("0", False),
    ],
)
def test_one_boolean_rule_for_options_and_config_keys(word, meaning):
    """Keywords, flags and every config key read the same words as booleans."""
    from cudask.memory.settings import parse_flag

    assert resolve({"jit_unspill": word}, "cluster").jit_unspill is meaning
    assert parse_flag(word, "cudask.memory.background-spill") is meaning
    with dask.config.set({"cudask.worker.log-spilling": word}):
        assert resolve({}, "cluster").log_spilling is meaning


@pytest.mark.parametrize("word", ["maybe", 2, "", None, 0.5])
def test_the_boolean_rule_is_in_the_message(word):
    from cudask.memory.settings import parse_flag

    for check in (
        lambda: resolve({"rmm_async": word if word is not None else "none"}, "cluster"),
        lambda: parse_flag(word, "cudask.memory.background-spill"),
    ):
        with pytest.raises(OptionError, match="true or false .also True/False, yes/no, on/off"):
            check()
