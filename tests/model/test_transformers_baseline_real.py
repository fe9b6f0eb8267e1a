"""The design documents' baseline on the real SmolLM2 GGUF through transformers' GGUF support:
the distributed PyTorch route (stages, use_cache=False, the whole sequence per token) chooses the
same greedy tokens as transformers' own KV-cached decode (the same float32 numerics, so this is
asserted), and its seam traffic is the documents' full activation per token.

Needs the ``baseline`` extra (``make baseline``: run with .venv-baseline) besides the model tests'
MESHNET_ENABLE_REAL_INFERENCE_TESTS=1; skipped with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gemma3_model import MODEL as GEMMA3
from smollm2_model import MARKS, MODEL

from meshnet.bench.config import BenchConfig
from meshnet.bench.torch_baseline import BaselineModel, BaselineUnavailable
from meshnet.bench.transformers_lane import PROMPTS, measure_transformers
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


def test_the_lanes_run_end_to_end_beside_llama(model: BaselineModel, tmp_path: Path) -> None:
    """Both lanes measured (not skipped), each compared with whole-model llama.cpp per prompt."""
    config = BenchConfig(model=MODEL, data_dir=tmp_path, prompt_tokens=16, output_tokens=TOKENS)
    lanes = measure_transformers(config, lambda _: None)
    assert set(lanes) == {"transformers-whole", "transformers-recompute-3"}
    for lane in lanes.values():
        assert lane.skipped is None
        assert lane.decode_tok_s is not None and lane.decode_tok_s > 0
        assert lane.whole_decode_tok_s is not None and lane.whole_decode_tok_s > 0
        assert len(lane.token_agreement_per_prompt) == PROMPTS
        assert model.versions in lane.note  # what ran is recorded
    assert "tokens equal to transformers-whole: 1.000" in lanes["transformers-recompute-3"].note


@pytest.mark.skipif(not GEMMA3.exists(), reason=f"{GEMMA3} is not provisioned (meshnet provision gemma3-270m)")
def test_gemma3_runs_whole_and_the_recompute_route_refuses_it() -> None:
    """Gemma 3's layers take a per-layer rotary table (``layer_type``): the llama-only recompute
    route refuses it with the typed error; transformers' own decode still runs."""
    try:
        gemma = BaselineModel(GEMMA3, threads=1)
    except BaselineUnavailable as error:
        pytest.skip(error.message)
    try:
        with pytest.raises(BaselineUnavailable, match="'gemma3_text'"):
            gemma.generate_recompute(PROMPT[:4], TOKENS, split_evenly(gemma.n_layers, 2))
        assert len(gemma.generate_cached(PROMPT[:4], TOKENS).tokens) == TOKENS
    finally:
        gemma.close()
