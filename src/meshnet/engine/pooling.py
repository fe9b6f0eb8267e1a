"""Pooling the tail's final-norm rows into one embedding vector (see ``core.embedding``)."""

from __future__ import annotations

import numpy as np

from meshnet.core.embedding import EmbeddingSpec
from meshnet.core.errors import EngineError


def pool(normed: np.ndarray | None, spec: EmbeddingSpec) -> np.ndarray:
    """float64 [n_embd]: the input's last final-norm row, L2-normalized when ``spec`` asks.

    ``normed`` is float32 [rows, n_embd], the tail's ``StepOutput.normed``. The float64 result
    is what llama-cpp-python's ``embed`` returns: the float32 row widened, then divided by its
    float64 norm (a zero vector stays zero).
    """
    if normed is None or normed.ndim != 2 or len(normed) == 0:
        raise EngineError("the tail returned no final-norm rows to pool (this engine cannot embed)")
    vector = normed[-1].astype(np.float64)
    if not spec.normalize:
        return vector
    norm = float(np.linalg.norm(vector))
    return vector if norm == 0.0 else vector / norm
