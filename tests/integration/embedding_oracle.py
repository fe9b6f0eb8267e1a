"""The whole-model oracle of the embedding tests: llama-cpp-python's own last-token embeddings,
run as the workers run a prompt (their context, prefill chunk and flash attention)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
from swarm_harness import CONTEXT

from meshnet.node.config import WorkerConfig


def embedding_oracle(model: Path) -> llama_cpp.Llama:
    """``Llama(embedding=True, pooling_type=LAST)`` on ``model``; the caller closes it."""
    return llama_cpp.Llama(
        str(model),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_LAST,
        n_ctx=CONTEXT,
        n_batch=CONTEXT,
        n_ubatch=WorkerConfig.prefill_chunk,  # the workers' chunking of a prompt
        n_threads=1,
        flash_attn=True,  # as the workers run (LlamaConfig.flash_attn); without it 3e-3 apart
        verbose=False,
    )
