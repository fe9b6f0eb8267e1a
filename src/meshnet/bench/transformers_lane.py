"""The optional ``transformers`` lane: the same GGUF dequantized into PyTorch, greedy with a KV cache.

It is a reference point for readers who know the Hugging Face stack, not a dependency: when
torch or transformers is missing the lane is recorded as skipped with the reason, and the bench
never installs them. Only concurrency 1 is measured (one stream at a time).
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshnet.bench.stats import RequestTrace, RunRecord


def transformers_unavailable() -> str | None:
    """Why the lane cannot run here, or None when it can."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (an optional extra; the bench never installs it)"
    return None


class TransformersLane:
    def __init__(self, model: Path, threads: int) -> None:
        self.name = "transformers"
        self.seams = 0
        self._torch: Any = importlib.import_module("torch")
        transformers: Any = importlib.import_module("transformers")
        self._torch.set_num_threads(threads)
        # transformers dequantizes GGUF weights on load: float32 compute, the same weights.
        self._model = transformers.AutoModelForCausalLM.from_pretrained(
            str(model.parent), gguf_file=model.name, torch_dtype=self._torch.float32
        )
        self._model.eval()

    def run(self, prompts: Sequence[tuple[int, ...]], indices: Sequence[int], max_tokens: int) -> RunRecord:
        torch = self._torch
        started = time.perf_counter()
        traces = []
        for index, prompt in zip(indices, prompts, strict=True):
            begun = time.perf_counter()
            times: list[float] = []
            tokens: list[int] = []
            with torch.no_grad():
                output = self._model(torch.tensor([list(prompt)]), use_cache=True)
                for _ in range(max_tokens):
                    token = int(torch.argmax(output.logits[0, -1]))
                    times.append(time.perf_counter())
                    tokens.append(token)
                    if len(tokens) == max_tokens:
                        break
                    past = output.past_key_values
                    output = self._model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            traces.append(RequestTrace(index, len(prompt), begun, tuple(times), tuple(tokens), times[-1]))
        return RunRecord(self.name, len(prompts), started, time.perf_counter(), tuple(traces))
