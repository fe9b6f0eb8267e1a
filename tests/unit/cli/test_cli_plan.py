"""``meshnet plan``: the same plan from a whole GGUF, a header-only copy (holes where the tensors
were), a published manifest and a model id the data dir holds; a plain refusal with what would fit."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from meshnet.artifact.cache import HEADER_ONLY_SUFFIX
from meshnet.artifact.footprint import memory_footprint
from meshnet.artifact.gguf_file import parse_gguf
from meshnet.artifact.publish import PublishOptions, publish
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.cli.main import main
from meshnet.core.layer_costs import WorkerLoad, layer_costs
from meshnet.security.signing import load_or_create_key
from meshnet.tracker.placement import plan_ranges

SPEC = SyntheticSpec(n_layers=6, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx_train=4096, seed=5)
NODES = "185M,175M,175M"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["plan", *args])
    return code, capsys.readouterr().out


def _json(capsys: pytest.CaptureFixture[str], model: str, data_dir: Path) -> dict[str, Any]:
    code, out = _plan(capsys, model, "--nodes", NODES, "--json", "--data-dir", str(data_dir))
    assert code == 0, out
    document: dict[str, Any] = json.loads(out)
    document.pop("model")
    return document


def _width(layers: str) -> int:
    start, stop = layers.split(":")
    return int(stop) - int(start)


def _header_only(source: Path, target: Path) -> Path:
    """What a worker fetching by model id keeps: the header, then a hole to the source's size."""
    header = parse_gguf(source).data_offset
    with open(target, "wb") as handle:
        handle.write(source.read_bytes()[:header])
        handle.truncate(source.stat().st_size)
    return target


def test_every_way_to_name_a_model_gives_the_same_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    whole = _json(capsys, str(source), tmp_path)
    budgets = [185 * 2**20, 175 * 2**20, 175 * 2**20]
    costs = layer_costs(memory_footprint(source), WorkerLoad(8, 2048, 64))
    assert [node["layers"] for node in whole["nodes"]] == [str(r) for r in plan_ranges(costs, budgets)]
    assert [node["total"] for node in whole["nodes"]] == [costs.range_bytes(r) for r in plan_ranges(costs, budgets)]
    assert whole["fits"] and whole["trained_context"] == 4096 and whole["largest_context"] > 2048

    code, out = _plan(capsys, str(source), "--nodes", NODES, "--json", "--kv-type", "q4_0")
    quantized = json.loads(out)
    assert code == 0 and quantized["load"]["kv_type"] == "q4_0"
    for mine, f16 in zip(quantized["nodes"], whole["nodes"], strict=True):
        # q4_0 stores 32 values in 18 bytes, f16 in 64: per layer, KV shrinks by exactly that.
        assert mine["kv"] * 64 * _width(f16["layers"]) == f16["kv"] * 18 * _width(mine["layers"])

    copy = _header_only(source, tmp_path / f"copy{HEADER_ONLY_SUFFIX}")
    assert _json(capsys, str(copy), tmp_path) == whole

    key, _ = load_or_create_key(tmp_path / "publisher.key")
    options = PublishOptions("tiny-model", "apache-2.0", repo="synthetic", revision="0")
    manifest = publish(source, tmp_path / "published", options, key)
    assert _json(capsys, str(tmp_path / "published" / "manifest.json"), tmp_path) == whole
    assert _json(capsys, str(tmp_path / "published"), tmp_path) == whole

    # A worker that fetched a range by model id keeps the manifest and a header-only copy.
    folder = tmp_path / "data" / "models-by-id" / "tiny-model"
    folder.mkdir(parents=True)
    shutil.copy(tmp_path / "published" / "manifest.json", folder / "manifest.json")
    _header_only(source, folder / f"{manifest.source.sha256[:16]}{HEADER_ONLY_SUFFIX}")
    assert _json(capsys, "tiny-model", tmp_path / "data") == whole


def test_a_model_that_does_not_fit_is_told_what_would(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    code, out = _plan(capsys, str(source), "--nodes", "130M,130M", "--context", "4096", "--sessions", "16")
    assert code == 1
    assert "DOES NOT FIT" in out and "OVER by" in out and "MiB more on node" in out
    code, out = _plan(capsys, str(source), "--nodes", "130M,130M", "--json", "--sessions", "16")
    document = json.loads(out)
    assert code == 1 and not document["fits"] and document["would_fit"]["more_memory"]


def test_an_unknown_model_or_size_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "no-such-model", "--nodes", "1G", "--data-dir", str(tmp_path)]) == 2
    assert "neither a GGUF file, a manifest nor a model id" in capsys.readouterr().err
    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    assert main(["plan", str(source), "--nodes", "lots"]) == 2
    assert "not a memory size" in capsys.readouterr().err


def test_a_gpu_plans_ninety_percent_of_each_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    code, out = _plan(capsys, str(source), "--nodes", "1G,1G", "--device", "gpu", "--json")
    assert code == 0
    assert [node["budget_bytes"] for node in json.loads(out)["nodes"]] == [int(2**30 * 0.9)] * 2


def test_a_context_past_the_trained_length_is_refused_as_a_worker_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    assert main(["plan", str(source), "--nodes", "1G,1G", "--context", "8192"]) == 2
    assert "--context 8192" in capsys.readouterr().err


def test_a_split_set_plans_as_its_whole_file_by_directory_or_first_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifact"))
    from artifact_split import write_split_set

    source = write_synthetic_model(tmp_path / "tiny.gguf", SPEC)
    parts = write_split_set(source, tmp_path / "set", max_tensors=8, stem="tiny")
    assert len(parts) > 1
    whole = _json(capsys, str(source), tmp_path)
    assert _json(capsys, str(tmp_path / "set"), tmp_path) == whole
    assert _json(capsys, str(parts[0]), tmp_path) == whole
    code, out = _plan(capsys, str(tmp_path / "set"), "--nodes", NODES, "--json")
    assert code == 0 and json.loads(out)["model"] == "tiny"
