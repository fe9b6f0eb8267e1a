"""Where the real Gemma 3 270M lives for the model tests, and the markers that skip without it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshnet.artifact.provision import GEMMA3_270M, model_path

DATA_DIR = Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data"))
MODEL = model_path(DATA_DIR / "models", GEMMA3_270M)
ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"
MARKS = [
    pytest.mark.real_model,
    pytest.mark.skipif(not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"),
    pytest.mark.skipif(
        ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned (meshnet provision gemma3-270m)"
    ),
]


def open_tokenizer() -> Iterator[object]:
    """Body of a module-scoped ``tokenizer`` fixture (llama_cpp is imported only when it runs)."""
    from meshnet.artifact.describe import describe_model
    from meshnet.engine.tokenizer import Tokenizer

    loaded = Tokenizer(describe_model(MODEL))
    yield loaded
    loaded.close()
