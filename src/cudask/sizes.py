"""Byte sizes: parsing user values into bytes, per device or per host.

Covers: "auto", "default", fractions (0 < x <= 1 of a total), byte strings
("40GB", "512 MiB"), plain integers, and 0/None/"0" meaning "off" (`is_off`). The
meaning of "auto" and "default" is passed in by the caller, because it differs
between device memory (dask-cuda: "default" is 80% of a device with dedicated
memory, off on SoC parts) and host memory ("auto" is the system share).

Does not cover: discovering totals (cudask.devices does that).

Threading: pure functions; call them from any thread.
"""

from __future__ import annotations

import math

from dask.utils import format_bytes, parse_bytes

from cudask.errors import OptionError

SizeValue = int | float | str | None

ACCEPTED = (
    'an integer number of bytes, a byte string such as "40GB" or "512MiB", '
    'a fraction of the total between 0 and 1 such as 0.8, "auto", "default", '
    "or 0/None for off"
)


#: What a size with no total to refer to accepts (no fractions, so no "auto").
ACCEPTED_BYTES = (
    'an integer number of bytes or a byte string such as "256MiB" or "1GB", or 0/None for off'
)

_OFF_WORDS = ("", "0", "none", "off", "false")


def parse_size(
    value: SizeValue,
    *,
    total: int | None,
    name: str,
    auto: SizeValue = 1.0,
    default: SizeValue = 0.8,
    maximum: int | None = None,
    alignment: int = 1,
) -> int | None:
    """Parse `value` into bytes, or None when it means "off".

    `total` is the size fractions refer to (None when unknown: fractions are
    then refused). `auto` and `default` give what those words stand for
    (themselves sizes; None means off). `maximum` refuses larger results, and
    `alignment` rounds the result down to a multiple of it.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "default"):
            meaning = auto if text == "auto" else default
            if total is None and isinstance(meaning, float):
                raise OptionError(
                    f"{name}={value!r} is not accepted: {text!r} stands for a "
                    "fraction of a total, and this size has none; accepted: "
                    f"{ACCEPTED_BYTES}"
                )
            return parse_size(
                auto if text == "auto" else default,
                total=total,
                name=name,
                auto=None,
                default=None,
                maximum=maximum,
                alignment=alignment,
            )
        if text in _OFF_WORDS:
            return None
        number = _number(text)
        if number is not None:
            return parse_size(
                _number_in_text(value, number, name),
                total=total,
                name=name,
                maximum=maximum,
                alignment=alignment,
            )
        nbytes = _byte_string(value, name, total)
    else:
        nbytes = _nbytes(value, total, name)
    return _bounded(value, nbytes, name, maximum, alignment)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _number_in_text(value: str, number: float, name: str) -> int | float:
    """A number given as text ("0.5", "1000"): a fraction up to 1, else whole bytes."""
    if not math.isfinite(number):
        raise OptionError(f"{name}={value!r} is not a number of bytes; accepted: {ACCEPTED}")
    if number < 0:
        raise OptionError(f"{name}={value!r} is negative; accepted: {ACCEPTED}")
    if number > 1 and not number.is_integer():
        raise OptionError(
            f"{name}={value!r}: a fraction must lie in (0, 1]; for a byte count give "
            'a whole number or a byte string such as "40GB"'
        )
    return int(number) if number.is_integer() and number > 1 else number


def _byte_string(value: str, name: str, total: int | None) -> int:
    """A byte string such as "40GB" or "512 MiB"."""
    try:
        nbytes = parse_bytes(value)
    except (ValueError, TypeError):
        accepted = ACCEPTED if total is not None else ACCEPTED_BYTES
        raise OptionError(f"{name}={value!r} is not a size; accepted: {accepted}") from None
    if nbytes < 0:
        raise OptionError(f"{name}={value!r} is negative; accepted: {ACCEPTED}")
    return nbytes


def _nbytes(value: object, total: int | None, name: str) -> int:
    """Bytes of a value that is not text (0: off)."""
    if value is None or value is False:
        return 0
    if isinstance(value, bool):
        raise OptionError(f"{name}={value!r} is not a size; accepted: {ACCEPTED}")
    if isinstance(value, float):
        if value == 0:
            return 0
        if not math.isfinite(value):
            raise OptionError(f"{name}={value!r} is not a number of bytes; accepted: {ACCEPTED}")
        if value < 0:
            raise OptionError(f"{name}={value!r} is negative; accepted: {ACCEPTED}")
        if not 0 < value <= 1:
            example = (
                f'{int(value)} or "{format_bytes(int(value))}"' if value.is_integer() else '"40GB"'
            )
            raise OptionError(
                f"{name}={value!r}: a fraction must lie in (0, 1]; for a byte count "
                f"give an integer or a byte string, e.g. {example}"
            )
        if total is None:
            raise OptionError(
                f"{name}={value!r} is a fraction, but the total it refers to is unknown; "
                'give a byte size such as "16GB"'
            )
        return int(total * value)
    if isinstance(value, int):
        if value < 0:
            raise OptionError(f"{name}={value!r} is negative; accepted: {ACCEPTED}")
        return value
    raise OptionError(f"{name}={value!r} is not a size; accepted: {ACCEPTED}")


def _bounded(
    value: SizeValue, nbytes: int, name: str, maximum: int | None, alignment: int
) -> int | None:
    """`nbytes` checked against `maximum` and rounded down to `alignment` (None: off)."""
    if nbytes <= 0:
        return None
    if maximum is not None and nbytes > maximum:
        raise OptionError(
            f"{name}={value!r} is {format_bytes(nbytes)}, more than the "
            f"{format_bytes(maximum)} available; give at most {format_bytes(maximum)} "
            "or a fraction such as 0.8"
        )
    if alignment > 1:
        nbytes -= nbytes % alignment
    return nbytes


def is_off(value: object) -> bool:
    """Whether a size means "off": None, False, 0, or "0"/"none"/"off"/"false" as text."""
    if value is None or value is False:
        return True
    if isinstance(value, str):
        return value.strip().lower() in _OFF_WORDS[1:]
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0


def check_size(value: SizeValue, *, name: str) -> None:
    """Check the form of a size without knowing the total it refers to: "banana",
    negative numbers and fractions above 1 are refused here; whether the size fits
    a given device is parse_size's business once the device is known."""
    parse_size(value, total=1 << 60, name=name)


__all__ = [
    "ACCEPTED",
    "ACCEPTED_BYTES",
    "SizeValue",
    "check_size",
    "format_bytes",
    "is_off",
    "parse_size",
]
