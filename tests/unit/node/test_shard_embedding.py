"""An embedding session through real shards (``worker_shards``): refused with a typed error, and
freed on every shard, where the tail's engine returns no final-norm rows.

``FakeBackend`` is such an engine (it returns logits only, as an expert-parallel MoE tail does):
it stands in for the case "this swarm cannot embed". That a real llama.cpp tail pools its rows
to whole-model llama.cpp's vector is shown over real workers (tests/integration/test_swarm_embeddings.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from worker_shards import Route, opening, start_route

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import InvalidArgument
from meshnet.wire.frames import Continuation

THREE = ((0, 2), (2, 4), (4, 6))


@pytest.fixture
async def route() -> AsyncIterator[Route]:
    started = await start_route(THREE)
    yield started
    await started.close()


async def test_a_tail_without_final_norm_rows_refuses_to_embed_and_frees_the_session(route: Route) -> None:
    frame = replace(opening(route, "s-embed", (3, 1, 4, 1)), sampling=None, embedding=EmbeddingSpec())
    with pytest.raises(InvalidArgument, match="cannot embed"):
        await route.head.handle(frame, None)
    assert [s.open_sessions for s in route.shards] == [0, 0, 0]


async def test_without_an_embedding_the_tail_still_needs_sampling_parameters(route: Route) -> None:
    frame = replace(opening(route, "s-none", (3, 1, 4, 1)), sampling=None)
    with pytest.raises(InvalidArgument, match="sampling parameters"):
        await route.head.handle(frame, None)


def test_an_embedding_session_is_never_decoded_on(route: Route) -> None:
    decoding = opening(route, "s-c", (3, 1), continuation=Continuation(4, frozenset()))
    with pytest.raises(InvalidArgument, match="nothing is decoded after"):
        replace(decoding, embedding=EmbeddingSpec())
