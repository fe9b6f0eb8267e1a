"""The repack setting is part of the recipe: a route never mixes nodes loaded with and without it.

llama.cpp's load-time repacking changes Q4_0 results, so a worker started with ``--no-repack``
must register another fingerprint than one with the default, and the flag must reach the engine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshnet.artifact.cache import SliceCache
from meshnet.artifact.describe import describe_model
from meshnet.artifact.synthetic import SyntheticSpec, write_synthetic_model
from meshnet.cli.flags import add_config_arguments, config_from_arguments
from meshnet.core.devices import CPU, DeviceInfo, DeviceRequest
from meshnet.node.assembly import backend_label, model_identity
from meshnet.node.config import WorkerConfig


def _worker(tmp_path: Path, *flags: str) -> WorkerConfig:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, WorkerConfig)
    given = ["--model", str(tmp_path / "m.gguf"), "--layers", "0:2", "--data-dir", str(tmp_path), *flags]
    args = parser.parse_args(given)
    return config_from_arguments(WorkerConfig, args)


def test_no_repack_reaches_the_engine_and_changes_the_fingerprint(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "m.gguf", SyntheticSpec(n_layers=2))
    default, off = _worker(tmp_path), _worker(tmp_path, "--no-repack")
    assert default.llama_config(1).repack and not off.llama_config(1).repack
    assert backend_label(default) == "llama.cpp(flash_attn=on,prefill_chunk=64)"  # the default recipe is unchanged
    assert backend_label(off) == "llama.cpp(flash_attn=on,prefill_chunk=64,repack=off)"
    cache, description = SliceCache(tmp_path / "cache"), describe_model(model)
    recipes = [model_identity(c, cache, description).recipe for c in (default, off)]
    assert recipes[0].fingerprint() != recipes[1].fingerprint()
    again = model_identity(_worker(tmp_path, "--repack"), cache, description).recipe
    assert again.fingerprint() == recipes[0].fingerprint()


def test_the_device_class_is_part_of_a_gpu_recipe_and_absent_from_a_cpu_one(tmp_path: Path) -> None:
    """A CPU worker's fingerprint is what it was before GPUs; each GPU model and offload count
    is a recipe of its own, so the tracker never chains a CUDA shard to a CPU or Vulkan one."""
    model = write_synthetic_model(tmp_path / "m.gguf", SyntheticSpec(n_layers=2))
    cache, description = SliceCache(tmp_path / "cache"), describe_model(model)
    h200 = DeviceInfo("cuda", 0, "CUDA0", "NVIDIA H200", 2**37, 2**37)
    lavapipe = DeviceInfo("vulkan", 0, "Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", 2**33, 2**33)
    worker, partial = _worker(tmp_path, "--device", "cuda"), _worker(tmp_path, "--device", "cuda", "--gpu-layers", "1")
    assert worker.device == DeviceRequest("cuda") and partial.gpu_layers == 1
    assert backend_label(worker) == "llama.cpp(flash_attn=on,prefill_chunk=64)"
    on_h200 = model_identity(worker, cache, description, h200).recipe
    assert on_h200.device_class == "cuda:NVIDIA H200 gpu_layers=all"
    assert on_h200.family == model_identity(worker, cache, description, CPU).recipe
    assert on_h200.family_fingerprint() != on_h200.family.fingerprint()  # rcf- never names an exact route
    assert worker.llama_config(1, h200).device == h200 and partial.llama_config(1, h200).gpu_layers == 1
    fingerprints = {
        model_identity(config, cache, description, device).recipe.fingerprint()
        for config, device in ((worker, CPU), (worker, h200), (worker, lavapipe), (partial, h200))
    }
    assert len(fingerprints) == 4
    assert (
        model_identity(worker, cache, description, CPU).recipe
        == model_identity(_worker(tmp_path), cache, description).recipe
    )
