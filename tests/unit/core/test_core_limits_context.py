"""The context a session gets: what a worker refuses, and what ``up`` gives by default."""

from __future__ import annotations

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.limits import MAX_CONTEXT, UP_CONTEXT, served_context, up_context


def test_up_gives_the_trained_length_up_to_its_default_cap() -> None:
    assert up_context(4_096) == 4_096
    assert up_context(8_192) == 8_192
    assert up_context(32_768) == UP_CONTEXT  # Gemma 3 270M: 8,192 unless asked
    assert up_context(32_768, 32_768) == 32_768


def test_an_asked_context_is_checked_as_a_worker_checks_it() -> None:
    with pytest.raises(InvalidArgument, match="1 to 4096"):
        up_context(4_096, 8_192)
    assert served_context(1_000_000) == MAX_CONTEXT
    with pytest.raises(InvalidArgument):
        served_context(2_048, 0)
