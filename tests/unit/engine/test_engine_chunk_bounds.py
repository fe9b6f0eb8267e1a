"""Prefill chunking: cuts fall on absolute multiples of the chunk size, so every route (whole or
split, one frame or several aligned ones) shows the kernels the same row counts."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from meshnet.engine.backend import chunk_bounds


@settings(max_examples=300, derandomize=True)
@given(position=st.integers(0, 5000), n_tokens=st.integers(1, 3000), chunk=st.integers(1, 600))
def test_chunks_cover_the_input_and_cut_on_absolute_multiples(position: int, n_tokens: int, chunk: int) -> None:
    bounds = chunk_bounds(position, n_tokens, chunk)
    assert bounds[0][0] == 0 and bounds[-1][1] == n_tokens
    assert all(start < stop for start, stop in bounds)
    assert all(previous[1] == following[0] for previous, following in itertools.pairwise(bounds))
    assert all(stop - start <= chunk for start, stop in bounds)
    assert all((position + start) % chunk == 0 for start, _ in bounds[1:])


def test_examples() -> None:
    assert chunk_bounds(0, 100, 32) == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert chunk_bounds(50, 50, 32) == [(0, 14), (14, 46), (46, 50)]
    assert chunk_bounds(7, 1, 32) == [(0, 1)]
    assert chunk_bounds(31, 2, 32) == [(0, 1), (1, 2)]
