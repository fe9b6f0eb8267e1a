"""Full-size random-weight models: their shapes, and provisioning them by name
(``meshnet provision synthetic-3b``).

They are written on demand into the data dir's models folder by the synthetic writer, never
downloaded and never committed: the writer is deterministic and the file name carries the spec's
fingerprint, so a name always means the same bytes, and a full-size file takes seconds to write
rather than a download's minutes. They stand in
for the real models' compute (shape, weight types, vocabulary width), not for their text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType

from meshnet.artifact.synthetic import Llama3RopeScaling, SyntheticSpec, write_synthetic_model


def tinyllama_shaped_spec() -> SyntheticSpec:
    """TinyLlama-1.1B's shape (22 layers, n_embd 2048, 32/4 heads, n_ff 5632) with Q4_0 blocks and
    a Q8_0 token table: the bench's synthetic-1b model (its small vocabulary aside)."""
    return SyntheticSpec(
        n_layers=22,
        n_embd=2048,
        n_head=32,
        n_head_kv=4,
        n_ff=5632,
        weight_type=GGMLQuantizationType.Q4_0,
        embedding_type=GGMLQuantizationType.Q8_0,
        seed=1,
    )


def llama3_8b_shaped_spec() -> SyntheticSpec:
    """Llama-3-8B's shape (32 layers, n_embd 4096, 32/8 heads, n_ff 14336, 128,256 tokens, an
    untied LM head) as llama.cpp's Q4_0 file stores it (Q4_0 blocks and token table, a Q6_K LM
    head), written as random blocks: ~4.65 GB (4.33 GiB). The vocabulary is SentencePiece padded
    with plain pieces to Llama 3's size, not Llama 3's BPE, so token ids and widths match only."""
    return SyntheticSpec(
        n_layers=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=14336,
        n_ctx_train=8192,
        weight_type=GGMLQuantizationType.Q4_0,
        embedding_type=GGMLQuantizationType.Q4_0,
        output_type=GGMLQuantizationType.Q6_K,
        tied_embeddings=False,
        n_vocab=128256,
        random_blocks=True,
        seed=8,
    )


def llama32_3b_shaped_spec() -> SyntheticSpec:
    """Llama-3.2-3B's shape (Meta's config: 28 layers, n_embd 3072, 24/8 heads of 128, n_ff 8192,
    128,256 tokens, tied embeddings, rope theta 500,000 with llama3 scaling, rms eps 1e-5) as
    llama.cpp's Q4_0 file stores it: Q4_0 blocks and a Q6_K token table (llama-quantize gives the
    tied table the LM head's type), written as random blocks: ~1.92 GB (1.79 GiB). The vocabulary
    is SentencePiece padded to Llama 3's size, not Llama 3's BPE: token ids and widths match only."""
    return SyntheticSpec(
        n_layers=28,
        n_embd=3072,
        n_head=24,
        n_head_kv=8,
        n_ff=8192,
        n_ctx_train=131072,
        weight_type=GGMLQuantizationType.Q4_0,
        embedding_type=GGMLQuantizationType.Q6_K,
        tied_embeddings=True,
        head_dim=128,
        n_vocab=128256,
        random_blocks=True,
        weight_scale=2 / math.sqrt(3072),  # sharp enough that greedy decoding does not settle on one token
        embedding_scale=0.1,  # Q6_K's block scale is this / 1300: still a normal fp16
        rope_freq_base=500000.0,
        rope_scaling=Llama3RopeScaling(),
        seed=3,
    )


@dataclass(frozen=True)
class SyntheticModel:
    name: str
    """What ``meshnet provision`` and the bench call it."""
    stem: str
    """The file name before the spec's fingerprint (``synthetic_model_path``)."""
    spec: Callable[[], SyntheticSpec]


SYNTHETIC_1B = SyntheticModel("synthetic-1b", "synthetic-1b-q4_0", tinyllama_shaped_spec)
SYNTHETIC_3B = SyntheticModel("synthetic-3b", "synthetic-3b-q4_0", llama32_3b_shaped_spec)
SYNTHETIC_MODELS: dict[str, SyntheticModel] = {model.name: model for model in (SYNTHETIC_1B, SYNTHETIC_3B)}


def spec_fingerprint(spec: SyntheticSpec) -> str:
    """sha256 over every field of the spec (quantization types as their ggml numbers)."""
    fields = json.dumps(dataclasses.asdict(spec), sort_keys=True)
    return hashlib.sha256(fields.encode()).hexdigest()


def synthetic_model_path(models_dir: Path, model: SyntheticModel) -> Path:
    """``<stem>-<fingerprint>.gguf``: a spec edited under the same name gets a new file, never
    the old file's bytes (the writer's own code is pinned by a golden hash in the tests)."""
    return Path(models_dir) / f"{model.stem}-{spec_fingerprint(model.spec())[:12]}.gguf"


def provision_synthetic(models_dir: Path, model: SyntheticModel) -> Path:
    """The model's GGUF in ``models_dir``, written first (atomically, streamed) when missing."""
    path = synthetic_model_path(models_dir, model)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_model(path, model.spec())
    return path
