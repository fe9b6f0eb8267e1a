"""Where the real SmolLM2-135M lives for the model tests, and the markers that skip without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshnet.artifact.provision import model_path

DATA_DIR = Path(os.environ.get("MESHNET_DATA_DIR", Path(__file__).resolve().parents[2] / ".data"))
MODEL = model_path(DATA_DIR / "models")
ENABLED = os.environ.get("MESHNET_ENABLE_REAL_INFERENCE_TESTS") == "1"
ENABLED_MARK = pytest.mark.skipif(
    not ENABLED, reason="set MESHNET_ENABLE_REAL_INFERENCE_TESTS=1 to run real-model tests"
)
PROVISIONED_MARK = pytest.mark.skipif(
    ENABLED and not MODEL.exists(), reason=f"{MODEL} is not provisioned (meshnet provision)"
)
MARKS = [pytest.mark.real_model, ENABLED_MARK, PROVISIONED_MARK]
