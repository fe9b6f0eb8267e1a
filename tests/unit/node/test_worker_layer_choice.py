"""`--layers`: a fixed A:B range or `auto`, which needs a tracker to ask and a budget to ask within."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.core.errors import InvalidArgument
from meshnet.core.layers import LayerRange
from meshnet.node.config import LayerChoice, WorkerConfig


def test_the_flag_parses_a_range_or_auto() -> None:
    assert LayerChoice.parse("3:7") == LayerChoice(LayerRange(3, 7))
    assert LayerChoice.parse("auto") == LayerChoice(None)
    assert str(LayerChoice.parse("auto")) == "auto" and str(LayerChoice.parse("0:4")) == "0:4"
    with pytest.raises(InvalidArgument, match="must look like A:B"):
        LayerChoice.parse("most")


def test_auto_without_a_tracker_or_a_budget_is_refused_at_once() -> None:
    model = Path("m.gguf")
    with pytest.raises(InvalidArgument, match="give --tracker, --memory-budget-mb"):
        WorkerConfig(model, LayerChoice(None), Path("."), memory_budget_mb=100)
    with pytest.raises(InvalidArgument, match="give --tracker, --memory-budget-mb"):
        WorkerConfig(model, LayerChoice(None), Path("."), tracker="127.0.0.1:7100")


def test_an_unresolved_auto_range_cannot_be_served() -> None:
    config = WorkerConfig(Path("m.gguf"), LayerChoice(None), Path("."), tracker="127.0.0.1:7100", memory_budget_mb=100)
    with pytest.raises(InvalidArgument, match="must be resolved with the tracker"):
        _ = config.layers


def test_a_plain_range_still_configures_a_worker() -> None:
    assert WorkerConfig(Path("m.gguf"), LayerRange(0, 2), Path(".")).layers == LayerRange(0, 2)
