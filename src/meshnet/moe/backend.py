"""One node of an expert-parallel group: the whole model on llama.cpp, routed experts 1/N.

The mechanism lives in the eval callback, per MoE layer of ``build_moe_ffn`` (llama-graph.cpp):
- ``ffn_moe_topk-L`` (int32 [k, n_tokens], a view of the argsort): the router's true choice,
  kept for the exchange and the top-k report;
- ``ffn_moe_weights_norm-L``: the slot weights are already gathered with the true ids, so the
  ids are now rewritten in place: every non-local expert becomes one fixed non-local dummy, and
  ``mul_mat_id`` reads only this node's experts (plus the dummy);
- ``ffn_moe_weighted-L`` (f32 [n_embd, k, n_tokens]): this node publishes its local slot rows,
  receives the others' and writes them into the non-local slots; the graph's own left fold in
  slot order then yields exactly the whole model's ``ffn_moe_out``.
Writes made in the callback (ask = false, CPU buffers) are read by every later node. A failed
exchange aborts the graph; ``run`` then rolls the batch's positions back out of the KV cache and
raises the exchange's error. Expert FLOPs are not saved (k slots still run); weight reads are.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import llama_cpp
import numpy as np

from meshnet.core.errors import EngineError, MeshnetError
from meshnet.engine.backend import StepInput, StepOutput
from meshnet.engine.llama_backend import LlamaBackend
from meshnet.engine.llama_config import LlamaConfig
from meshnet.engine.llama_ffi import EvalCallback, ggml_get_name
from meshnet.moe.cache_policy import CacheCounters
from meshnet.moe.memory import ForeignExpertRelease
from meshnet.moe.ownership import ExpertOwnership, SlotRows, local_rows, place_rows
from meshnet.moe.shape import read_moe_shape
from meshnet.moe.stream_cache import ExpertStreamCache

log = logging.getLogger(__name__)

GGML_MAX_DIMS = 4
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26


class GgmlTensorHead(ctypes.Structure):
    """The leading fields of ``struct ggml_tensor`` (ggml.h of the pinned build), up to ``name``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def tensor_view(address: int, dtype: type[np.generic], expected_type: int) -> np.ndarray:
    """A NumPy view (outermost dimension first) on a computed CPU tensor's own memory."""
    head = GgmlTensorHead.from_address(address)
    if head.name != ggml_get_name(address):
        raise EngineError("struct ggml_tensor layout differs from this build's: cannot run expert parallel")
    if head.type != expected_type or not head.data:
        raise EngineError(f"{head.name.decode()}: unexpected tensor type {head.type} for expert exchange")
    dims = [int(head.ne[i]) for i in range(GGML_MAX_DIMS)]
    n_dims = max([i + 1 for i in range(GGML_MAX_DIMS) if dims[i] != 1] + [1])
    shape = tuple(reversed(dims[:n_dims]))
    strides = tuple(reversed([int(head.nb[i]) for i in range(n_dims)]))
    if 0 in shape:  # the last layer of a graph with no output rows has an empty MoE input
        return np.zeros(shape, dtype)
    span = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + np.dtype(dtype).itemsize
    buffer = (ctypes.c_char * span).from_address(head.data)
    return np.ndarray(shape, dtype, buffer=memoryview(buffer), strides=strides)


class RowExchange(Protocol):
    """Swaps one node's slot rows of one MoE layer for every other node's (blocking)."""

    def exchange(self, rows: SlotRows) -> list[SlotRows]: ...

    def abort(self, reason: MeshnetError) -> None:
        """Wake every peer waiting on this group with ``reason`` (this node has failed)."""
        ...


@dataclass
class RoutingRecord:
    """The router's true top-k per MoE layer, in graph order, for comparing nodes with the whole model."""

    selected: list[tuple[int, np.ndarray]] = field(default_factory=list)
    """(layer, int32 [n_tokens, k]) for every MoE layer of every graph run since the last clear."""

    def clear(self) -> None:
        self.selected.clear()


class _MoeLayerHook:
    """The per-layer callback steps; state lives here so the backend stays a thin subclass."""

    def __init__(
        self,
        ownership: ExpertOwnership,
        n_expert: int,
        n_expert_used: int,
        exchange: RowExchange | None,
        release_foreign: bool,
        n_layers: int,
        cache: ExpertStreamCache | None = None,
    ) -> None:
        if ownership.count > 1 and exchange is None:
            raise EngineError("an expert share of a group of more than one node needs a row exchange")
        self.ownership = ownership
        self.dummies = ownership.dummy_experts(n_expert, n_expert_used) if ownership.count > 1 else None
        self.exchange = exchange
        self.failure: MeshnetError | None = None
        self.record: RoutingRecord | None = None
        self.sequence = 0
        self._topk: dict[int, tuple[int, np.ndarray]] = {}
        self.cache = cache
        self.release: ForeignExpertRelease | None = None
        if self.dummies is not None and release_foreign:
            self.release = ForeignExpertRelease(ownership, self.dummies, n_expert, 3 * n_layers)

    def on_expert_matmul(self, address: int) -> None:
        """After a ``mul_mat_id`` ran: release the foreign experts of its weights (first time only)."""
        weights = GgmlTensorHead.from_address(GgmlTensorHead.from_address(address).src[0])
        name = weights.name.decode(errors="replace")
        if self.cache is not None:
            self.cache.check_tensor(name, weights.data or 0)
        if self.release is None:
            return
        self.release.release(ctypes.addressof(weights), name, weights.data or 0, int(weights.nb[2]), int(weights.ne[2]))

    def on_topk(self, layer: int, address: int) -> None:
        view = tensor_view(address, np.int32, GGML_TYPE_I32)  # [n_tokens, k] (a strided view)
        selected = np.array(view.reshape(-1, view.shape[-1]), np.int32)
        self._topk[layer] = (address, selected)
        if self.record is not None:
            self.record.selected.append((layer, selected))

    def on_weights_norm(self, layer: int) -> None:
        address, selected = self._require(layer)
        read = selected
        if self.ownership.count > 1:
            view = tensor_view(address, np.int32, GGML_TYPE_I32).reshape(selected.shape)
            read = self.ownership.steer(selected, self.dummies)  # type: ignore[arg-type]
            view[...] = read
        if self.cache is not None:  # the ids mul_mat_id is about to read: bring them in first
            self.cache.on_layer(layer, read)

    def on_weighted(self, layer: int, address: int) -> None:
        if self.ownership.count == 1:
            self._topk.pop(layer, None)
            return
        _, selected = self._require(layer)
        weighted = tensor_view(address, np.float32, GGML_TYPE_F32)
        weighted = weighted.reshape(selected.shape[0], selected.shape[1], weighted.shape[-1])
        mine = local_rows(self.sequence, layer, self.ownership, selected, weighted)
        self.sequence += 1
        received = self.exchange.exchange(mine)  # type: ignore[union-attr]
        place_rows(self.ownership, selected, received, weighted)
        del self._topk[layer]

    @property
    def watches_matmuls(self) -> bool:
        """Expert multiplications still to see: for the first release, or the cache's check."""
        return (self.release is not None and not self.release.complete) or (
            self.cache is not None and not self.cache.checked
        )

    def _require(self, layer: int) -> tuple[int, np.ndarray]:
        if layer not in self._topk:
            raise EngineError(f"layer {layer}: ffn_moe_topk was not seen before the expert slots: graph changed")
        return self._topk[layer]


_WATCHED = {b"ffn_moe_topk": "topk", b"ffn_moe_weights_norm": "norm", b"ffn_moe_weighted": "weighted"}
_EXPERT_MATMULS = {b"ffn_moe_gate": "matmul", b"ffn_moe_up": "matmul", b"ffn_moe_down": "matmul"}


class ExpertParallelBackend(LlamaBackend):
    """A whole-model backend that computes only its share of the routed experts.

    With ownership ``0/1`` and no exchange it is the whole model plus a router observer."""

    def __init__(
        self,
        model_path: Path,
        config: LlamaConfig,
        ownership: ExpertOwnership,
        exchange: RowExchange | None = None,
        *,
        release_foreign: bool = True,
        expert_cache_bytes: int | None = None,
    ) -> None:
        """``expert_cache_bytes``: bound this node's resident routed experts (``moe/stream_cache.py``)."""
        self.moe = read_moe_shape(model_path)
        cache = None if expert_cache_bytes is None else ExpertStreamCache(model_path, self.moe, expert_cache_bytes)
        self._hook = _MoeLayerHook(
            ownership, self.moe.n_expert, self.moe.n_expert_used, exchange, release_foreign, self.moe.n_layers, cache
        )
        super().__init__(model_path, config)
        if cache is not None:
            cache.attach()
        if self.shape.role != "full":
            raise EngineError("an expert-parallel node runs the whole model: give it a full slice")
        if self._hook.release is not None:
            spans = [(span.tensor, span.expert, span.offset, span.nbytes) for span in self.moe.spans]
            self._hook.release.add_file_spans(Path(model_path), spans)

    @property
    def ownership(self) -> ExpertOwnership:
        return self._hook.ownership

    @property
    def released_expert_bytes(self) -> int:
        """Bytes of foreign routed experts given back to the OS (0 for a whole model)."""
        return 0 if self._hook.release is None else self._hook.release.released_bytes

    @property
    def expert_cache(self) -> CacheCounters | None:
        """The expert cache's hits, misses and bytes read (none without ``expert_cache_bytes``)."""
        return None if self._hook.cache is None else self._hook.cache.counters

    @property
    def expert_cache_capacity(self) -> int:
        return 0 if self._hook.cache is None else self._hook.cache.lru.capacity_bytes

    def close(self) -> None:
        super().close()
        if self._hook.cache is not None:
            self._hook.cache.close()

    def record_routing(self, record: RoutingRecord | None) -> None:
        self._hook.record = record

    def _install_capture(self, params: llama_cpp.llama_context_params) -> None:
        # Replaces the boundary capture: a full model has no boundary, only MoE layers to steer.
        self._capture_state = None
        self._callback = EvalCallback(self._on_moe_eval)
        params.cb_eval = self._callback
        params.cb_eval_user_data = ctypes.c_void_p()

    def _on_moe_eval(self, tensor: int, ask: bool, _user: int) -> bool:
        hook = self._hook
        if hook.failure is not None:
            return bool(ask)  # observe the next node and abort there: the graph stops at once
        name = ggml_get_name(tensor)
        if not name.startswith(b"ffn_moe_"):
            return not ask
        kind, _, layer_text = name.rpartition(b"-")
        # Views and reshapes carry suffixed names ("ffn_moe_weights_norm-0 (reshaped)"): skip them.
        step = _WATCHED.get(kind) if layer_text.isdigit() else None
        if step is None and hook.watches_matmuls and layer_text.isdigit():
            step = _EXPERT_MATMULS.get(kind)
        if ask:
            return step is not None
        try:
            layer = int(layer_text)
            if step == "topk":
                hook.on_topk(layer, tensor)
            elif step == "norm":
                hook.on_weights_norm(layer)
            elif step == "weighted":
                hook.on_weighted(layer, tensor)
            elif step == "matmul":
                hook.on_expert_matmul(tensor)
            return True
        except MeshnetError as error:
            return self._fail(error)
        except Exception as error:  # nothing may escape into C; the run reports it
            return self._fail(EngineError(f"expert exchange failed: {error!r}"))

    def _fail(self, error: MeshnetError) -> bool:
        self._hook.failure = error
        if self._hook.exchange is not None:
            self._hook.exchange.abort(error)
        return False

    def run(self, batch: list[StepInput]) -> list[StepOutput]:
        """As ``LlamaBackend.run``; a failed exchange rolls this batch out of the KV and raises."""
        if self._hook.failure is not None:
            raise self._hook.failure
        before = {step.slot: self.slot_length(step.slot) for step in batch}
        outputs = super().run(batch)
        if self._hook.release is not None:
            self._hook.release.release_again()
        if self._hook.cache is not None:
            self._hook.cache.settle()
        failure = self._hook.failure
        if failure is not None:
            for slot, length in before.items():
                self.truncate(slot, length)
            raise failure
        return outputs


def observe_router(backend: ExpertParallelBackend, action: Callable[[], object]) -> list[tuple[int, np.ndarray]]:
    """Run ``action`` while recording ``backend``'s router choices; returns them in graph order."""
    record = RoutingRecord()
    backend.record_routing(record)
    try:
        action()
    finally:
        backend.record_routing(None)
    return record.selected
