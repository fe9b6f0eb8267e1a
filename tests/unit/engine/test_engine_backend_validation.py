"""A shard refuses malformed inputs before touching its KV cache, and then serves the next valid
input exactly as if the bad one had never arrived."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_routes import N_VOCAB, open_routes, prompt, release_all

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.embedding import EmbeddingTable
from meshnet.artifact.slicing import write_embedding_table, write_slice
from meshnet.artifact.synthetic import SyntheticSpec
from meshnet.core.errors import InvalidArgument, ProvenanceMismatch, ResourceExhausted
from meshnet.core.layers import LayerRange
from meshnet.engine.backend import StepInput
from meshnet.engine.bitwise import bit_identical
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.local_route import LocalRoute

N_EMBD = 64
TOKENS = prompt(6, 20)


@pytest.fixture(scope="module")
def split(
    tiny_model: Path, small_llama_config: LlamaConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalRoute]:
    layouts = {"split": [LayerRange(0, 2), LayerRange(2, 3), LayerRange(3, 4)]}
    with open_routes(
        tiny_model, SliceCache(tmp_path_factory.mktemp("validation")), small_llama_config, layouts
    ) as opened:
        yield opened["split"]


@pytest.fixture(autouse=True)
def _free_slots(split: LocalRoute, small_llama_config: LlamaConfig) -> Iterator[None]:
    yield
    release_all({"split": split}, small_llama_config.max_slots)


def _hidden(rows: int = 2, width: int = N_EMBD, dtype: type = np.float32) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, width)).astype(dtype)


def _nan_hidden() -> np.ndarray:
    hidden = _hidden()
    hidden[1, 3] = np.nan
    return hidden


def _inf_hidden() -> np.ndarray:
    hidden = _hidden()
    hidden[0, 0] = -np.inf
    return hidden


# (shard index, inputs) -> the message the refusal must carry
MALFORMED: dict[str, tuple[int, Callable[[], list[StepInput]], str]] = {
    "hidden too wide": (1, lambda: [StepInput(0, 0, hidden=_hidden(width=N_EMBD + 1))], r"float32 \[n, 64\]"),
    "hidden too narrow": (1, lambda: [StepInput(0, 0, hidden=_hidden(width=N_EMBD - 1))], r"float32 \[n, 64\]"),
    "hidden 1-D": (1, lambda: [StepInput(0, 0, hidden=np.zeros(N_EMBD, np.float32))], r"float32 \[n, 64\]"),
    "hidden 3-D": (1, lambda: [StepInput(0, 0, hidden=np.zeros((1, 2, N_EMBD), np.float32))], r"float32 \[n, 64\]"),
    "hidden float64": (1, lambda: [StepInput(0, 0, hidden=_hidden(dtype=np.float64))], r"float32 \[n, 64\]"),
    "hidden float16": (2, lambda: [StepInput(0, 0, hidden=_hidden(dtype=np.float16))], r"float32 \[n, 64\]"),
    "hidden with NaN": (1, lambda: [StepInput(0, 0, hidden=_nan_hidden())], "NaN or infinity"),
    "hidden with infinity": (2, lambda: [StepInput(0, 0, hidden=_inf_hidden())], "NaN or infinity"),
    "hidden with no rows": (1, lambda: [StepInput(0, 0, hidden=np.zeros((0, N_EMBD), np.float32))], "no tokens"),
    "tokens to a middle shard": (1, lambda: [StepInput(0, 0, tokens=TOKENS)], "takes a boundary hidden state"),
    "hidden to a head shard": (0, lambda: [StepInput(0, 0, hidden=_hidden())], "takes token ids"),
    "both tokens and hidden": (1, lambda: [StepInput(0, 0, tokens=TOKENS, hidden=_hidden())], "not both or neither"),
    "neither tokens nor hidden": (2, lambda: [StepInput(0, 0)], "not both or neither"),
    "token id past the vocabulary": (
        0,
        lambda: [StepInput(0, 0, tokens=np.array([1, N_VOCAB], np.int32))],
        "token ids must lie",
    ),
    "negative token id": (0, lambda: [StepInput(0, 0, tokens=np.array([-1], np.int32))], "token ids must lie"),
    "int64 token ids": (0, lambda: [StepInput(0, 0, tokens=TOKENS.astype(np.int64))], "int32"),
    "no tokens": (0, lambda: [StepInput(0, 0, tokens=np.zeros(0, np.int32))], "no tokens"),
    "slot out of range": (0, lambda: [StepInput(4, 0, tokens=TOKENS)], "slot 4 is out of range"),
    "negative slot": (1, lambda: [StepInput(-1, 0, hidden=_hidden())], "slot -1 is out of range"),
    "slot repeated in a batch": (
        0,
        lambda: [StepInput(0, 0, tokens=TOKENS), StepInput(0, 6, tokens=TOKENS)],
        "repeated in one batch",
    ),
    "position gap": (0, lambda: [StepInput(0, 3, tokens=TOKENS)], "slot 0 is at position 0, input starts at 3"),
    "gap on a middle shard": (1, lambda: [StepInput(0, 1, hidden=_hidden())], "at position 0, input starts at 1"),
    "one bad input spoils the batch": (
        2,
        lambda: [StepInput(1, 0, hidden=_hidden()), StepInput(2, 0, hidden=_nan_hidden())],
        "NaN",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_is_invalid_and_leaves_kv_untouched(split: LocalRoute, case: str) -> None:
    expected = split.forward(0, 0, TOKENS, "all")
    split.release(0)
    shard, make_inputs, message = MALFORMED[case]
    with pytest.raises(InvalidArgument, match=message):
        split.backends[shard].run(make_inputs())
    for backend in split.backends:
        assert isinstance(backend, LlamaBackend)
        assert [backend.slot_length(s) for s in range(4)] == [0, 0, 0, 0], case
    assert bit_identical(split.forward(0, 0, TOKENS, "all"), expected)


def test_duplicate_and_gapped_steps_after_a_prefill(split: LocalRoute) -> None:
    head = split.backends[0]
    assert isinstance(head, LlamaBackend)
    split.forward(0, 0, TOKENS, "all")
    for position in (0, len(TOKENS) - 1, len(TOKENS) + 1):  # replayed, duplicated, skipped ahead
        with pytest.raises(InvalidArgument, match=f"slot 0 is at position {len(TOKENS)}, input starts at {position}"):
            head.run([StepInput(0, position, tokens=np.array([5], np.int32))])
    assert head.slot_length(0) == len(TOKENS)
    assert split.forward(0, len(TOKENS), np.array([5], np.int32)).shape == (1, N_VOCAB)


def test_positions_past_the_context_are_resource_exhausted(split: LocalRoute, small_llama_config: LlamaConfig) -> None:
    head = split.backends[0]
    too_long = prompt(small_llama_config.n_ctx_per_slot + 1, 21)
    with pytest.raises(ResourceExhausted, match="exceed the 256-token context"):
        head.run([StepInput(0, 0, tokens=too_long)])
    assert isinstance(head, LlamaBackend) and head.slot_length(0) == 0
    # Exactly the context fills; one more position does not fit.
    full = prompt(small_llama_config.n_ctx_per_slot, 22)
    logits = split.forward(0, 0, full, "last")
    assert logits.shape == (1, N_VOCAB)
    with pytest.raises(ResourceExhausted):
        split.forward(0, small_llama_config.n_ctx_per_slot, np.array([5], np.int32))


def test_truncate_rejects_bad_slots(split: LocalRoute) -> None:
    for slot, position in ((-1, 0), (4, 0), (0, -1)):
        with pytest.raises(InvalidArgument, match="cannot truncate"):
            split.backends[0].truncate(slot, position)


def test_route_shape_must_chain(split: LocalRoute) -> None:
    head, middle, tail = split.backends
    with pytest.raises(InvalidArgument, match="contiguous"):
        LocalRoute([head, tail])
    with pytest.raises(InvalidArgument, match="contiguous and start at layer 0"):
        LocalRoute([middle, tail])
    with pytest.raises(InvalidArgument, match="last layer"):
        LocalRoute([head, middle])
    with pytest.raises(InvalidArgument):
        LocalRoute([])
    assert [b.shape.role for b in split.backends] == ["head", "middle", "tail"]
    assert [b.shape.n_vocab for b in split.backends] == [0, 0, N_VOCAB]


def test_loading_refuses_mismatched_files(
    tiny_model: Path,
    synthetic_model_factory: Callable[[SyntheticSpec], Path],
    small_llama_config: LlamaConfig,
    tmp_path: Path,
) -> None:
    head = tmp_path / "head.gguf"
    write_slice(tiny_model, LayerRange(0, 2), head)
    table_path = tmp_path / "emb.gguf"
    write_embedding_table(tiny_model, table_path)
    with pytest.raises(InvalidArgument, match="needs the embedding table"):
        LlamaBackend(head, small_llama_config)
    with pytest.raises(InvalidArgument, match="embedding table, not a layer slice"):
        LlamaBackend(table_path, small_llama_config)
    foreign_path = tmp_path / "foreign-emb.gguf"
    write_embedding_table(synthetic_model_factory(SyntheticSpec(seed=5)), foreign_path)
    foreign = EmbeddingTable(foreign_path)
    try:
        with pytest.raises(InvalidArgument, match="different source model"):
            LlamaBackend(head, small_llama_config, embeddings=foreign)
    finally:
        foreign.close()
    with pytest.raises(ProvenanceMismatch, match="not a meshnet slice"):
        LlamaBackend(tiny_model, small_llama_config)
