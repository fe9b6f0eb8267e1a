"""``bit_identical`` compares bits, not values: the claim every certification and parity test makes."""

from __future__ import annotations

import numpy as np

from meshnet.engine.bitwise import bit_identical, describe_difference


def test_equal_arrays_are_bit_identical_whatever_their_strides() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert bit_identical(a, a.copy())
    assert bit_identical(a.T, np.ascontiguousarray(a.T))  # a strided view compares by content


def test_signed_zeros_are_told_apart() -> None:
    positive, negative = np.zeros(4, np.float32), np.zeros(4, np.float32)
    negative[2] = -0.0
    assert np.array_equal(positive, negative)  # a value comparison calls them equal
    assert not bit_identical(positive, negative)
    assert "no finite value" in describe_difference(positive, negative)


def test_nan_payloads_are_told_apart_and_the_same_nan_matches() -> None:
    quiet = np.array([1.0, np.nan], np.float32)
    assert not np.array_equal(quiet, quiet.copy())  # values: NaN is never equal to itself
    assert bit_identical(quiet, quiet.copy())  # bits: the same NaN is the same
    other = quiet.copy()
    other.view(np.uint32)[1] = 0x7FC00001  # another quiet NaN, another payload
    assert np.isnan(other[1]) and not bit_identical(quiet, other)


def test_dtype_and_shape_are_part_of_the_bits() -> None:
    a = np.zeros(4, np.float32)
    assert not bit_identical(a, a.view(np.int32))  # same bytes, another dtype
    assert not bit_identical(a, a.reshape(2, 2))  # same bytes, another shape
    assert "float32[2, 2]" in describe_difference(a, a.reshape(2, 2))


def test_a_real_difference_is_described_by_its_size() -> None:
    a = np.zeros(3, np.float32)
    b = a.copy()
    b[1] = 0.25
    assert not bit_identical(a, b)
    assert describe_difference(a, b) == "2 byte(s) differ, values by up to 0.25"
