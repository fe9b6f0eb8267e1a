"""``meshnet generate --expert-parallel N --raw``: the same completion as the whole model."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Quant

from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.cli import main as cli

MOE = SyntheticSpec(architecture="qwen3moe", n_layers=2, n_expert=16, n_expert_used=4, weight_type=Quant.Q4_0, seed=4)


def _generate(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, str]:
    argv = ["--data-dir", str(tmp_path), "generate", "--raw", "the a is of", "--model", str(model), *flags]
    argv += ["--max-tokens", "24", "--threads", "1", "--max-sessions", "1", "--context", "128"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.parametrize("nodes", [2, 4])
def test_expert_group_completes_like_the_whole_model(
    nodes: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_synthetic_model(tmp_path / "moe.gguf", MOE)
    whole, _ = _generate(tmp_path, model, capsys, "--shards", "1")
    group, err = _generate(tmp_path, model, capsys, "--expert-parallel", str(nodes))
    assert f"{nodes}-node expert-parallel group;" in err
    assert group == whole


def test_expert_parallel_refuses_a_dense_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_synthetic_model(tmp_path / "dense.gguf", SyntheticSpec(architecture="qwen3"))
    argv = ["--data-dir", str(tmp_path), "generate", "--raw", "the", "--model", str(model), "--expert-parallel", "2"]
    assert cli.main(argv) != 0
    assert "expert parallelism" in capsys.readouterr().err
