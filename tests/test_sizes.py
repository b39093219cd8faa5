from __future__ import annotations

import pytest

from cudask.errors import OptionError
from cudask.sizes import parse_size

GB = 10**9


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        (0, None),
        (0.0, None),
        ("0", None),
        ("0 MiB", None),
        ("", None),
        (1000, 1000),
        ("1GB", GB),
        ("512MiB", 512 << 20),
        (0.5, 50 * GB),
        ("0.5", 50 * GB),
        (1.0, 100 * GB),
        ("auto", 100 * GB),
        ("default", 80 * GB),
        ("AUTO", 100 * GB),
        ("1000", 1000),
    ],
)
def test_parse_size(value, expected):
    assert parse_size(value, total=100 * GB, name="limit") == expected


def test_auto_default_meanings_are_the_callers():
    assert parse_size("default", total=100, name="x", default=None) is None
    assert parse_size("auto", total=100, name="x", auto="40B") == 40


@pytest.mark.parametrize("value", ["lots", "12 parsecs", -5, 1.5, True, [1]])
def test_bad_sizes_name_value_and_accepted(value):
    with pytest.raises(OptionError) as err:
        parse_size(value, total=100, name="device_memory_limit")
    assert "device_memory_limit" in str(err.value)
    assert repr(value) in str(err.value)


def test_fraction_without_total():
    with pytest.raises(OptionError, match="total it refers to is unknown"):
        parse_size(0.5, total=None, name="x")


def test_maximum_and_alignment():
    with pytest.raises(OptionError, match="more than"):
        parse_size("2GB", total=GB, name="x", maximum=GB)
    assert parse_size(1000, total=None, name="x", alignment=256) == 768
