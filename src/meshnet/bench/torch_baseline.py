"""The one home of torch and transformers: the design documents' baseline, loaded from the GGUF.

The design documents (DGR-001, DGR-014) judge meshnet against the node's current
Transformers route, which has two paths:

- the full local PyTorch model: transformers owns autoregressive decode and its KV cache;
- the "distributed PyTorch route": decoder layers called one by one with ``use_cache=False``,
  the whole growing sequence recomputed for every generated token, the full
  ``[batch, seq, hidden]`` activation sent across every seam.

Both run here on the GGUF every other lane runs, loaded through transformers' GGUF support
(``gguf_file=``): the same weights' source, dequantized to float32, so the numerics differ from
llama.cpp's quantized matmuls (the lanes report agreement, never assume it).

torch and transformers are the optional ``baseline`` extra (``make baseline``): they are imported
only when a model is loaded, and their absence is ``BaselineUnavailable`` with the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshnet.core.errors import FailedPrecondition
from meshnet.core.layers import LayerRange


class BaselineUnavailable(FailedPrecondition):
    """The baseline extra is not installed here (or its model cannot be loaded): the lane is
    skipped with this message, never measured with a stand-in."""

    code = "baseline_unavailable"


@dataclass(frozen=True)
class Generated:
    """One greedy generation: its tokens, when each was chosen, and what crossed the seams."""

    started: float
    """``time.perf_counter()`` when the request began (before the prompt's forward)."""
    tokens: tuple[int, ...]
    token_times: tuple[float, ...]
    seam_bytes: int = 0
    """Activation bytes sent across all seams over the whole generation (recompute only)."""


def import_baseline() -> tuple[Any, Any]:
    """``(torch, transformers)``, or ``BaselineUnavailable`` naming the package that is missing.

    Plain imports, so import-linter sees them: its contract allows them here and nowhere else."""
    try:
        import torch
    except ImportError as error:
        raise _missing(error) from None
    try:
        import accelerate  # noqa: F401  (``from_pretrained(gguf_file=...)`` refuses to run without it)
        import transformers
        import transformers.masking_utils
    except ImportError as error:
        raise _missing(error) from None
    return torch, transformers


def _missing(error: ImportError) -> BaselineUnavailable:
    return BaselineUnavailable(
        f"baseline unavailable: {error.name or error} is not installed ({error}); "
        "install the extra with `pip install .[baseline]` or `make baseline`"
    )


RECOMPUTE_MODEL_TYPES = frozenset({"llama"})
"""Where ``_recompute_step`` calls the decoder layers as llama's do: other families' layers take
other arguments (Gemma 3's rotary tables need each layer's ``layer_type``)."""


def require_recompute_route(model_type: str) -> None:
    """``BaselineUnavailable`` unless the layer-by-layer route knows this family's layers."""
    if model_type not in RECOMPUTE_MODEL_TYPES:
        raise BaselineUnavailable(
            f"baseline unavailable: the recompute route calls llama's decoder layers; "
            f"this model is {model_type!r}, so only transformers-whole runs"
        )


class BaselineModel:
    """A transformers causal LM from one GGUF, on the CPU, with torch limited to ``threads``."""

    def __init__(self, path: Path, threads: int) -> None:
        torch, transformers = import_baseline()
        self._torch = torch
        self.versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
        """What ran, for the lane's results: a CPU wheel and a CUDA one compute differently."""
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)  # the other lanes' llama.cpp thread count
        transformers.utils.logging.disable_progress_bar()
        try:
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, attn_implementation="sdpa", dtype=torch.float32
            )
        except (ValueError, OSError, KeyError) as error:
            torch.set_num_threads(self._threads_before)
            raise BaselineUnavailable(f"baseline unavailable: transformers cannot load {path.name}: {error}") from None
        self._model.eval()
        self._masks = transformers.masking_utils

    @property
    def n_layers(self) -> int:
        return int(self._model.config.num_hidden_layers)

    @property
    def model_type(self) -> str:
        return str(self._model.config.model_type)

    def close(self) -> None:
        self._torch.set_num_threads(self._threads_before)

    def generate_cached(self, prompt: tuple[int, ...], max_tokens: int) -> Generated:
        """Greedy decode with transformers' own KV cache: one forward over the prompt, then one
        forward per token over the new token only (what ``generate()`` does for greedy)."""
        torch = self._torch
        started = time.perf_counter()
        tokens: list[int] = []
        times: list[float] = []
        with torch.inference_mode():
            output = self._model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
            while True:
                tokens.append(int(output.logits[0, -1].argmax()))
                times.append(time.perf_counter())
                if len(tokens) == max_tokens:
                    break
                step = torch.tensor([[tokens[-1]]])
                output = self._model(input_ids=step, past_key_values=output.past_key_values, use_cache=True)
        return Generated(started, tuple(tokens), tuple(times))

    def generate_recompute(self, prompt: tuple[int, ...], max_tokens: int, stages: list[LayerRange]) -> Generated:
        """The documents' distributed route: per token, every stage's layers run over the whole
        sequence with ``use_cache=False`` and the full activation crosses each seam."""
        require_recompute_route(self.model_type)
        torch = self._torch
        started = time.perf_counter()
        sequence = list(prompt)
        tokens: list[int] = []
        times: list[float] = []
        seam_bytes = 0
        with torch.inference_mode():
            while len(tokens) < max_tokens:
                token, crossed = self._recompute_step(sequence, stages)
                tokens.append(token)
                times.append(time.perf_counter())
                sequence.append(token)
                seam_bytes += crossed
        return Generated(started, tuple(tokens), tuple(times), seam_bytes)

    def _recompute_step(self, sequence: list[int], stages: list[LayerRange]) -> tuple[int, int]:
        """One generated token of the recompute route; returns it and the seam bytes it cost."""
        torch = self._torch
        inner = self._model.model
        hidden = inner.embed_tokens(torch.tensor([sequence]))  # hidden: [1, seq, n_embd]
        positions = torch.arange(len(sequence)).unsqueeze(0)
        # The model's own mask and rotary tables for a cache-less pass over the whole sequence.
        mask = self._masks.create_causal_mask(
            config=inner.config, inputs_embeds=hidden, attention_mask=None, past_key_values=None, position_ids=positions
        )
        rotary = inner.rotary_emb(hidden, position_ids=positions)
        crossed = 0
        for index, stage in enumerate(stages):
            if index > 0:
                hidden, sent = self._cross_seam(hidden)
                crossed += sent
            for layer in inner.layers[stage.start : stage.stop]:
                hidden = layer(
                    hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary, use_cache=False
                )
        logits = self._model.lm_head(inner.norm(hidden[:, -1:, :]))  # the tail: last row only
        return int(logits[0, -1].argmax()), crossed

    def _cross_seam(self, hidden: Any) -> tuple[Any, int]:
        """The activation as the next stage would receive it: serialized to bytes and rebuilt.
        In process there is no socket; the copy is what a send costs short of the network."""
        payload = hidden.contiguous().numpy().tobytes()  # hidden: [1, seq, n_embd] float32
        rebuilt = self._torch.frombuffer(bytearray(payload), dtype=hidden.dtype).reshape(hidden.shape)
        return rebuilt, len(payload)
