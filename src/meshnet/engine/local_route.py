"""An in-process chain of shard backends: the reference route for tests, `generate` and benches.

It moves the same boundary tensors a distributed route moves, only without the network, so it
isolates what splitting costs from what the transport costs. It chooses tokens with the tail's
own ``TailSampler`` (logit_bias, penalties, grammar, logprobs, the seeded draw), so as the
oracle of a swarm it samples exactly as the swarm's tail does.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence

import numpy as np

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import InvalidArgument
from meshnet.core.generation import GenerationRequest, SamplingParams
from meshnet.core.sampling_options import TokenLogprobs
from meshnet.engine.backend import Backend, StepInput, StepOutput
from meshnet.engine.constraints import GrammarVocabulary
from meshnet.engine.pooling import pool
from meshnet.engine.tail_sampler import TailSampler


class LocalRoute:
    def __init__(self, backends: Sequence[Backend], grammars: GrammarVocabulary | None = None) -> None:
        """``grammars``: the model's vocabulary for requests with a grammar (response_format);
        without it such a request is refused, as a tail without a vocabulary refuses it."""
        if not backends:
            raise InvalidArgument("a route needs at least one shard")
        stops = [b.shape.layers.start for b in backends[1:]]
        if backends[0].shape.layers.start != 0 or [b.shape.layers.stop for b in backends[:-1]] != stops:
            raise InvalidArgument("shards must be contiguous and start at layer 0")
        if backends[-1].shape.layers.stop != backends[-1].shape.n_layers:
            raise InvalidArgument("the last shard must end at the model's last layer")
        self.backends = list(backends)
        self._grammars = grammars

    def forward(self, slot: int, position: int, tokens: np.ndarray, want_logits: str = "last") -> np.ndarray:
        """Run ``tokens`` at ``position`` through every shard; returns the tail's logits."""
        return self._through(slot, position, tokens, want_logits).logits  # type: ignore[return-value]

    def embed(self, tokens: Sequence[int], spec: EmbeddingSpec, slot: int = 0) -> np.ndarray:
        """The pooled embedding of ``tokens`` (a prefill only; the slot's KV is released after).

        Every row is an output row, as in llama.cpp's embedding contexts: the tail then runs its
        last layer over all rows, the graph ``embed`` of whole-model llama.cpp computes."""
        try:
            output = self._through(slot, 0, np.asarray(tokens, np.int32), "all", read_logits=False)
            return pool(output.normed, spec)
        finally:
            self.release(slot)

    def _through(
        self, slot: int, position: int, tokens: np.ndarray, want_logits: str, *, read_logits: bool = True
    ) -> StepOutput:
        hidden: np.ndarray | None = None
        for backend in self.backends[:-1]:
            step = (
                StepInput(slot, position, tokens=tokens) if hidden is None else StepInput(slot, position, hidden=hidden)
            )
            hidden = backend.run([step])[0].hidden
        tail = self.backends[-1]
        last = (
            StepInput(slot, position, tokens, None, want_logits, read_logits)  # type: ignore[arg-type]
            if hidden is None
            else StepInput(slot, position, None, hidden, want_logits, read_logits)  # type: ignore[arg-type]
        )
        return tail.run([last])[0]

    def release(self, slot: int) -> None:
        for backend in self.backends:
            backend.truncate(slot, 0)

    def generate(
        self, request: GenerationRequest, slot: int = 0, on_logits: Callable[[np.ndarray], None] | None = None
    ) -> Iterator[int]:
        """Yield sampled tokens until a stop token or ``max_tokens``; frees the slot at the end."""
        choices = self.choices(request, slot, on_logits)
        try:
            for token, _ in choices:
                yield token
        finally:
            choices.close()

    def choices(
        self, request: GenerationRequest, slot: int = 0, on_logits: Callable[[np.ndarray], None] | None = None
    ) -> Generator[tuple[int, TokenLogprobs | None], None, None]:
        """Yield each token with its logprobs (None unless the request asks for them) until a stop
        token or ``max_tokens``; ``on_logits`` sees the model's logits before any adjustment."""
        sampler = self._sampler(request.sampling)
        try:
            prompt = np.asarray(request.prompt_tokens, dtype=np.int32)
            logits = self.forward(slot, 0, prompt)[-1]
            position = len(prompt)
            for index in range(request.max_tokens):
                if on_logits is not None:
                    on_logits(logits)
                # Seeded by the position the token will take, as the distributed tail does.
                token, logprobs = sampler.choose(logits, position)
                yield token, logprobs
                if token in request.stop_tokens or index + 1 == request.max_tokens:
                    return
                logits = self.forward(slot, position, np.array([token], np.int32))[-1]
                position += 1
        finally:
            sampler.close()
            self.release(slot)

    def _sampler(self, params: SamplingParams) -> TailSampler:
        if params.constraint is None:
            return TailSampler(params)
        if self._grammars is None:
            raise InvalidArgument("this route has no vocabulary to apply a grammar with (response_format)")
        return TailSampler(params, self._grammars.matcher(params.constraint))

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
