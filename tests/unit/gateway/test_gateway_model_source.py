"""Where a gateway's tokenizer comes from: a local ``--model`` or a published ``--model-id``,
exactly one of them, and ``--trust-publisher`` only with the model id; the CLI falls back to the
provisioned model only when no model id is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.cli.commands.serve import gateway_config
from meshnet.cli.main import build_parser
from meshnet.core.errors import InvalidArgument
from meshnet.gateway.config import GatewayConfig, GatewayProcessConfig


def _config(tmp_path: Path, **fields: object) -> GatewayProcessConfig:
    return GatewayProcessConfig(tracker="t:1", http=GatewayConfig(), data_dir=tmp_path, **fields)  # type: ignore[arg-type]


def test_exactly_one_model_source(tmp_path: Path) -> None:
    assert _config(tmp_path, model=tmp_path / "m.gguf").model_id is None
    assert _config(tmp_path, model_id="smol", trust_publisher="ed25519:ab").model is None
    for fields in ({}, {"model": tmp_path / "m.gguf", "model_id": "smol"}):
        with pytest.raises(InvalidArgument, match="either --model or --model-id"):
            _config(tmp_path, **fields)
    with pytest.raises(InvalidArgument, match="--trust-publisher goes with --model-id"):
        _config(tmp_path, model=tmp_path / "m.gguf", trust_publisher="ed25519:ab")


def test_a_model_id_needs_no_provisioned_model(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--data-dir", str(tmp_path), "gateway", "--tracker", "t:1", "--model-id", "smol"])
    config = gateway_config(args)
    assert (config.model, config.model_id) == (None, "smol")
