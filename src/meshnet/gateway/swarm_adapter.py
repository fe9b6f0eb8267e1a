"""Wire the swarm client to the gateway's ports: models come from the tracker, text from codecs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshnet.artifact.describe import ModelDescription
from meshnet.core.embedding import Embedded, EmbeddingSpec
from meshnet.core.generation import GenerationRequest
from meshnet.core.ids import RequestId
from meshnet.core.swarm_status import NodeTable
from meshnet.gateway.ports import ModelCard, TextCodec
from meshnet.route.life import LifeSink, TextPlug
from meshnet.route.swarm import SwarmClient

SLOTS_TIMEOUT_S = 2.0


class SwarmGenerator:
    """A ``RouteGenerator`` over the live swarm, serving the models we hold a codec for."""

    def __init__(
        self, client: SwarmClient, codecs: Mapping[str, TextCodec], models: Mapping[str, ModelDescription]
    ) -> None:
        self._client = client
        self._cards = tuple(
            ModelCard(
                id=name,
                quantization=models[name].quantization,
                context_length=codec.context_length,
                adapter=f"{models[name].architecture}:{models[name].adapter_version}",
            )
            for name, codec in codecs.items()
        )

    def models(self) -> Sequence[ModelCard]:
        return self._cards

    async def session_slots(self) -> int | None:
        names = {card.id for card in self._cards}
        models = await self._client.tracker.list_models(timeout_s=SLOTS_TIMEOUT_S)
        slots = sum(model.head_sessions for model in models if model.name in names)
        return slots or None

    async def node_table(self) -> NodeTable:
        return await self._client.tracker.list_nodes(timeout_s=SLOTS_TIMEOUT_S)

    async def route_context(self, model: str) -> int | None:
        return await self._client.route_context(model)

    async def serve(self, request: GenerationRequest, request_id: RequestId, text: TextPlug, sink: LifeSink) -> None:
        await self._client.serve(request, request_id, text, sink)

    async def embed(self, request: GenerationRequest, spec: EmbeddingSpec, request_id: RequestId) -> Embedded:
        return await self._client.embed(request, spec, request_id)
