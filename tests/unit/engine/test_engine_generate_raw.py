"""``meshnet generate --raw --model PATH``: a plain completion on any certified family."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.cli import main as cli
from meshnet.engine.tokenizer import Tokenizer


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_generate_raw_completes_text_on_a_certified_family(
    family: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_synthetic_model(tmp_path / f"{family}.gguf", SyntheticSpec(architecture=family, n_layers=4))
    argv = ["--data-dir", str(tmp_path), "generate", "--raw", "the a is", "--model", str(model)]
    argv += ["--shards", "2", "--max-tokens", "5", "--threads", "1", "--max-sessions", "1", "--context", "64"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    tokenizer = Tokenizer(describe_model(model))
    expected = len(tokenizer.encode("the a is", add_special=True))  # the text as is: no chat template
    tokenizer.close()
    assert f"[{family}: 2 in-process shard(s) on cpu: 0:2, 2:4; prompt {expected} tokens]" in err  # its served id
    assert "; decode 4 tokens in" in err  # 5 tokens: the first ends the prefill


def test_generate_refuses_a_family_outside_the_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_synthetic_model(tmp_path / "phi3.gguf", SyntheticSpec(architecture="phi3"))
    assert cli.main(["--data-dir", str(tmp_path), "generate", "--raw", "the", "--model", str(model)]) != 0
    assert "phi3" in capsys.readouterr().err
