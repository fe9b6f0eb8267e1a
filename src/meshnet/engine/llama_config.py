"""The settings of one llama.cpp context, in a module of its own so configs can name them without
loading llama.cpp (the tracker and ``meshnet --help`` never should)."""

from __future__ import annotations

from dataclasses import dataclass

from meshnet.core.devices import CPU, DeviceInfo
from meshnet.core.errors import InvalidArgument
from meshnet.core.kv_type import KvType


@dataclass(frozen=True)
class LlamaConfig:
    """One context's settings, derived from a component's config (``WorkerConfig.llama_config``,
    the bench's, ``meshnet generate``'s): no defaults here, so none can disagree with those."""

    n_threads: int
    """CPU threads for decode and prefill."""
    max_slots: int
    """Sessions with KV at once (llama sequences)."""
    n_ctx_per_slot: int
    """Positions per session."""
    max_batch_tokens: int
    """Tokens per llama_decode call (n_batch = n_ubatch); longer inputs are cut into calls."""
    flash_attn: bool = True
    """Flash attention on CPU visits only the session's own KV cells, so batching sessions
    together does not change a session's attention arithmetic."""
    use_mmap: bool = True
    """Map the weights from the file (pages the kernel may drop and re-read) instead of copying
    them into anonymous memory; off makes a memory cap count every weight byte."""
    repack: bool = True
    """Let llama.cpp repack weights at load into its CPU kernels' layouts (its "extra buffer
    types", Q4_0 here): a copy in anonymous memory the kernels read instead of the mapping. It
    changes Q4_0 results, so it is part of the recipe; off reads every weight from the mapping."""
    device: DeviceInfo = CPU
    """Where the owned layers run (``engine.devices.find_device``). On the CPU nothing is offloaded,
    not even one large op, so a CPU recipe computes what it did before GPUs were offered."""
    gpu_layers: int | None = None
    """On a GPU, how many of the range's layers to offload (the rest run on the CPU, when device
    memory is short); None offloads them all."""
    kv_type: KvType = KvType.F16
    """What keys and values are stored as (llama.cpp's ``type_k`` and ``type_v``, both the same).
    A quantized V cache is read only by flash attention, so a quantized type needs it."""
    split_small_decode_batches: bool = True
    """Run a batch of one-token steps too small to be worth one call through a Q8_0 LM head one row
    per call (``engine.batching.fewest_batched_rows``, measured at start-up: ``engine.call_costs``):
    the same arithmetic, less CPU. Start-up
    certification turns it off, so that its two-row batch still runs (and certifies) the batched
    kernels that larger batches are served with."""
    lm_head_batch_from: int | None = None
    """Fewest one-token rows such a shard runs in one call (``split_small_decode_batches``); None
    measures it at start-up on this CPU (``engine.call_costs``). Set only by tests and scripts that
    need one path taken whatever the CPU."""

    def __post_init__(self) -> None:
        if self.lm_head_batch_from is not None and self.lm_head_batch_from < 1:
            raise InvalidArgument(f"lm_head_batch_from must be at least 1 row, not {self.lm_head_batch_from}")
        if self.kv_type.quantized and not self.flash_attn:
            raise InvalidArgument(
                f"--kv-type {self.kv_type} needs flash attention (llama.cpp reads a quantized V cache "
                "only there): drop --no-flash-attn or use --kv-type f16"
            )
