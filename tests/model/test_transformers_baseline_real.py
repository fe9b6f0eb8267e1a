"""The design documents' baseline on the real SmolLM2 GGUF through transformers' GGUF support:
the distributed PyTorch route (stages, use_cache=False, the whole sequence per token) chooses the
same greedy tokens as transformers' own KV-cached decode (the same float32 numerics, so this is
asserted), and its seam traffic is the documents' full activation per token.

Needs the ``baseline`` extra (``make baseline``: run with .venv-baseline) besides the model tests'
MESHNET_ENABLE_REAL_INFERENCE_TESTS=1; skipped with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from smollm2_model import MARKS, MODEL

from meshnet.bench.torch_baseline import BaselineModel, BaselineUnavailable
from meshnet.core.layers import split_evenly

pytestmark = MARKS
PROMPT = (1, 504, 3458, 282, 4195, 314, 253, 1789, 28, 2375, 5923, 30, 198, 504, 1345, 314)
TOKENS = 3
N_EMBD = 576  # SmolLM2-135M's hidden size: an independent fact, not read from the model


@pytest.fixture(scope="module")
def model() -> Iterator[BaselineModel]:
    try:
        loaded = BaselineModel(MODEL, threads=1)
    except BaselineUnavailable as error:
        pytest.skip(error.message)
    yield loaded
    loaded.close()


@pytest.mark.parametrize("stages", [2, 3])
def test_recompute_route_chooses_transformers_whole_tokens(model: BaselineModel, stages: int) -> None:
    whole = model.generate_cached(PROMPT, TOKENS)
    recompute = model.generate_recompute(PROMPT, TOKENS, split_evenly(model.n_layers, stages))
    assert len(whole.tokens) == TOKENS
    assert recompute.tokens == whole.tokens
    # Every token sends the whole growing sequence's float32 activation across every seam.
    sequence_rows = sum(len(PROMPT) + step for step in range(TOKENS))
    assert recompute.seam_bytes == (stages - 1) * sequence_rows * N_EMBD * 4
    assert whole.seam_bytes == 0
